"""Reading YAML/JSON files and autoplan's own model spec file.

A spec file is a YAML or JSON mapping of :class:`~cost_models.specs.ModelSpec` fields; ``name`` is
optional and defaults to the file stem. Validation problems are reported as one line
(``field: problem``), never as a pydantic traceback.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from autoplan.errors import UserInputError
from cost_models.specs import ModelSpec

YAML_SUFFIXES = (".yaml", ".yml")
M = TypeVar("M", bound=BaseModel)


def describe_validation_error(err: ValidationError) -> str:
    """Compact one-line form of a pydantic error, e.g.
    ``num_layers: Input should be greater than 0 (got -1); foo: unknown field``."""
    parts = []
    for e in err.errors():
        loc = ".".join(str(p) for p in e["loc"])
        if e["type"] == "extra_forbidden":
            msg = "unknown field"
        elif e["type"] == "missing":
            msg = "required field missing"
        else:
            msg = e["msg"].removeprefix("Value error, ")
            if loc and not isinstance(e.get("input"), (dict, list)):
                got = repr(e.get("input"))
                msg = f"{msg} (got {got if len(got) <= 60 else got[:57] + '...'})"
        parts.append(f"{loc}: {msg}" if loc else msg)
    return "; ".join(parts)


def validate(model: type[M], data: Mapping[str, Any], what: str) -> M:
    """``model(**data)``, re-raising validation errors as :class:`UserInputError` naming ``what``."""
    try:
        return model.model_validate(dict(data))
    except ValidationError as err:
        raise UserInputError(f"invalid {what}: {describe_validation_error(err)}") from None


def read_mapping(path: Path) -> dict[str, Any]:
    """Parse a ``.json`` (JSON) or any other (YAML, ``safe_load``) file that must hold a mapping."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as err:
        raise UserInputError(f"cannot read '{path}': {err.strerror or err}") from None
    try:
        if path.suffix.lower() == ".json":
            data = json.loads(text)
        else:
            data = yaml.safe_load(text)
    except json.JSONDecodeError as err:
        raise UserInputError(f"invalid JSON in '{path}': {err.msg} (line {err.lineno}, column {err.colno})") from None
    except yaml.YAMLError as err:
        where = getattr(err, "problem_mark", None)
        line = f" (line {where.line + 1})" if where is not None else ""
        problem = getattr(err, "problem", None) or str(err).splitlines()[0]
        raise UserInputError(f"invalid YAML in '{path}': {problem}{line}") from None
    if not isinstance(data, dict):
        raise UserInputError(f"'{path}' must contain a mapping of fields, got {type(data).__name__}")
    return data


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
