"""The interleaved pipeline price against the order torch's own ``ScheduleInterleaved1F1B`` runs.

torchtitan's interleaved pipelines run torch 2.13's ``ScheduleInterleaved1F1B``, a ``_PipelineScheduleRuntime`` that
executes each rank's action list (``_calculate_single_rank_operations``: torch's own warm-up, 1F1B and cool-down,
rounds of ``n_microbatches // pp`` included). Those lists are replayed here as a dependency simulation (a forward
chunk after the previous stage's, a backward after the next stage's and its own forward; each rank in its list's
order) with balanced stages, forward 1 and backward 2 per micro-batch split evenly over a rank's ``vp`` chunks. The
makespan must be ``cost_models.pipeline.pipeline_time_s``'s (m·t + (pp − 1)·t / vp).
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from cost_models.pipeline import pipeline_time_s


def _makespan(orders: dict[int, list[Any]], stages: int, forward: float, backward: float) -> float:
    finished: dict[tuple[str, int, int], float] = {}
    clock = dict.fromkeys(orders, 0.0)
    todo = {r: [a for a in acts if a is not None and a.computation_type.name in ("FORWARD", "FULL_BACKWARD")]
            for r, acts in orders.items()}
    moved = True
    while moved:
        moved = False
        for r, acts in todo.items():
            while acts:
                a = acts[0]
                mb, st = a.microbatch_index, a.stage_index
                if a.computation_type.name == "FORWARD":
                    key, deps, took = ("F", mb, st), [("F", mb, st - 1)] if st else [], forward
                else:
                    key, took = ("B", mb, st), backward
                    deps = [("F", mb, st)] + ([("B", mb, st + 1)] if st < stages - 1 else [])
                if any(d not in finished for d in deps):
                    break
                clock[r] = finished[key] = max([clock[r]] + [finished[d] for d in deps]) + took
                acts.pop(0)
                moved = True
    assert not any(todo.values()), "the orders deadlock"
    return max(clock.values())


@pytest.mark.parametrize("pp,vp,m", [(8, 2, 8), (8, 2, 16), (8, 4, 16), (4, 2, 10), (4, 3, 12), (2, 2, 3)])
def test_interleaved_bubble_is_torchs(pp: int, vp: int, m: int) -> None:
    pytest.importorskip("torch")
    from torch.distributed.pipelining.schedules import ScheduleInterleaved1F1B

    rounds = max(1, m // pp)  # ScheduleInterleaved1F1B.__init__ (schedules.py:2935-2936 @ torch 2.13)
    orders = {}
    for rank in range(pp):
        schedule = SimpleNamespace(n_local_stages=vp, microbatches_per_round=m // rounds, pp_group_size=pp,
                                   _n_microbatches=m)
        orders[rank] = ScheduleInterleaved1F1B._calculate_single_rank_operations(schedule, rank)
    got = _makespan(orders, pp * vp, 1.0 / vp, 2.0 / vp)
    assert got == pytest.approx(pipeline_time_s([3.0] * pp, m, "interleaved", vp), rel=1e-12)
    assert got > pipeline_time_s([3.0] * pp, m, "interleaved", 2 * vp)  # a wrong vp would show
