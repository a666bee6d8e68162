"""Reading a JSONL batch under limits, and turning one line of text into one output line.

Limits (``Limits``) guard a planning service against abuse: a line longer than ``max_line_bytes`` is
answered ``invalid`` without being parsed; more than ``max_lines`` requests or ``max_total_bytes`` of input
refuse the whole batch before anything runs (``UserInputError``, one clear line). Ids are unique: a line with
an earlier line's id is answered ``invalid`` (output lines are matched to requests by id). JSON only: no YAML, no
``NaN``/``Infinity``, nothing evaluated.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import IO, Any

from autoplan.api import Engine, peek_id, run_line
from autoplan.errors import UserInputError
from autoplan.inputs import parse_json as strict_json
from autoplan.schema import BatchLine, Status

MIB = 1 << 20


@dataclass(frozen=True)
class Limits:
    max_line_bytes: int = 64 * 1024
    max_lines: int = 100_000
    max_total_bytes: int = 64 * MIB


@dataclass(frozen=True)
class Line:
    """One non-blank input line: its 1-based number and text, or why it was refused unread."""

    number: int
    text: str | None
    refused: str | None = None
    id: str | None = None  # the id a refused line echoes (a line refused for reusing an id)


def read_lines(stream: IO[bytes], limits: Limits = Limits(), *, name: str = "input") -> list[Line]:
    """Every non-blank line of ``stream`` (blank lines are skipped but keep their numbers); a line reusing an
    earlier line's id is refused (:func:`refuse_reused_ids`)."""
    lines: list[Line] = []
    total = 0
    number = 0
    while True:
        raw = stream.readline(limits.max_line_bytes + 1)
        if not raw:
            break
        number += 1
        total += len(raw)
        if len(raw) > limits.max_line_bytes and not raw.endswith(b"\n"):
            total += _skip_rest_of_line(stream, limits.max_total_bytes - total + 1)
            refused = f"line is longer than {limits.max_line_bytes} bytes (the request size limit)"
            lines.append(Line(number, None, refused))
        elif raw.strip():
            try:
                lines.append(Line(number, raw.decode("utf-8")))
            except UnicodeDecodeError as err:
                lines.append(Line(number, None, f"line is not UTF-8 (byte {err.start})"))
        if total > limits.max_total_bytes:
            raise UserInputError(f"{name} is larger than {limits.max_total_bytes} bytes (--max-bytes); split it")
        if len(lines) > limits.max_lines:
            raise UserInputError(f"{name} has more than {limits.max_lines} requests (--max-lines); split it")
    return refuse_reused_ids(lines)


def refuse_reused_ids(lines: list[Line]) -> list[Line]:
    """``lines`` with each line whose id an earlier line has refused (answered ``invalid``, the id echoed): an output
    line is matched to its request by the id, so two requests under one id could not be told apart. The first
    line with the id is planned; lines without an id are not matched by one and may be many."""
    first: dict[str, int] = {}
    out: list[Line] = []
    for line in lines:
        rid = _whole_id(line.text) if line.refused is None else None
        if rid is not None and rid in first:
            line = Line(line.number, None, f"id {rid!r:.80} is already the id of line {first[rid]}; each request of "
                                           "a batch needs its own id", id=rid)
        elif rid is not None:
            first[rid] = line.number
        out.append(line)
    return out


def _skip_rest_of_line(stream: IO[bytes], budget: int) -> int:
    """Skip to the next newline, reading at most ``budget`` bytes (an endless line is over the size limit)."""
    skipped = 0
    while skipped < budget:
        chunk = stream.readline(MIB)
        skipped += len(chunk)
        if not chunk or chunk.endswith(b"\n"):
            return skipped
    return skipped


def parse_json(text: str) -> Any:
    """One request line: strict JSON (no NaN/Infinity/1e400, bounded depth, valid Unicode), as every
    other input (:func:`autoplan.inputs.parse_json`); raises ``UserInputError``."""
    return strict_json(text, "this line", one_line=True)


def line_id(text: str | None) -> str | None:
    """The id of a line, read leniently (so a line refused for its content still echoes its id)."""
    try:
        return peek_id(json.loads(text or ""))
    except (ValueError, RecursionError):
        return None


def _whole_id(text: str | None) -> str | None:
    """The id of a line as a request takes it (an id over the length limit, which ``line_id`` cuts, claims none)."""
    try:
        data = json.loads(text or "")
    except (ValueError, RecursionError):
        return None
    rid = peek_id(data)
    return rid if rid is not None and rid == data.get("id") else None


def answer(engine: Engine, line: Line) -> tuple[int, Status, str]:
    """The output line (compact JSON) for one input line; never raises (one bad line never stops a batch)."""
    if line.refused is not None:
        out = BatchLine(id=line.id, line=line.number, status="invalid", message=line.refused)
    else:
        try:
            data = parse_json(line.text or "")
        except UserInputError as err:
            out = BatchLine(id=line_id(line.text), line=line.number, status="invalid",
                            message=str(err).replace("invalid JSON in this line", "not valid JSON"))
        else:
            out = run_line(engine, data, line.number)
    try:
        return line.number, out.status, out.model_dump_json()
    except Exception as err:  # noqa: BLE001 — a result that cannot be serialized is this line's error
        bad = BatchLine(id=None, line=line.number, status="error",
                        message=f"internal error: the answer could not be written ({type(err).__name__})")
        return line.number, "error", bad.model_dump_json()


def iter_answers(engine: Engine, lines: list[Line]) -> Iterator[tuple[int, Status, str]]:
    for line in lines:
        yield answer(engine, line)
