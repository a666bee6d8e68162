"""``load_model``: one entry point for every way a user names a model.

Resolution order for a string: catalog name or alias (case-insensitive) → existing file or folder
(a folder means its ``config.json``) → error. A ``.json`` file or a dict is a Hugging Face config when
it carries HF keys (``model_type``, ``architectures``, ``num_hidden_layers``, ...), otherwise autoplan's
own spec; ``.yaml``/``.yml`` files are always autoplan specs. Files are parsed once per
(path, modification time).
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import lru_cache
from pathlib import Path
from typing import Any

from autoplan.catalog.hf import looks_like_hf_config, spec_from_hf_config
from autoplan.catalog.registry import catalog_model, model_catalog, unknown_name_error
from autoplan.catalog.spec_file import YAML_SUFFIXES, load_spec_file, read_mapping, spec_from_mapping
from autoplan.errors import UserInputError
from autoplan.inputs import read_bytes, user_path
from cost_models.specs import ModelSpec

_PATH_SUFFIXES = (".json", *YAML_SUFFIXES)


def load_model(source: str | Path | Mapping[str, Any]) -> ModelSpec:
    """A ModelSpec from a catalog name/alias, a path (HF ``config.json``, a folder holding one, or an
    autoplan YAML/JSON spec), or a mapping (spec fields, or a parsed HF config)."""
    if isinstance(source, Mapping):
        if looks_like_hf_config(source):
            return spec_from_hf_config(source)
        return spec_from_mapping(source, default_name="custom", what="model spec")
    if not isinstance(source, (str, Path)):
        raise UserInputError(f"model must be a name, a path or a mapping, got {type(source).__name__}")
    if isinstance(source, str):
        if not source.strip():
            raise UserInputError("model name is empty (see 'autoplan models')")
        spec = catalog_model(source)
        if spec is not None:
            return spec
    path = user_path(source)
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise UserInputError(f"model folder '{path}' has no config.json")
        path = path / "config.json"
    if path.is_file():
        resolved = path.resolve()
        return _load_file(str(resolved), resolved.stat().st_mtime_ns, str(path))
    if path.exists():
        read_bytes(path, what="model file")  # a pipe or device: refused by name
    text = str(source)
    if path.suffix.lower() in _PATH_SUFFIXES or "/" in text or "\\" in text:
        raise UserInputError(f"model file '{text}' does not exist")
    raise unknown_name_error("model", text, model_catalog(), "autoplan models")


@lru_cache(maxsize=64)
def _load_file(resolved: str, mtime_ns: int, shown: str) -> ModelSpec:
    """Parse the model file ``shown`` (as the user wrote it, for messages); ``resolved`` and
    ``mtime_ns`` key the cache so an edited file is re-read."""
    del resolved, mtime_ns
    path = Path(shown)
    data = read_mapping(path)
    if path.suffix.lower() not in YAML_SUFFIXES and looks_like_hf_config(data):
        return spec_from_hf_config(data, path=path)
    return load_spec_file(path, data)
