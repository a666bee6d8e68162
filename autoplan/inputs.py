"""One validation layer for everything a user hands autoplan: files, parsed data, typed requests.

Every entry point (CLI flags and ``--request``, the Python API, batch lines, model files, cluster profiles,
plan files, ``calibrate`` runs files) goes through these functions, so every one refuses the same things with
one line naming the value and the limit (:class:`~autoplan.errors.UserInputError`):

- files: only regular files (never a FIFO or device, which could block or be endless), at most
  ``MAX_FILE_BYTES``, UTF-8 (a UTF-16 or binary file is named as such);
- JSON: no ``NaN``/``Infinity``, no number that overflows to infinity (``1e400``), no integer of more than
  ``MAX_INT_DIGITS`` digits; YAML: ``safe_load`` tags only, at most ``MAX_YAML_ALIASES`` alias uses (an
  alias bomb expands exponentially); in both, no key twice in one object (the parsers keep the last);
- parsed data (:func:`check_tree`): at most ``MAX_DEPTH`` levels and ``MAX_NODES`` values, finite floats,
  integers within ±2**53, strings that are valid Unicode (no lone surrogate escapes);
- typed models (:func:`strict`): pydantic strict mode, so ``true`` is not 1, ``8.9`` is not 8 and
  ``"false"`` is not true; ``8.0`` is 8 (JSON Schema's integer, which ``autoplan schema`` declares).

Other commands (and other engineers' new ones) call :func:`read_data` / :func:`strict` rather than reading
files themselves.
"""

from __future__ import annotations

import difflib
import json
import math
import os
import stat
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TypeVar, get_args

import yaml
from pydantic import BaseModel, ValidationError

from autoplan.errors import UserInputError

MAX_FILE_BYTES = 16 << 20  # a model config or request is a few kB; a calibrate runs file a few hundred
MAX_DEPTH = 32
MAX_NODES = 200_000
MAX_YAML_ALIASES = 256
MAX_INT_DIGITS = 30
MAX_ABS_INT = 1 << 53  # no count autoplan handles comes near; beyond it floats lose integers
MAX_NAME_CHARS = 1024
# One path component's bytes where the file system stops (NAME_MAX on Linux and macOS): a longer name makes every
# stat() of it fail with ENAMETOOLONG, which Path.is_dir() / is_file() do not swallow.
MAX_COMPONENT_BYTES = 255
MAX_NUM_LAYERS = 4096  # a resolved model's decoder layers (names, files, inline specs): per-layer work is linear
MAX_NUM_EXPERTS = 4096

M = TypeVar("M", bound=BaseModel)


def _short(value: Any, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


# ==== files =========================================================================================
def user_path(text: str | Path) -> Path:
    """``text`` as a path, ``~`` expanded; an unknown ``~user``, an absurdly long name or a value that is no path
    (``None``, a number) is a user error."""
    if not isinstance(text, (str, os.PathLike)):
        raise UserInputError(f"a path must be a string, not {type(text).__name__}")
    raw = str(text)
    if not raw.strip():
        raise UserInputError("empty path")
    if len(raw) > MAX_NAME_CHARS:
        raise UserInputError(f"path {_short(raw)} is longer than {MAX_NAME_CHARS} characters")
    if "\x00" in raw:
        raise UserInputError(f"path {_short(raw)} contains a NUL character")
    path = Path(raw)
    for part in path.parts:
        try:
            size = len(os.fsencode(part))
        except UnicodeEncodeError:
            raise UserInputError(f"path {_short(raw)} is not encodable as a file name") from None
        if size > MAX_COMPONENT_BYTES:
            raise UserInputError(f"path {_short(raw)}: the name {_short(part)} is longer than "
                                 f"{MAX_COMPONENT_BYTES} bytes")
    try:
        return path.expanduser()
    except RuntimeError:  # "Could not determine home directory" for ~nobody-here
        raise UserInputError(f"cannot expand '{raw}': no such user") from None


def _named(what: str, path: str | Path) -> str:
    return f"'{path}'" if what == "file" else f"{what} '{path}'"


def read_bytes(path: str | Path, *, max_bytes: int = MAX_FILE_BYTES, what: str = "file") -> bytes:
    """The bytes of a regular file of at most ``max_bytes``."""
    p = user_path(path)
    try:
        st = os.stat(p)
    except OSError as err:
        raise UserInputError(f"cannot read {_named(what, path)}: {err.strerror or err}") from None
    if stat.S_ISDIR(st.st_mode):
        raise UserInputError(f"{_named(what, path)} is a directory, not a file")
    if not stat.S_ISREG(st.st_mode):
        raise UserInputError(f"{_named(what, path)} is not a regular file (a pipe or device); give a file")
    if st.st_size > max_bytes:
        raise UserInputError(f"{_named(what, path)} is {st.st_size} bytes; the limit is {max_bytes}")
    try:
        with open(p, "rb") as f:
            data = f.read(max_bytes + 1)
    except OSError as err:
        raise UserInputError(f"cannot read {_named(what, path)}: {err.strerror or err}") from None
    if len(data) > max_bytes:
        raise UserInputError(f"{_named(what, path)} is larger than {max_bytes} bytes")
    return data


def decode_text(data: bytes, where: str) -> str:
    """UTF-8 text (a UTF-8 byte-order mark is dropped); UTF-16/32 and binary data are refused by name."""
    if data.startswith((b"\xff\xfe", b"\xfe\xff")) or (len(data) >= 2 and (data[0] == 0) != (data[1] == 0)):
        raise UserInputError(f"{where} looks like UTF-16 text; save it as UTF-8")
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as err:
        raise UserInputError(f"{where} is not UTF-8 text (bad byte at offset {err.start}); is it a binary file?"
                             ) from None


def read_text(path: str | Path, *, max_bytes: int = MAX_FILE_BYTES, what: str = "file") -> str:
    return decode_text(read_bytes(path, max_bytes=max_bytes, what=what), _named(what, path))


# ==== parsing =======================================================================================
def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a number (JSON allows finite numbers only)")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"number {text[:40]} is out of range")
    return value


def _bounded_int(text: str) -> int:
    if len(text.lstrip("-")) > MAX_INT_DIGITS:
        raise ValueError(f"integer {text[:20]}... has more than {MAX_INT_DIGITS} digits")
    return int(text)


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A JSON object whose keys are unique: ``{"tp": 8, "tp": 4}`` would silently keep the last value."""
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise ValueError(f"key {_short(key, 40)} appears twice in one object (which one is meant?)")
        out[key] = value
    return out


def parse_json(text: str, where: str = "input", *, one_line: bool = False) -> Any:
    """Strict JSON: finite numbers, bounded integers, bounded depth, unique keys; errors name ``where`` (and the
    character position only, for ``one_line`` text such as a batch line)."""
    try:
        data = json.loads(text, parse_constant=_no_constant, parse_float=_finite_float, parse_int=_bounded_int,
                          object_pairs_hook=_unique_keys)
    except json.JSONDecodeError as err:
        at = f"character {err.pos + 1}" if one_line else f"line {err.lineno}, column {err.colno}"
        raise UserInputError(f"invalid JSON in {where}: {err.msg} ({at})") from None
    except ValueError as err:
        raise UserInputError(f"invalid JSON in {where}: {err}") from None
    except RecursionError:
        raise UserInputError(f"invalid JSON in {where}: nested deeper than {MAX_DEPTH} levels") from None
    check_tree(data, where)
    return data


class _BoundedLoader(yaml.SafeLoader):
    """``SafeLoader`` that refuses documents using more than ``MAX_YAML_ALIASES`` aliases."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._aliases = 0
        self._unique_checked: set[int] = set()  # mappings whose own keys were checked (flatten_mapping)

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            self._aliases += 1
            if self._aliases > MAX_YAML_ALIASES:
                raise yaml.YAMLError(f"more than {MAX_YAML_ALIASES} aliases (a YAML alias bomb?)")
        return super().compose_node(parent, index)

    def flatten_mapping(self, node: Any) -> None:
        """Refuse a key given twice in one mapping (YAML 1.2 §3.2.1.1: keys are unique; PyYAML keeps the last). Checked
        on each mapping's own keys the first time PyYAML flattens it, before its merge keys (``<<``) copy other
        mappings' keys into it in place (``SafeConstructor.flatten_mapping``): a merged mapping's overrides are not
        duplicates, whichever mapping is built first."""
        if id(node) not in self._unique_checked:
            self._unique_checked.add(id(node))
            seen: set[Any] = set()
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":
                    continue
                key = self.construct_object(key_node, deep=True)
                try:
                    duplicate = key in seen
                except TypeError:  # an unhashable key: PyYAML's own error names it
                    continue
                if duplicate:
                    raise yaml.constructor.ConstructorError(
                        None, None, f"key {_short(key, 40)} appears twice in one mapping (which one is meant?)",
                        key_node.start_mark)
                seen.add(key)
        super().flatten_mapping(node)


def parse_yaml(text: str, where: str = "input") -> Any:
    try:
        data = yaml.load(text, Loader=_BoundedLoader)  # noqa: S506 — a SafeLoader subclass
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        line = f" (line {mark.line + 1})" if mark is not None else ""
        problem = getattr(err, "problem", None) or (str(err).splitlines() or ["unreadable"])[0]
        raise UserInputError(f"invalid YAML in {where}: {problem}{line}") from None
    except (RecursionError, ValueError, OverflowError) as err:
        why = f"nested deeper than {MAX_DEPTH} levels" if isinstance(err, RecursionError) else str(err)[:100]
        raise UserInputError(f"invalid YAML in {where}: {why}") from None
    check_tree(data, where)
    return data


def read_data(path: str | Path, *, what: str = "file", max_bytes: int = MAX_FILE_BYTES) -> Any:
    """A JSON (``.json``) or YAML (anything else) file, parsed and checked (:func:`check_tree`)."""
    where = _named(what, path)
    text = read_text(path, max_bytes=max_bytes, what=what)
    return parse_json(text, where) if str(path).lower().endswith(".json") else parse_yaml(text, where)


def read_mapping(path: str | Path, *, what: str = "file") -> dict[str, Any]:
    data = read_data(path, what=what)
    if not isinstance(data, dict):
        raise UserInputError(f"{_named(what, path)} must contain a mapping of fields, got {json_type(data)}")
    return data


def json_type(value: Any) -> str:
    """The JSON name of a parsed value's type (``null``, not ``NoneType``; ``array``, not ``list``)."""
    names = {type(None): "null", bool: "boolean", int: "number", float: "number", str: "string", list: "array",
             dict: "object"}
    return names.get(type(value), type(value).__name__)


# ==== parsed data ===================================================================================
def check_tree(data: Any, where: str = "input") -> None:
    """Refuse what no typed field should ever see: deep nesting, huge documents, non-finite floats,
    integers beyond ±2**53, non-string keys, strings that are not valid Unicode."""
    budget = [MAX_NODES]

    def walk(value: Any, depth: int, at: str) -> None:
        budget[0] -= 1
        if budget[0] < 0:
            raise UserInputError(f"{where} has more than {MAX_NODES} values")
        if depth > MAX_DEPTH:
            raise UserInputError(f"{where} is nested deeper than {MAX_DEPTH} levels (at {at or 'top'})")
        if isinstance(value, bool) or value is None:
            return
        if isinstance(value, float):
            if not math.isfinite(value):
                raise UserInputError(f"{at or where}: {value} is not a finite number")
        elif isinstance(value, int):
            if abs(value) > MAX_ABS_INT:
                raise UserInputError(f"{at or where}: {_short(value, 24)} is out of range (|n| ≤ 2**53)")
        elif isinstance(value, str):
            check_text(value, at or where)
        elif isinstance(value, Mapping):
            for k, v in value.items():
                if not isinstance(k, str):
                    raise UserInputError(f"{where}: key {_short(k)} is not a string")
                check_text(k, f"{where}: a key")
                walk(v, depth + 1, f"{at}.{k}" if at else k)
        elif isinstance(value, (list, tuple)):
            for i, v in enumerate(value):
                walk(v, depth + 1, f"{at}[{i}]")

    walk(data, 0, "")


def check_text(text: str, where: str) -> None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise UserInputError(f"{where}: text contains a lone surrogate escape (not valid Unicode)") from None


# ==== typed models ==================================================================================
def _model_at(model: type[BaseModel] | None, path: tuple[Any, ...]) -> type[BaseModel] | None:
    """The pydantic model a validation error's location (less its last part) points into, through optional,
    list and mapping fields; None where the path leaves models."""
    for part in path:
        if model is None:
            return None
        if isinstance(part, int):
            continue  # a list element: the list field's item model was taken already
        field = model.model_fields.get(str(part))
        model = _model_in(field.annotation) if field is not None else None
    return model


def _model_in(annotation: Any) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    return next((m for a in get_args(annotation) if (m := _model_in(a)) is not None), None)


def _unknown_field(model: type[BaseModel] | None, loc: tuple[Any, ...]) -> str:
    """``unknown field``, with the nearest field names of the model it was given to (a typo's fix)."""
    where = _model_at(model, loc[:-1])
    names, key = (list(where.model_fields) if where else []), str(loc[-1]) if loc else ""
    close = difflib.get_close_matches(key, names, n=2) or [n for n in names if key and n.startswith(key)][:2]
    return "unknown field" + (f" (did you mean {' or '.join(close)}?)" if close else "")


def describe_validation_error(err: ValidationError, model: type[BaseModel] | None = None) -> str:
    """Compact one-line form of a pydantic error, e.g.
    ``num_layers: Input should be greater than 0 (got -1); foo: unknown field``; with ``model`` (the class
    validated) an unknown field names the nearest known ones."""
    parts = []
    for e in err.errors():
        loc = ".".join(str(p) for p in e["loc"])
        if e["type"] == "extra_forbidden":
            msg = _unknown_field(model, tuple(e["loc"]))
        elif e["type"] == "missing":
            msg = "required field missing"
        else:
            if e["type"] in ("model_type", "model_attributes_type", "dict_type"):
                # not "a valid dictionary or instance of ClusterRequestBounded": the class is ours, not the user's
                msg = "must be an object (a mapping of fields)" + (", not a list" if isinstance(e.get("input"), list)
                                                                    else "")
            else:
                msg = e["msg"].removeprefix("Value error, ")
            if loc and not isinstance(e.get("input"), (dict, list)):
                msg = f"{msg} (got {_short(e.get('input'))})"
        parts.append(f"{loc}: {msg}" if loc else msg)
        if len(parts) == 5 and len(err.errors()) > 5:
            parts.append(f"and {len(err.errors()) - 5} more")
            break
    return " ".join("; ".join(parts).split())


def integral_floats_as_ints(data: Any) -> Any:
    """``data`` with every float that has a zero fractional part (``33147.0``) as an int, as JSON Schema
    reads numbers (Core 2020-12 §4.2.1: "integer" matches any number with a zero fractional part) and as
    ``autoplan schema`` declares integer fields. ``8.9`` and ``true`` stay what they are (and are refused
    where an integer is meant); beyond ±2**53 a float does not hold an exact integer and stays a float."""
    if isinstance(data, float):
        return int(data) if data.is_integer() and abs(data) <= MAX_ABS_INT else data
    if isinstance(data, dict):
        return {k: integral_floats_as_ints(v) for k, v in data.items()}
    if isinstance(data, list):
        return [integral_floats_as_ints(v) for v in data]
    return data


def strict(model: type[M], data: Any, what: str | None = None) -> M:
    """``model`` validated from ``data`` in pydantic strict mode (no coercion of bools, floats or strings
    into integers), after :func:`check_tree`; errors become one :class:`UserInputError` line."""
    if isinstance(data, model):
        return data
    check_tree(data, what or model.__name__)
    try:
        return model.model_validate(integral_floats_as_ints(data), strict=True)
    except ValidationError as err:
        prefix = f"invalid {what}: " if what else ""
        raise UserInputError(prefix + describe_validation_error(err, model)) from None
    except TypeError as err:  # a "before" validator met a value of the wrong type (e.g. vp: "2")
        prefix = f"invalid {what}: " if what else ""
        raise UserInputError(f"{prefix}a field has the wrong type ({err})") from None
