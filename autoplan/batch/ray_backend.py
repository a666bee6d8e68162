"""Ray backend: the same chunks as the local pool, answered by Ray actors anywhere on a Ray cluster.

Each actor holds one :class:`~autoplan.api.Engine` (its caches live as long as the actor). Chunks go to
the least busy actor (at most two unfinished each; ``window(workers)`` in flight in all) and come back in
input order, so the output is the local backend's, line for line. An actor that dies is replaced; every
line in flight is re-run one at a time, and a line that kills an actor on its own is answered ``error``.

Ray is optional (``pip install 'autoplan[ray]'``). ``address`` is passed to ``ray.init`` (``"auto"``,
``"ray://head:10001"``); without one, a Ray runtime already started in this process is used, else a local
one with ``workers`` CPUs is started and shut down afterwards. At most one actor per CPU of the cluster.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator, Sequence
from typing import Any

from autoplan.api import Engine
from autoplan.batch.local import (Answer, ChunkResult, answer_chunk, chunks_of, default_chunk_size,
                                  requeue_after_crash, window)
from autoplan.batch.reader import Line
from autoplan.errors import UserInputError


def _ray() -> Any:
    try:
        import ray
    except ImportError:
        raise UserInputError("--backend ray needs Ray: pip install 'autoplan[ray]'") from None
    return ray


class _Worker:
    """The actor body (wrapped with ``ray.remote`` at run time, so importing this module needs no Ray)."""

    def __init__(self, allow_files: bool) -> None:
        self.engine = Engine(allow_files=allow_files)

    def answer_chunk(self, chunk: Sequence[Line]) -> ChunkResult:
        return answer_chunk(self.engine, chunk)


class RayBackend:
    def __init__(self, workers: int = 2, *, address: str | None = None, allow_files: bool = True,
                 chunk_size: int | None = None) -> None:
        if workers < 1:
            raise ValueError(f"workers ({workers}) must be ≥ 1")
        self.workers = workers
        self.address = address
        self.allow_files = allow_files
        self.chunk_size = chunk_size
        self.worker_stats: dict[str, dict[str, Any]] = {}
        self.restarts = 0

    def answers(self, lines: Sequence[Line]) -> Iterator[Answer]:
        ray = _ray()
        started = False
        if not ray.is_initialized():
            kwargs: dict[str, Any] = {"include_dashboard": False, "log_to_driver": False,
                                      "configure_logging": False}
            if self.address is None:
                kwargs["num_cpus"] = self.workers
            ray.init(address=self.address, **kwargs)
            started = True
        try:
            size = self.chunk_size or default_chunk_size(len(lines), self.workers)
            yield from self._run(ray, deque(chunks_of(lines, size)))
        finally:
            if started:
                ray.shutdown()

    def _run(self, ray: Any, queue: deque[list[Line]]) -> Iterator[Answer]:
        actor_cls = ray.remote(num_cpus=1)(_Worker)
        # no more actors than the cluster has CPUs: an actor that cannot be placed would hold its chunks forever
        n = max(1, min(self.workers, int(ray.cluster_resources().get("CPU", self.workers))))
        actors = [actor_cls.remote(self.allow_files) for _ in range(n)]
        limit = window(n)
        inflight: deque[tuple[list[Line], int, Any]] = deque()
        isolate = 0
        try:
            while queue or inflight:
                unfinished: list[Any] = []
                while queue and len(inflight) < (1 if isolate else limit):
                    slot, unfinished = self._least_busy(ray, inflight, len(actors))
                    if slot is None:
                        break
                    chunk = queue.popleft()
                    inflight.append((chunk, slot, actors[slot].answer_chunk.remote(chunk)))
                    unfinished = []
                if unfinished and inflight[0][2] in unfinished:
                    # every actor is busy and the head is not done: wait for any actor, then feed it
                    ray.wait(unfinished, num_returns=1)
                    continue
                chunk, slot, ref = inflight.popleft()
                try:
                    answers, wid, stats = ray.get(ref)
                except ray.exceptions.RayActorError as err:
                    self.restarts += 1
                    actors[slot] = actor_cls.remote(self.allow_files)
                    lost = [c for c, _, _ in inflight]  # results of healthy actors are re-run too:
                    inflight.clear()                     # simple, and the order stays the input's
                    now, isolate = requeue_after_crash(chunk, lost, queue, isolate, type(err).__name__)
                    yield from now
                    continue
                if isolate:
                    isolate -= 1
                self.worker_stats[wid] = stats
                yield from answers
        finally:
            for a in actors:
                ray.kill(a)

    @staticmethod
    def _least_busy(ray: Any, inflight: deque[tuple[list[Line], int, Any]], n: int) -> tuple[int | None, list[Any]]:
        """The actor with the fewest unfinished chunks if it has fewer than 2 (one running, one queued),
        and the unfinished chunks' refs."""
        refs = [r for _, _, r in inflight]
        done = set(ray.wait(refs, num_returns=len(refs), timeout=0)[0]) if refs else set()
        busy = [0] * n
        unfinished = []
        for _, slot, ref in inflight:
            if ref not in done:
                busy[slot] += 1
                unfinished.append(ref)
        slot = min(range(n), key=busy.__getitem__)
        return (slot if busy[slot] < 2 else None), unfinished
