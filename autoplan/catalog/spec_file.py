"""Reading YAML/JSON files and autoplan's own model spec file.

A spec file is a YAML or JSON mapping of :class:`~cost_models.specs.ModelSpec` fields; ``name`` is
optional and defaults to the file stem. Validation problems are reported as one line
(``field: problem``), never as a pydantic traceback.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel

from autoplan.inputs import describe_validation_error, strict
from autoplan.inputs import read_mapping as _read_mapping
from cost_models.specs import ModelSpec

YAML_SUFFIXES = (".yaml", ".yml")
__all__ = ["describe_validation_error", "load_spec_file", "read_mapping", "spec_from_mapping", "validate"]
M = TypeVar("M", bound=BaseModel)


def validate(model: type[M], data: Mapping[str, Any], what: str) -> M:
    """``model`` from ``data`` in strict mode (:func:`autoplan.inputs.strict`); errors name ``what``."""
    return strict(model, dict(data), what)


def read_mapping(path: Path) -> dict[str, Any]:
    """Parse a ``.json`` (JSON) or any other (YAML, bounded ``safe_load``) file that must hold a mapping,
    under the limits of :mod:`autoplan.inputs`."""
    return _read_mapping(path)


def spec_from_mapping(data: Mapping[str, Any], *, default_name: str, what: str) -> ModelSpec:
    """Build a ModelSpec from spec fields; ``name`` defaults to ``default_name``."""
    fields = dict(data)
    fields.setdefault("name", default_name)
    return validate(ModelSpec, fields, what)


def load_spec_file(path: Path, data: Mapping[str, Any] | None = None) -> ModelSpec:
    """Load autoplan's own spec file (``data`` = its already-parsed content, if at hand)."""
    if data is None:
        data = read_mapping(path)
    return spec_from_mapping(data, default_name=path.stem, what=f"model spec '{path}'")
