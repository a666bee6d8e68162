"""`autoplan calibrate`: fit the cost model's physical efficiencies to your own measured runs.

    autoplan calibrate runs.jsonl --gpu h100-sxm -o my-cluster.yaml
    autoplan estimate --model llama3-70b --gpus 256 --tp 8 --pp 4 --cluster my-cluster.yaml

The runs file format is documented in :mod:`autoplan.calibrate`.
"""

from __future__ import annotations

import json
import sys
from datetime import datetime, timezone
from typing import Any

import click

from autoplan.calibrate import (DEFAULT_FIT_FIELDS, PHYSICAL_BOUNDS, PRIOR_WEIGHT, fit, leave_one_out, run_lines,
                                profile_mapping, resolve_run, write_profile)
from autoplan.catalog import load_gpu
from autoplan.catalog.cluster import build_cluster
from autoplan.cli import cli
from autoplan.cli.options import user_errors
from autoplan.errors import UserInputError
from autoplan.outputs import output_target
from cost_models.errors import repeated_error


def _fields(text: str | None) -> tuple[str, ...]:
    if not text:
        return DEFAULT_FIT_FIELDS
    names = tuple(x.strip() for x in text.split(",") if x.strip())
    bad = [n for n in names if n not in PHYSICAL_BOUNDS]
    if bad:
        raise click.BadParameter(f"unknown parameter(s) {', '.join(bad)}; valid: {', '.join(sorted(PHYSICAL_BOUNDS))}",
                                 param_hint="--fit")
    if (err := repeated_error(names, "parameter")) is not None:  # one fit per parameter: a repeat is a slip
        raise click.BadParameter(err, param_hint="--fit")
    return names


@cli.command("calibrate")
@click.argument("runs_file", type=click.Path(dir_okay=False))
@click.option("--gpu", default=None, help="GPU catalog name the profile is for [the runs' GPU]")
@click.option("-o", "--output", "--out", "output", required=True, type=click.Path(dir_okay=False), help="cluster profile YAML to write")
@click.option("--fit", "fit_fields", default=None,
              help=f"comma-separated Efficiency fields to fit [{','.join(DEFAULT_FIT_FIELDS)}]")
@click.option("--start", "start_profile", default=None, type=click.Path(dir_okay=False),
              help="start from this cluster profile instead of the catalog's values")
@click.option("--prior-weight", type=click.FloatRange(min=0), default=PRIOR_WEIGHT, show_default=True,
              help="pull toward the start values (0: pure least squares)")
@click.option("--loo/--no-loo", default=True, show_default=True, help="report the leave-one-out error")
@click.option("--format", "fmt", type=click.Choice(["table", "json"]), default="table", show_default=True)
@user_errors
def calibrate_cmd(runs_file: str, gpu: str | None, output: str, fit_fields: str | None, start_profile: str | None,
                  prior_weight: float, loo: bool, fmt: str) -> None:
    """Fit efficiency parameters to measured runs (JSON Lines) and write a cluster profile for --cluster."""
    fields = _fields(fit_fields)
    output_target(output, what="cluster profile")  # refuse an unwritable -o before the fit
    runs = [resolve_run(r, f"{runs_file}:{i}") for i, r in run_lines(runs_file)]
    names = {r.cluster.gpu.name for r in runs}
    gpu_name = load_gpu(gpu).name if gpu else (next(iter(names)) if len(names) == 1 else None)
    if gpu_name is None:
        raise UserInputError(f"runs use several GPUs ({', '.join(sorted(names))}); pass --gpu and one GPU's runs")
    if names != {gpu_name}:
        raise UserInputError(f"--gpu {gpu_name} but the runs use {', '.join(sorted(names))}")
    # the start profile over the efficiency set of the runs' target (as each run resolves: ClusterRequest.resolve)
    start = (build_cluster(gpu_name, 1, profile=start_profile, target=runs[0].target).efficiency
             if start_profile else None)
    result = fit(runs, start, fields, prior_weight=prior_weight)
    loo_errors = (leave_one_out(runs, start, fields, prior_weight=prior_weight, progress=_loo_progress)
                  if loo and len(runs) > 1 else None)

    shared = {k: {getattr(r.cluster, k) for r in runs} for k in ("gpus_per_node", "inter_node_gbps",
                                                                 "nvlink_domain_size")}
    mapping = profile_mapping(gpu_name, result.efficiency, type(result.efficiency).model_fields)
    mapping.update({k: next(iter(v)) for k, v in shared.items() if len(v) == 1})
    stamp = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    header = (f"autoplan cluster profile, fitted by `autoplan calibrate {runs_file}` on {stamp}\n"
              f"{len(runs)} runs; fitted: {', '.join(result.fitted) or 'nothing'}"
              f"{'; held (runs cannot identify them): ' + ', '.join(result.held) if result.held else ''}\n"
              f"step-time MAPE {result.mape_before:.1%} (catalog) -> {result.mape_after:.1%} (fitted)"
              + (f"; leave-one-out {_mape(loo_errors):.1%}" if loo_errors else "")
              + "\nuse: autoplan estimate|search ... --cluster THIS_FILE")
    write_profile(output, mapping, header)

    if fmt == "json":
        out: dict[str, Any] = {
            "profile": output, "gpu": gpu_name, "fitted": result.fitted, "held": result.held,
            "at_bound": result.at_bound,
            "parameters": {n: {"before": getattr(result.start, n), "after": getattr(result.efficiency, n),
                               "bounds": list(PHYSICAL_BOUNDS[n])} for n in fields},
            "mape_before": result.mape_before, "mape_after": result.mape_after,
            "loo_mape": _mape(loo_errors) if loo_errors else None,
            "runs": [{"name": r.name, "measured_step_time_s": r.measured_step_time_s, "error_before": b,
                      "error_after": a, "loo_error": (loo_errors[i] if loo_errors else None)}
                     for i, (r, b, a) in enumerate(zip(runs, result.errors_before, result.errors_after))],
        }
        click.echo(json.dumps(out, indent=2))
        return
    click.echo(f"{len(runs)} runs on {gpu_name}; fitting {', '.join(fields)}")
    click.echo(f"{'run':32s} {'measured s':>11s} {'before':>8s} {'after':>8s} {'LOO':>8s}")
    for i, r in enumerate(runs):
        lo = f"{loo_errors[i]:+8.1%}" if loo_errors else f"{'-':>8s}"
        click.echo(f"{r.name[:32]:32s} {r.measured_step_time_s:11.4g} {result.errors_before[i]:+8.1%} "
                   f"{result.errors_after[i]:+8.1%} {lo}")
    click.echo(f"step-time MAPE: {result.mape_before:.1%} before, {result.mape_after:.1%} after"
               + (f", {_mape(loo_errors):.1%} leave-one-out" if loo_errors else ""))
    click.echo("parameters (before -> after, physical range):")
    for n in fields:
        lo_b, hi_b = PHYSICAL_BOUNDS[n]
        tag = "" if n in result.fitted else "  (held: the runs do not constrain it)"
        if n in result.at_bound:
            tag = "  (at a bound)"
        click.echo(f"  {n:22s} {getattr(result.start, n):8.4g} -> {getattr(result.efficiency, n):8.4g}  "
                   f"[{lo_b:g}, {hi_b:g}]{tag}")
    click.echo(f"wrote {output}")
    if result.mape_after > 0.15:
        click.echo("warning: the fit leaves more than 15% error; check the runs (parallel flags, mbs, precision)",
                   err=True)
    sys.stdout.flush()


def _loo_progress(done: int, total: int) -> None:
    """Leave-one-out refits one fit per run (a minute for ~60 runs): say so on stderr."""
    if done == 0 and total >= 8:
        click.echo(f"leave-one-out: refitting {total} times (--no-loo skips it) ...", err=True)


def _mape(errors: list[float] | None) -> float:
    return sum(abs(e) for e in errors) / len(errors) if errors else float("nan")
