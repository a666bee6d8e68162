"""`autoplan emit` and `autoplan validate`: configs that Megatron-LM, torchtitan and FSDP2 accept.

Input is either a plan JSON (``--plan FILE [--index N]``, N as numbered in the table from 1, from ``estimate``/``search --format json``) or
explicit degrees with the same model/cluster/job/parallel flags as ``autoplan estimate``.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import click

from autoplan.cli import cli
from autoplan.cli.estimate_cmd import parallel_options, pop_parallel
from autoplan.cli.options import FLOAT, INT  # noqa: F401
from autoplan.cli.options import (PLAN_FILE_FIELDS, cluster_flags, cluster_request, flags_given, job_options,
                                  job_spec, pop_software, software_options, stack, user_errors)
from autoplan.emit import TARGETS, EmitPlan, check_emittable, load_plan, over_memory_message, price, write_plan
from autoplan.emit.plan import plan_target
from autoplan.errors import InfeasibleError
from autoplan.inputs import strict
from cost_models.specs import ParallelConfig

# The same flags as `estimate`, optional here because --plan is the other way in.
plan_inputs = stack(
    click.option("--plan", "plan_file", type=click.Path(dir_okay=False), default=None,
                 help="plan JSON from `autoplan estimate/search --format json`"),
    click.option("--index", type=INT, default=None, help="with a search result: the plan numbered #INDEX in its table [1]"),
    click.option("--model", default=None,
                 help="catalog name, HF config.json path or spec file (instead of --plan)"),
    cluster_flags(gpus_required=False),
    job_options,
    parallel_options(required=False, layout=True),
    software_options,
)

target_option = click.option("--target", type=click.Choice(TARGETS), default=None,
                             help="framework to emit for [with --plan: the target the plan was found for]")


def pick_target(target: str | None, kw: dict[str, Any]) -> str:
    """``--target``, or with ``--plan`` the target its plan names (``search --target any`` plans name theirs)."""
    if target is not None:
        return target
    if kw.get("plan_file") is not None:
        found = plan_target(kw["plan_file"], kw.get("index"))  # a malformed file or --index speaks first
        if found is not None:
            return found
        load_plan(kw["plan_file"], kw.get("index"))  # the file's own errors before the missing --target
    raise click.UsageError(f"Missing option '--target'. Choose from: {', '.join(TARGETS)}")


def resolve_plan(kw: dict[str, Any], target: str) -> EmitPlan:
    """An ``EmitPlan`` from --plan, or from --model/--gpus and the degree flags, on the cluster as ``target`` runs
    on it (``ClusterRequest.resolve``, the one function estimate and search resolve it with)."""
    plan_file, index, model = kw.pop("plan_file"), kw.pop("index"), kw.pop("model")
    mtp_layers = kw.pop("mtp_layers", None)
    degrees = pop_parallel(kw)
    software = pop_software(kw)
    if plan_file is not None:
        given = flags_given(PLAN_FILE_FIELDS)
        if model is not None or degrees or given or mtp_layers is not None:
            raise click.UsageError("give either --plan FILE or --model/--gpus/degree flags, not both"
                                   + (f" (the file holds its cluster and job: {', '.join(given)} would be "
                                      "ignored)" if given else ""))
        plan = load_plan(plan_file, index, target)  # with the knobs it was priced with; flags given here override them
        if software.given():
            from dataclasses import replace

            plan = replace(plan, software=plan.software.model_copy(update=software.given()))
        return plan
    if index is not None:
        raise click.UsageError("--index needs --plan")
    if model is None or kw.get("num_gpus") is None:
        raise click.UsageError("give --plan FILE, or --model and --gpus with the degree flags (--tp, --pp, ...)")
    from autoplan.request import resolve, with_mtp_layers

    cluster_req, job = cluster_request(kw), job_spec(kw)
    par = strict(ParallelConfig, degrees, "parallel")
    model_spec, cluster, job = resolve(model, cluster_req, job, target)
    model_spec = with_mtp_layers(model_spec, mtp_layers)
    return EmitPlan(model=model_spec, cluster=cluster, job=job, parallel=par, software=software)


def with_target_defaults(plan: EmitPlan, target: str) -> EmitPlan:
    """The target's own ZeRO stage and K/V mode (fsdp2: 'replicate') where none was given
    (``TargetProfile.with_defaults``). The cluster already carries the target's efficiency set (``resolve_plan``)."""
    from dataclasses import replace

    from cost_models.targets import PROFILES

    return replace(plan, parallel=PROFILES[target].with_defaults(plan.parallel, plan.software))


@cli.command("emit")
@target_option
@click.option("-o", "--out", "--output", "out_dir", type=click.Path(file_okay=False), required=True, help="output folder")
@plan_inputs
@click.option("--allow-over-memory", is_flag=True, default=False,
              help="write a layout the cost model says does not fit in GPU memory (marked in README.txt)")
@user_errors
def emit_cmd(target: str | None, out_dir: str, allow_over_memory: bool, **kw: Any) -> None:
    """Write the launch configuration of a plan for Megatron-LM, torchtitan or FSDP2.

    The layout is priced first (as `autoplan estimate` would); one that does not fit in GPU memory is
    refused (exit 3) unless --allow-over-memory, which writes it with a warning in README.txt."""
    target = pick_target(target, kw)
    plan = with_target_defaults(resolve_plan(kw, target), target)
    check_emittable(plan, target)  # type: ignore[arg-type]
    pred = price(plan, target)
    if not pred.fits:
        if not allow_over_memory:
            raise InfeasibleError(over_memory_message(plan, pred),
                                  hint="Pin other degrees, or run `autoplan search` for a layout that fits "
                                       "(--allow-over-memory writes it anyway)")
        click.echo(f"warning: {over_memory_message(plan, pred)}; writing it anyway (--allow-over-memory)", err=True)
    result = write_plan(plan, target, out_dir)  # type: ignore[arg-type]
    click.echo(f"predicted: step {pred.step_time_s:.3f} s, MFU {pred.mfu:.1%}, peak memory "
               f"{pred.peak_memory_gib:.1f} / {pred.memory_limit_gib:.0f} GiB "
               f"({'fits' if pred.fits else 'DOES NOT FIT'})")
    click.echo(f"wrote {len(result.files)} files for {target} to {out_dir}:")
    for name in sorted(result.files):
        click.echo(f"  {Path(out_dir) / name}")
    for note in result.notes:
        if note.startswith("WARNING: "):
            click.echo(f"warning: {note.removeprefix('WARNING: ')}", err=True)
        else:
            click.echo(f"note: {note}")


@cli.command("validate")
@target_option
@click.option("-o", "--out", "--output", "out_dir", type=click.Path(file_okay=False), default=None,
              help="also keep the emitted files here (default: a temporary folder)")
@plan_inputs
@user_errors
def validate_cmd(target: str | None, out_dir: str | None, **kw: Any) -> None:
    """Emit a plan and check it with the framework's own code (needs the `validate` extra)."""
    target = pick_target(target, kw)
    from autoplan.validate import EXTRA_HINT, missing_extra, run_checks

    plan = with_target_defaults(resolve_plan(kw, target), target)
    missing = missing_extra(target)  # type: ignore[arg-type]
    if missing:
        click.echo(f"Error: validate --target {target} runs {', '.join(missing)}, which "
                   f"{'is' if len(missing) == 1 else 'are'} not installed. Install the extra: {EXTRA_HINT}",
                   err=True)
        sys.exit(1)
    checks = run_checks(plan, target, out_dir)  # type: ignore[arg-type]
    for c in checks:
        click.echo(c.line())
    bad = sum(not c.ok for c in checks)
    skipped = sum(c.skipped for c in checks)
    ran = len(checks) - skipped
    click.echo(f"validate --target {target}: {ran - bad} of {ran} checks passed"
               + (f", {skipped} skipped (see SKIP)" if skipped else ""))
    sys.exit(1 if bad else 0)
