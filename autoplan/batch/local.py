"""Local backend: the lines in order, answered in this process (1 worker) or by a process pool.

Each pool worker keeps one :class:`~autoplan.api.Engine` for its lifetime, so resolved specs and finished
responses are reused across the requests it is given. Lines travel in
chunks (fewer round trips) and come back in input order; at most ``4 × workers`` chunks are in flight.

A worker that dies (a crash in a native solver, the OOM killer) breaks the pool: the pool is restarted,
the lines that were in flight are re-run one at a time, and the one line that kills a worker on its own is
answered ``error`` — the batch goes on.
"""

from __future__ import annotations

import contextlib
import os
import socket
import threading
import time
from collections import deque
from collections.abc import Iterator, Sequence
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import Any

from autoplan.api import Engine
from autoplan.batch.reader import Line, answer, line_id
from autoplan.schema import BatchLine

Answer = tuple[int, str, str]  # (line number, status, output JSON)
ChunkResult = tuple[list[Answer], str, dict[str, Any]]  # answers, worker id, the worker's cache stats

_WORKER: list[Engine] = []  # the pool worker's engine (one per worker process, set by _start_worker)


def _start_worker(allow_files: bool) -> None:
    die_with_parent()
    _WORKER[:] = [Engine(allow_files=allow_files)]


def die_with_parent() -> None:
    """Make this pool worker exit when the batch process dies (even by SIGKILL): Linux's
    ``PR_SET_PDEATHSIG``, and elsewhere a daemon thread that notices the parent is gone."""
    parent = os.getppid()
    try:
        import ctypes
        import signal

        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(1, signal.SIGKILL, 0, 0, 0) == 0:  # PR_SET_PDEATHSIG = 1
            if os.getppid() != parent:  # the parent died before prctl took effect
                os._exit(1)
            return
    except (OSError, AttributeError):
        pass

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(1.0)
        os._exit(1)
    threading.Thread(target=watch, daemon=True).start()


def worker_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


def answer_chunk(engine: Engine, chunk: Sequence[Line]) -> ChunkResult:
    return [answer(engine, line) for line in chunk], worker_id(), engine.stats()


def _answer_chunk(chunk: Sequence[Line]) -> ChunkResult:
    return answer_chunk(_WORKER[0], chunk)


def crashed(line: Line, why: str) -> Answer:
    out = BatchLine(id=line_id(line.text), line=line.number, status="error", message=f"worker died on this line ({why})")
    return line.number, "error", out.model_dump_json()

def requeue_after_crash(chunk: list[Line], inflight: list[list[Line]], queue: deque[list[Line]], isolate: int,
                        why: str) -> tuple[list[Answer], int]:
    """A worker died on ``chunk``: re-run it and every chunk in flight one line at a time, so the line that
    kills its worker is named (answered ``error``) and every other line still gets its answer. Returns the
    answers to emit now and how many upcoming single-line chunks to run alone."""
    lost = [chunk, *inflight]
    now: list[Answer] = []
    if isolate and len(chunk) == 1:
        now.append(crashed(chunk[0], why))
        lost = lost[1:]
    singles = [[line] for c in lost for line in c]
    queue.extendleft(reversed(singles))
    return now, len(singles)



def terminate(pool: ProcessPoolExecutor) -> None:
    """Kill a pool's worker processes (a search in flight would otherwise run to its end)."""
    for proc in list(getattr(pool, "_processes", {}).values()):
        with contextlib.suppress(Exception):
            proc.kill()


def chunks_of(lines: Sequence[Line], size: int) -> list[list[Line]]:
    return [list(lines[i:i + size]) for i in range(0, len(lines), size)]


def default_chunk_size(num_lines: int, workers: int) -> int:
    """Small enough that every worker gets ≥ 32 chunks (load balance: a search costs 1000× an estimate),
    at most 8 lines (a chunk's round trip is ~0.3 ms, an estimate ~1 ms)."""
    return max(1, min(8, num_lines // (32 * workers)))


def window(workers: int) -> int:
    """Chunks in flight: enough that a slow chunk at the head of the line does not idle the other workers
    while its followers wait to be written in order (answers are a few kB, so this bounds memory too)."""
    return 64 * workers


class LocalBackend:
    def __init__(self, workers: int = 1, *, allow_files: bool = True, chunk_size: int | None = None) -> None:
        if workers < 1:
            raise ValueError(f"workers ({workers}) must be ≥ 1")
        self.workers = workers
        self.allow_files = allow_files
        self.chunk_size = chunk_size
        self.worker_stats: dict[str, dict[str, Any]] = {}
        self.restarts = 0

    def answers(self, lines: Sequence[Line]) -> Iterator[Answer]:
        if self.workers == 1:
            engine = Engine(allow_files=self.allow_files)
            for line in lines:
                yield answer(engine, line)
            self.worker_stats = {worker_id(): engine.stats()}
            return
        size = self.chunk_size or default_chunk_size(len(lines), self.workers)
        yield from self._pooled(deque(chunks_of(lines, size)))

    def _pool(self) -> ProcessPoolExecutor:
        return ProcessPoolExecutor(self.workers, initializer=_start_worker, initargs=(self.allow_files,))

    def _pooled(self, queue: deque[list[Line]]) -> Iterator[Answer]:
        limit = window(self.workers)
        inflight: deque[tuple[list[Line], Future[ChunkResult]]] = deque()
        isolate = 0  # > 0: run that many upcoming chunks alone, so a crash names its line
        pool = self._pool()
        done = False
        try:
            while queue or inflight:
                while queue and len(inflight) < (1 if isolate else limit):
                    chunk = queue.popleft()
                    inflight.append((chunk, pool.submit(_answer_chunk, chunk)))
                chunk, fut = inflight.popleft()
                try:
                    answers, wid, stats = fut.result()
                except BrokenProcessPool as err:
                    lost = [c for c, _ in inflight]
                    inflight.clear()
                    pool.shutdown(wait=True, cancel_futures=True)
                    self.restarts += 1
                    pool = self._pool()
                    now, isolate = requeue_after_crash(chunk, lost, queue, isolate, str(err) or "process pool broken")
                    yield from now
                    continue
                if isolate:
                    isolate -= 1
                self.worker_stats[wid] = stats
                yield from answers
            done = True
        finally:
            if not done:  # interrupted (Ctrl-C, SIGTERM, a failed write): stop the workers now
                terminate(pool)
            pool.shutdown(wait=done, cancel_futures=True)
