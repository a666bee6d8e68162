"""``load_model``: one entry point for every way a user names a model.

Resolution order for a string: catalog name or alias (case-insensitive) → existing file or folder
(a folder means its ``config.json``) → error. A ``.json`` file or a dict is a Hugging Face config when
it carries HF keys (``model_type``, ``architectures``, ``num_hidden_layers``, ...), otherwise autoplan's
own spec; ``.yaml``/``.yml`` files are always autoplan specs. Files are parsed once per
(path, modification time).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from functools import lru_cache
from pathlib import Path
from typing import Any

from autoplan.catalog.hf import looks_like_hf_config, spec_from_hf_config
from autoplan.catalog.registry import catalog_model, model_catalog, model_names, unknown_name_error
from autoplan.catalog.spec_file import YAML_SUFFIXES, load_spec_file, read_mapping, spec_from_mapping
from autoplan.errors import UserInputError
from autoplan.inputs import MAX_NUM_EXPERTS, MAX_NUM_LAYERS, read_bytes, user_path
from cost_models.specs import ModelSpec

_PATH_SUFFIXES = (".json", *YAML_SUFFIXES)


def load_model(source: str | Path | Mapping[str, Any]) -> ModelSpec:
    """A ModelSpec from a catalog name/alias, a path (HF ``config.json``, a folder holding one, or an
    autoplan YAML/JSON spec), or a mapping (spec fields, or a parsed HF config)."""
    if isinstance(source, Mapping):
        if looks_like_hf_config(source):
            hf_precheck(source, "Hugging Face config")
            return bounded(spec_from_hf_config(source))
        return bounded(spec_from_mapping(source, default_name="custom", what="model spec"))
    if not isinstance(source, (str, Path)):
        raise UserInputError(f"model must be a name, a path or a mapping, got {type(source).__name__}")
    if isinstance(source, str):
        if not source.strip():
            err = UserInputError("model must not be empty; catalog names: "
                                 + ", ".join(model_names()) + " (or a model file path, or an inline spec)")
            err.valid = model_names()
            raise err
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
    if _HUB_ID.match(text) and path.suffix.lower() not in _PATH_SUFFIXES:
        raise _hub_id_error(text)
    if path.suffix.lower() in _PATH_SUFFIXES or "/" in text or "\\" in text:
        raise UserInputError(f"model file '{text}' does not exist")
    raise unknown_name_error("model", text, model_catalog(), "autoplan models")


# "org/name" as the Hugging Face Hub names a repository (huggingface_hub validate_repo_id: letters, digits, - _ .)
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


def _hub_id_error(text: str) -> UserInputError:
    """``meta-llama/Meta-Llama-3-70B`` is a Hub repository, not a file here: say so, and name the catalog entries
    closest to its name."""
    close = model_catalog().suggestions(text.rsplit("/", 1)[1])
    err = UserInputError(f"model '{text}' is no file here and looks like a Hugging Face Hub id (autoplan does not "
                         "download): pass its config.json (or the folder holding it), or a catalog name"
                         + (f"; did you mean: {', '.join(close)}?" if close else "") + " (see 'autoplan models')")
    err.valid = close or model_names()
    return err


@lru_cache(maxsize=64)
def _load_file(resolved: str, mtime_ns: int, shown: str) -> ModelSpec:
    """Parse the model file ``shown`` (as the user wrote it, for messages); ``resolved`` and
    ``mtime_ns`` key the cache so an edited file is re-read."""
    del resolved, mtime_ns
    path = Path(shown)
    data = read_mapping(path)
    if path.suffix.lower() not in YAML_SUFFIXES and looks_like_hf_config(data):
        hf_precheck(data, f"config '{path}'")
        return bounded(spec_from_hf_config(data, path=path))
    return bounded(load_spec_file(path, data))


# HF keys read as booleans / as MoE expert counts, per family (the transformers configuration classes).
_HF_BOOL_KEYS = ("tie_word_embeddings", "attention_bias", "mlp_bias", "use_qk_norm", "norm_topk_prob")
_HF_EXPERT_KEYS = {"mixtral": "num_local_experts", "qwen2_moe": "num_experts", "qwen3_moe": "num_experts",
                   "deepseek_v2": "n_routed_experts", "deepseek_v3": "n_routed_experts",
                   "glm4_moe": "n_routed_experts", "olmoe": "num_experts"}


def hf_precheck(data: Mapping[str, Any], source: str) -> None:
    """Refuse what the family translations would misread, before any work: non-boolean flags ("false" is
    truthy), layer/expert counts past the limits (the MoE-layout search is quadratic in layers), and a
    mixture-of-experts family with no experts (which would be planned as a dense model)."""
    for key in _HF_BOOL_KEYS:
        if data.get(key) is not None and not isinstance(data[key], bool):
            raise UserInputError(f"{source}: key '{key}' must be true or false, got {data[key]!r:.40}")
    for key, limit in (("num_hidden_layers", MAX_NUM_LAYERS), ("n_layer", MAX_NUM_LAYERS),
                       ("num_local_experts", MAX_NUM_EXPERTS), ("num_experts", MAX_NUM_EXPERTS),
                       ("n_routed_experts", MAX_NUM_EXPERTS)):
        value = data.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value > limit:
            raise UserInputError(f"{source}: {key} ({value}) is above the limit ({limit})")
    layers = data.get("mlp_only_layers")
    if isinstance(layers, list) and len(layers) > MAX_NUM_LAYERS:
        raise UserInputError(f"{source}: mlp_only_layers has {len(layers)} entries (limit {MAX_NUM_LAYERS})")
    key = _HF_EXPERT_KEYS.get(str(data.get("model_type")))
    if key is not None and data.get(key) is not None and data[key] == 0 and not isinstance(data[key], bool):
        raise UserInputError(f"{source}: {key} is 0, but model_type '{data['model_type']}' is a mixture of "
                             "experts; give the expert count (or use the dense family's model_type)")


def bounded(model: ModelSpec) -> ModelSpec:
    """Refuse models far beyond any real one (per-layer work is linear in layers and experts)."""
    for name, value, limit in (("num_layers", model.num_layers, MAX_NUM_LAYERS),
                               ("num_experts", model.num_experts, MAX_NUM_EXPERTS)):
        if value > limit:
            raise UserInputError(f"model {name} ({value}) is above the request limit ({limit})")
    return model
