"""Emitters: turn a plan into what Megatron-LM, torchtitan and plain PyTorch (FSDP2) consume.

``emit(plan, target)`` checks the plan (``check_emittable``) and returns the files as text;
``write_emitted(model, cluster, job, parallel, target, out_dir)`` writes them (``autoplan emit`` and
``autoplan search --emit`` call it). Nothing here imports torch: the frameworks' own checks live in
``autoplan.validate`` behind the ``validate`` extra.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass, field
from pathlib import Path

from autoplan.emit.launch import pin_emit_dir
from autoplan.emit.plan import TARGETS, EmitPlan, Target, check_emittable, emittable_targets, load_plan, plan_from_dict
from autoplan.errors import UserInputError
from autoplan.outputs import output_target
from cost_models.estimate import Prediction
from cost_models.specs import ClusterSpec, JobSpec, ModelSpec, ParallelConfig

__all__ = ["TARGETS", "EmitPlan", "Emitted", "Target", "check_emittable", "emit", "emittable_targets", "load_plan", "over_memory_message",
           "plan_from_dict", "price", "write_emitted", "write_plan"]


@dataclass(frozen=True)
class Emitted:
    """Files (name -> text) for one target, and notes on where the target cannot follow the plan exactly."""

    target: str
    files: dict[str, str]
    notes: list[str] = field(default_factory=list)
    prediction: Prediction | None = None
    """The cost model's price of the emitted layout (what ``autoplan estimate`` says of it)."""


def price(plan: EmitPlan, target: str) -> Prediction:
    """The emitted layout priced by the cost model as ``target`` holds it (its rules were checked by
    ``check_emittable``)."""
    from cost_models.estimate import estimate

    return estimate(plan.model, plan.cluster, plan.job, plan.parallel, check=False, runtime=plan.runtime(target))


def over_memory_message(plan: EmitPlan, pred: Prediction) -> str:
    par = plan.parallel
    return (f"the layout tp={par.tp} pp={par.pp} cp={par.cp} ep={par.ep} dp={plan.dp} mbs={par.micro_batch_size} "
            f"zero={par.zero_stage} recompute={par.recompute} does not fit: {pred.peak_memory_gib:.1f} GiB per GPU "
            f"on stage {pred.binding_stage}, {pred.over_memory_gib:.1f} GiB over the {pred.memory_limit_gib:.0f} GiB "
            "limit")


def emit(plan: EmitPlan, target: Target) -> Emitted:
    check_emittable(plan, target)
    if target == "megatron":
        from autoplan.emit import megatron

        files, notes = megatron.megatron_files(plan), megatron.notes(plan)
    elif target == "torchtitan":
        from autoplan.emit import torchtitan as tt

        files, notes = tt.torchtitan_files(plan), tt.notes(plan)
    else:
        from autoplan.emit import fsdp2

        files, notes = fsdp2.fsdp2_files(plan), fsdp2.notes(plan)
    files = dict(files)
    pred = price(plan, target)
    files["README.txt"] = _readme(plan, target, files, notes, pred)
    return Emitted(target=target, files=files, notes=notes, prediction=pred)


def _readme(plan: EmitPlan, target: str, files: dict[str, str], notes: list[str], pred: Prediction) -> str:
    lines = [f"autoplan emit --target {target}", ""]
    if not pred.fits:
        lines += [f"WARNING: {over_memory_message(plan, pred)}. It will run out of memory; "
                  "`autoplan search` finds layouts that fit.", ""]
    lines += [f"model {plan.model.name}; {plan.cluster.num_gpus} x {plan.cluster.gpu.name}; "
              f"dp={plan.dp} tp={plan.parallel.tp} pp={plan.parallel.pp} cp={plan.parallel.cp} "
              f"ep={plan.parallel.ep} vp={plan.parallel.vp}",
              f"predicted: step {pred.step_time_s:.3f} s, MFU {pred.mfu:.1%}, peak memory {pred.peak_memory_gib:.1f} "
              f"/ {pred.memory_limit_gib:.0f} GiB ({'fits' if pred.fits else 'DOES NOT FIT'})", "", "files:"]
    lines += [f"  {name}" for name in sorted(files)]
    if notes:
        lines += ["", "notes:"] + [f"  - {n}" for n in notes]
    lines += ["", "Check them with the frameworks' own code: autoplan validate --target "
              f"{target} ... (needs: pip install 'autoplan[validate]')"]
    return "\n".join(lines) + "\n"


def write_plan(plan: EmitPlan, target: Target, out_dir: str | Path) -> Emitted:
    """Emit ``plan`` for ``target`` into ``out_dir`` (created if needed); scripts are made executable."""
    result = emit(plan, target)
    out = Path(out_dir)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise UserInputError(f"cannot create output folder '{out_dir}': {err.strerror or err}") from None
    folder = str(out.resolve())
    for name, text in result.files.items():
        path = out / name
        if name.endswith((".sh", ".sbatch")):
            text = pin_emit_dir(text, folder)  # sbatch runs a spooled copy: the folder's path is written in
        output_target(str(path)).write_text(text)  # each file atomically: never half-written
        if name.endswith((".sh", ".sbatch")):
            path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return result


def write_emitted(model: ModelSpec, cluster: ClusterSpec, job: JobSpec, parallel: ParallelConfig,
                  target: Target, out_dir: str | os.PathLike[str]) -> list[Path]:
    """Public entry point (used by ``autoplan search --emit``): write the files and return their paths.

    Raises ``ConfigError`` (a ``ValueError``) when the plan breaks a hard constraint or the target cannot
    express it (e.g. a model torchtitan does not ship)."""
    result = write_plan(EmitPlan(model=model, cluster=cluster, job=job, parallel=parallel), target, out_dir)
    return [Path(out_dir) / name for name in sorted(result.files)]
