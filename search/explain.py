"""Why one plan beats another, computed from the two predictions' breakdowns (no canned text).

The step time splits exactly into parts (``estimate``: ``T = pipeline + PP fill + exposed DP + optimizer``,
``pipeline = m·t_slowest + bubble``)::

    compute + recompute + bubble + exposed TP + EP + CP + PP + DP + optimizer

(``TimeBreakdown.bubble_s`` includes the PP sends of the fill, which are listed under PP here). The
explanation lists the parts that differ most, what the layouts differ in, and what binds the winner:
its largest non-compute part and its memory headroom.
"""

from __future__ import annotations

from typing import Any

from cost_models.estimate import Prediction
from cost_models.specs import ClusterSpec, ParallelConfig

PART_NAMES = {
    "compute": "compute", "recompute": "recompute", "bubble": "pipeline bubble", "tp": "TP traffic",
    "ep": "EP all-to-all", "cp": "CP traffic", "pp": "PP sends", "dp": "exposed DP/FSDP traffic",
    "optimizer": "optimizer step",
}


def step_parts(pred: Prediction) -> dict[str, float]:
    """The step time's additive parts, seconds (module docstring); they sum to ``step_time_s``."""
    t = pred.time
    c = t.exposed_comm_s
    return {
        "compute": t.compute_s, "recompute": t.recompute_s, "bubble": t.bubble_s - c.get("pp", 0.0),
        "tp": c.get("tp", 0.0), "ep": c.get("ep", 0.0), "cp": c.get("cp", 0.0), "pp": c.get("pp", 0.0),
        "dp": c.get("dp", 0.0), "optimizer": t.optimizer_s,
    }


def _layout_diff(a: ParallelConfig, b: ParallelConfig, dp_a: int, dp_b: int) -> list[str]:
    out = []
    if dp_a != dp_b:
        out.append(f"dp {dp_a} vs {dp_b}")
    for f, label in (("tp", "tp"), ("pp", "pp"), ("cp", "cp"), ("ep", "ep"), ("vp", "vp"),
                     ("micro_batch_size", "mbs"), ("recompute", "recompute"), ("zero_stage", "zero"),
                     ("hsdp_shard_size", "hsdp"), ("schedule", "schedule"),
                     ("first_stage_layers", "first-stage layers"), ("last_stage_layers", "last-stage layers"),
                     ("account_for_embedding_in_pipeline_split", "embedding counted in the split"),
                     ("account_for_loss_in_pipeline_split", "loss counted in the split")):
        va, vb = getattr(a, f), getattr(b, f)
        if va != vb:
            out.append(f"{label} {va} vs {vb}")
    if a.recompute == b.recompute == "selective" and _modules(a) != _modules(b):  # the search's module ladder
        out.append(f"recompute modules {_modules(a)} vs {_modules(b)}")
    return out


def _modules(p: ParallelConfig) -> str:
    """The modules a selective plan recomputes as Megatron reads them (none given: its default ``core_attn``)."""
    return ",".join(p.recompute_modules) if p.recompute_modules is not None else "core_attn"


def binding(pred: Prediction, cluster: ClusterSpec) -> str:
    """What limits a plan: its largest overhead beyond compute, and how close memory is to the limit."""
    parts = step_parts(pred)
    over = {k: v for k, v in parts.items() if k != "compute" and v > 0}
    step = pred.step_time_s
    head = ""
    if over:
        k = max(over, key=lambda x: (over[x], x))
        head = f"largest overhead: {PART_NAMES[k]} {over[k]:.3f} s ({over[k] / step:.0%} of the step)"
    used = pred.peak_memory_gib / pred.memory_limit_gib
    mem = f"memory {pred.peak_memory_gib:.1f}/{pred.memory_limit_gib:.0f} GiB ({used:.0%})"
    if used > 0.9:
        mem += " binds"
    return "; ".join(x for x in (head, mem) if x)


def explain(a: ParallelConfig, pa: Prediction, b: ParallelConfig, pb: Prediction, cluster: ClusterSpec,
            top: int = 3) -> str:
    """Why plan ``a`` (prediction ``pa``) ranks above ``b``: the parts that differ most, signed
    (negative = ``a`` spends less), the layout differences, and what binds ``a``."""
    ta, tb = pa.step_time_s, pb.step_time_s
    da, db = step_parts(pa), step_parts(pb)
    diffs = sorted(((da[k] - db[k], k) for k in da), key=lambda x: (-abs(x[0]), x[1]))
    shown = [f"{'less' if d < 0 else 'more'} {PART_NAMES[k]} ({d:+.3f} s)" for d, k in diffs[:top]
             if abs(d) > 1e-4 * max(ta, tb)]
    gap = (tb - ta) / tb if tb else 0.0
    if abs(pa.composite_cost - pb.composite_cost) <= 1e-12 * max(1.0, pa.composite_cost):
        lead = "ties with the next plan on cost and wins the tie-break (simpler layout)"
    elif abs(gap) < 1e-9:
        lead = "same step time as the next plan, lower composite cost"
    else:
        pct = f"{gap:.1%}" if abs(gap) >= 1e-3 else f"{gap:.3%}"
        lead = f"{pct} faster than the next plan ({ta:.4g} s vs {tb:.4g} s per step)"
    diff = _layout_diff(a, b, pa.dp, pb.dp)
    text = lead
    if shown:
        text += ": " + ", ".join(shown)
    if diff:
        text += "; layouts differ in " + ", ".join(diff)
    if abs(pa.peak_memory_gib - pb.peak_memory_gib) > 0.05:
        text += f"; peak memory {pa.peak_memory_gib:.1f} vs {pb.peak_memory_gib:.1f} GiB"
    return text + ". Binds: " + binding(pa, cluster)


def knob_choice(moved: dict[str, Any], defaults: dict[str, Any], pred: Prediction,
                before: Prediction | None) -> str:
    """What the knobs the search set (``moved``: those that differ from the target's ``defaults``) bought on the
    plan's own layout: its step time against the same layout priced with the defaults (``before``)."""
    if not moved:
        return ""
    chosen = " ".join(f"{k}={v}" for k, v in moved.items())
    if before is None:
        return f"knobs chosen: {chosen}"
    was = " ".join(f"{k}={v}" for k, v in defaults.items() if v is not None)
    t0, t1 = before.step_time_s, pred.step_time_s
    return (f"knobs chosen: {chosen} ({t1:.4g} s per step vs {t0:.4g} s with the target's default {was}: "
            f"{(t1 - t0) / t0:+.1%})")
