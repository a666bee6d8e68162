"""Batch planning: many search/estimate requests (JSONL), answered in order, failures isolated per line.

    from autoplan.batch import run_batch
    lines = run_batch([{"id": "a", "model": "llama3-8b", "cluster": {"num_gpus": 8}}], workers=2)

Every input line gets exactly one output line with its ``id``, ``line`` number and a ``status``:
``ok`` (``result`` holds the response), ``infeasible`` (no plan fits), ``invalid`` (malformed or breaks a
constraint) or ``error`` (a bug or a dead worker; the message says which). Results are a function of the
request alone — caches are exact — so they are the same for any worker count and backend.

Backends: ``local`` (this process for 1 worker, a process pool for more: :mod:`autoplan.batch.local`) and
``ray`` (actors on a Ray cluster: :mod:`autoplan.batch.ray_backend`).
"""

from __future__ import annotations

import io
import json
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import IO, Any, Literal

from autoplan.batch.local import Answer, LocalBackend
from autoplan.batch.reader import Limits, Line, line_id, parse_json, read_lines
from autoplan.errors import UserInputError
from autoplan.schema import MAX_ID_CHARS, BatchLine, BatchSummary

Backend = Literal["local", "ray"]
STATUSES = ("ok", "infeasible", "invalid", "error")


@dataclass
class BatchRun:
    """One batch in progress: iterate :meth:`answers` for the output lines (in input order), then read
    :meth:`summary`."""

    lines: Sequence[Line]
    workers: int = 1
    backend: Backend = "local"
    address: str | None = None
    allow_files: bool = True
    chunk_size: int | None = None
    on_answer: Callable[[int, str], None] | None = None
    counts: Counter[str] = field(default_factory=Counter, init=False)
    duplicates: int = field(default=0, init=False)
    wall_s: float = field(default=0.0, init=False)
    _backend: Any = field(default=None, init=False)

    def __post_init__(self) -> None:
        if self.backend not in ("local", "ray"):
            raise UserInputError(f"backend {self.backend!r:.40} is not one autoplan runs", valid=["local", "ray"])
        if self.address is not None and self.backend != "ray":  # it would be ignored: the batch runs here
            raise UserInputError(f"address {self.address!r:.80} is a Ray cluster's; it needs backend 'ray' "
                                 "(--backend ray), the local backend runs on this machine")

    def answers(self) -> Iterator[Answer]:
        if self.backend == "ray":
            from autoplan.batch.ray_backend import RayBackend
            self._backend = RayBackend(self.workers, address=self.address, allow_files=self.allow_files,
                                      chunk_size=self.chunk_size)
        elif self.backend == "local":
            self._backend = LocalBackend(self.workers, allow_files=self.allow_files, chunk_size=self.chunk_size)
        else:
            raise ValueError(f"backend must be 'local' or 'ray', got {self.backend!r}")
        t0 = time.perf_counter()
        try:
            for number, status, text in self._deduplicated():
                self.counts[status] += 1
                if self.on_answer is not None:
                    self.on_answer(number, status)
                yield number, status, text
        finally:
            self.wall_s = time.perf_counter() - t0

    def _deduplicated(self) -> Iterator[Answer]:
        """Answer each distinct request once: a line equal to an earlier one but for its ``id`` gets that
        line's answer under its own id and line number (so N workers never plan the same job N times)."""
        first: dict[str, int] = {}
        rep_of: dict[int, int] = {}  # duplicate line number -> first line number with the same request
        unique: list[Line] = []
        for line in self.lines:
            key = _request_key(line)
            if key is not None and key in first:
                rep_of[line.number] = first[key]
                continue
            if key is not None:
                first[key] = line.number
            unique.append(line)
        self.duplicates = len(rep_of)
        waiting = Counter(rep_of.values())
        kept: dict[int, BatchLine] = {}
        answers = self._backend.answers(unique)
        for line in self.lines:
            rep = rep_of.get(line.number)
            if rep is None:
                number, status, text = next(answers)
                if waiting[number]:
                    kept[number] = BatchLine.model_validate_json(text)
                yield number, status, text
                continue
            out = kept[rep].model_copy(update={"line": line.number, "id": line_id(line.text)})
            waiting[rep] -= 1
            if not waiting[rep]:
                del kept[rep]
            yield line.number, out.status, out.model_dump_json()
        for _ in answers:  # let the backend finish (collect worker stats, shut down)
            pass

    @property
    def restarts(self) -> int:
        """Worker pools / actors replaced after a worker died."""
        return self._backend.restarts if self._backend is not None else 0

    def cache_stats(self) -> dict[str, Any]:
        """Hits and misses per cache, summed over workers: ``duplicates`` (lines equal to an earlier line
        but for the id), ``responses`` (a worker's finished responses), ``resolved`` (specs) and ``scorers``
        (planner sub-results per job, reused by searches of the same job with other pins or targets);
        ``hit_rate``: the share of lines answered from a cache instead of planned."""
        totals: dict[str, Counter[str]] = {"duplicates": Counter(hits=self.duplicates,
                                                                 misses=len(self.lines) - self.duplicates)}
        stats = self._backend.worker_stats if self._backend is not None else {}
        for worker in stats.values():
            for cache, counters in worker.items():
                c = totals.setdefault(cache, Counter())
                for k in ("hits", "misses"):
                    c[k] += int(counters.get(k, 0))
        out: dict[str, Any] = {"workers": len(stats)}
        for cache, c in sorted(totals.items()):
            n = c["hits"] + c["misses"]
            out[cache] = {"hits": c["hits"], "misses": c["misses"], "hit_rate": c["hits"] / n if n else 0.0}
        answered = totals["duplicates"]["hits"] + totals.get("responses", Counter())["hits"]
        out["hit_rate"] = answered / len(self.lines) if self.lines else 0.0
        return out

    def summary(self) -> BatchSummary:
        total = sum(self.counts.values())
        wall = max(self.wall_s, 1e-9)
        return BatchSummary(total=total, counts={s: self.counts.get(s, 0) for s in STATUSES},
                            wall_s=self.wall_s, plans_per_s=self.counts.get("ok", 0) / wall,
                            lines_per_s=total / wall, cache=self.cache_stats())


def _request_key(line: Line) -> str | None:
    """The request without its id, canonical; None for lines that are not JSON objects."""
    if line.text is None:
        return None
    try:
        data = parse_json(line.text)
    except UserInputError:
        return None
    if not isinstance(data, dict):
        return None
    rid = data.pop("id", None)
    if rid is not None and not (isinstance(rid, str) and len(rid) <= MAX_ID_CHARS):
        return None  # a bad id makes the line invalid on its own
    return json.dumps(data, sort_keys=True, separators=(",", ":"))


def lines_from_requests(requests: Iterable[Mapping[str, Any] | str], limits: Limits = Limits()) -> list[Line]:
    """Batch lines from Python requests (mappings are dumped to JSON, strings taken as JSON lines)."""
    buf = io.BytesIO()
    for r in requests:
        text = r if isinstance(r, str) else json.dumps(dict(r))
        buf.write(text.replace("\n", " ").encode("utf-8") + b"\n")
    buf.seek(0)
    return read_lines(buf, limits, name="requests")


def run_batch(requests: Iterable[Mapping[str, Any] | str], *, workers: int = 1, backend: Backend = "local",
              address: str | None = None, allow_files: bool = True, limits: Limits = Limits()) -> list[BatchLine]:
    """Answer ``requests`` (mappings or JSON strings), one :class:`BatchLine` each, in order."""
    run = BatchRun(lines_from_requests(requests, limits), workers=workers, backend=backend, address=address,
                   allow_files=allow_files)
    return [BatchLine.model_validate_json(text) for _, _, text in run.answers()]


class Progress:
    """A one-line progress bar on a terminal (``\\r`` updates, at most 10 per second)."""

    def __init__(self, total: int, stream: IO[str] = sys.stderr, enabled: bool | None = None) -> None:
        self.total = total
        self.stream = stream
        self.enabled = stream.isatty() if enabled is None else enabled
        self.done = 0
        self.counts: Counter[str] = Counter()
        self.t0 = time.perf_counter()
        self._last = 0.0

    def __call__(self, number: int, status: str) -> None:
        del number
        self.done += 1
        self.counts[status] += 1
        now = time.perf_counter()
        if self.enabled and (now - self._last >= 0.1 or self.done == self.total):
            self._last = now
            self.stream.write("\r" + self.render(now))
            self.stream.flush()

    def render(self, now: float) -> str:
        width = 30
        frac = self.done / self.total if self.total else 1.0
        bar = "#" * int(frac * width) + "." * (width - int(frac * width))
        rate = self.done / max(now - self.t0, 1e-9)
        tally = " ".join(f"{s} {self.counts[s]}" for s in STATUSES if self.counts[s])
        return f"[{bar}] {self.done}/{self.total}  {tally}  {rate:.1f}/s "

    def close(self) -> None:
        if self.enabled and self.done:
            self.stream.write("\n")
            self.stream.flush()


def describe_summary(s: BatchSummary) -> str:
    counts = ", ".join(f"{k} {v}" for k, v in s.counts.items())
    cache = s.cache
    parts = [f"{s.total} requests in {s.wall_s:.2f} s: {counts}",
             f"{s.plans_per_s:.1f} plans/s ({s.lines_per_s:.1f} lines/s)"]
    if "responses" in cache:
        parts.append(f"cache hit rate {cache['hit_rate']:.1%} over {cache['workers']} worker(s)")
    return "; ".join(parts)


__all__ = ["BatchRun", "Limits", "Line", "Progress", "describe_summary", "lines_from_requests", "read_lines",
           "run_batch"]
