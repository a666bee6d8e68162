"""Pipeline step time and bubble (COST_MODEL.md §5).

Unbalanced stages (Alpa, Zheng et al. OSDI'22 eq. 2): ``T = Σ_i t_i + (m − 1)·max_i t_i`` for 1F1B/GPipe,
where ``t_i`` is stage ``i``'s forward + backward time for one micro-batch. Balanced, that is
``(m + p − 1)·t``: bubble ``(p−1)/m`` of ideal, ``(p−1)/(m+p−1)`` of total.
Interleaved 1F1B with ``v`` virtual stages per rank (Narayanan et al. SC'21 §2.2): the fill/drain shrinks
by ``v``: ``T = m·t_max + (Σ_i t_i − t_max)/v`` → bubble ``(p−1)/(v·m)`` of ideal when balanced.
ZB-H1 (Qi et al. ICLR'24, "Zero Bubble Pipeline Parallelism" §3): splitting backward into input- and
weight-gradient passes leaves ``(p−1)(T_F + T_B − T_W)``; with ``T_F = T_B = T_W`` that is 1/3 of 1F1B's.
DualPipe (DeepSeek-V3 report §3.2.1, Table 2): ``(p/2 − 1)(T_F&B + T_B − 3·T_W)`` with a full backward
``T_B = 2·T_F``, ``T_W = T_F`` and the overlapped pair ``T_F&B = T_F + T_B``: ``(p/2 − 1)·2t/3`` for a stage time
``t = 3·T_F``, i.e. ``(p − 2)/(3(p − 1))`` of 1F1B's fill. (Estimate only: no target runs it.)
"""

from __future__ import annotations

from collections.abc import Sequence

from cost_models.specs import Schedule

ZB_H1_BUBBLE_FRACTION = 1.0 / 3.0


def pipeline_time_s(stage_times: Sequence[float], m: int, schedule: Schedule = "1f1b", vp: int = 1) -> float:
    """Step time of the pipeline (compute only) for ``m`` micro-batches."""
    t_max, total = max(stage_times), sum(stage_times)
    fill = total - t_max  # the other stages' share of the fill + drain
    if schedule == "interleaved":
        fill /= vp
    elif schedule == "zb-h1":
        fill *= ZB_H1_BUBBLE_FRACTION
    elif schedule == "dualpipe":
        p = len(stage_times)
        fill *= max(0, p - 2) / (3 * (p - 1)) if p > 1 else 0.0
    return m * t_max + fill


def dualpipe_rank_share(stage: int, pp: int) -> tuple[int, int]:
    """The two stages whose work rank ``stage`` runs under DualPipe: its own and the mirror ``pp − 1 − stage``.
    DeepSeek-V3 report §3.2.1: micro-batches are fed from both ends of the pipeline, each rank holds two copies
    of the parameters (stage ``i`` of one direction, stage ``pp − 1 − i`` of the other), and half of the
    micro-batches run each way; so a rank's time per micro-batch is the mean of the two stages' times."""
    return stage, pp - 1 - stage


def bubble_fraction(p: int, m: int, schedule: Schedule = "1f1b", vp: int = 1) -> float:
    """Bubble as a fraction of the total step for balanced stages."""
    total = pipeline_time_s([1.0] * p, m, schedule, vp)
    return (total - m) / total
