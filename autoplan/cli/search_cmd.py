"""`autoplan search`: the best parallel plans for a model on a cluster, ranked, with why."""

from __future__ import annotations

import json
import sys
import time
from typing import Any

import click
from click.core import ParameterSource

from autoplan import api
from autoplan.cli import cli
from autoplan.cli.estimate_cmd import parallel_options, pop_parallel
from autoplan.cli.goodput_options import failure_model, failure_options, render_goodput
from autoplan.cli.options import (cluster_options, cluster_request, format_option, job_options, job_spec,
                                  pop_software, software_options,
                                  fail, model_option, request_from_file, request_option, user_errors)
from autoplan.errors import ConfigError
from autoplan.report import describe_job, render_plan, render_search_stats
from autoplan.schema import EmitReport, SearchRequest, validate_request


class _Progress:
    """A progress line on stderr, shown only once the search has run for more than a second."""

    def __init__(self, delay_s: float = 1.0) -> None:
        self.start = time.perf_counter()
        self.delay_s = delay_s
        self.shown = False
        self.tty = sys.stderr.isatty()

    def __call__(self, done: int, total: int) -> None:
        if time.perf_counter() - self.start < self.delay_s:
            return
        # ``total`` counts every layout, in the order of its step-time bound; the search stops where the bound does
        if self.tty:
            click.echo(f"\rscoring: {done}/{total} layouts, fastest bound first", nl=False, err=True)
        elif not self.shown:
            click.echo(f"scoring up to {total} layouts, fastest bound first ...", err=True)
        self.shown = True

    def close(self) -> None:
        if self.shown and self.tty:
            click.echo("\r" + " " * 60 + "\r", nl=False, err=True)


def _emit(out_dir: str, model: Any, request: SearchRequest, job: Any, plans: list[Any]) -> EmitReport:
    """Write plan #1's launch files for the target it was priced for (under ``any``: the one it came from), on the
    cluster as that target runs on it; a failure is reported in the result (the search result stands)."""
    from autoplan.emit import EmitPlan, write_plan

    from autoplan.emit.plan import priced_software

    emit_target = plans[0].target
    cluster = request.cluster.resolve(emit_target)
    plan = EmitPlan(model=model, cluster=cluster, job=job, parallel=plans[0].parallel,
                    op_shardings=plans[0].op_shardings,  # the intra-op ILP's per-op choices (fsdp2 writes them)
                    software=priced_software(plans[0].prediction.software))  # the knobs it was priced with
    try:
        written = write_plan(plan, emit_target, out_dir)
    except ConfigError as err:
        return EmitReport(target=emit_target, dir=out_dir, error=str(err))
    return EmitReport(target=emit_target, dir=out_dir, files=sorted(written.files), notes=list(written.notes))


@cli.command("search")
@model_option
@cluster_options
@job_options
@parallel_options(required=False, searched=True, modules=True)
@click.option("--top", "top_k", type=click.IntRange(1, 50), default=3, show_default=True, help="plans to show")
@click.option("--target", type=click.Choice(["megatron", "torchtitan", "fsdp2", "any"]), default="megatron",
              show_default=True,
              help="framework the plan must run on (its profile in cost_models.targets): megatron (DDP, distributed "
                   "optimizer, torch FSDP2 without PP/EP; 1F1B/interleaved), torchtitan (FSDP2/HSDP, replicate), "
                   "fsdp2 (plain FSDP2 + DTensor module, per-op TP plan; no CP/EP), any (the best plans some target "
                   "runs, each priced as its target runs it and labelled with it; --emit writes for that target)")
@click.option("--rank-by", type=click.Choice(["step", "goodput"]), default="step", show_default=True,
              help="rank by step time, or by tokens/s after failures, checkpoints and restarts (goodput)")
@failure_options
@software_options
@request_option
@format_option
@click.option("--emit", "emit_dir", type=click.Path(file_okay=False), default=None,
              help="write the best plan's launch files (autoplan emit) into this directory")
@user_errors
def search_cmd(model: str, fmt: str, top_k: int, target: str, emit_dir: str | None,
               rank_by: str, **kw: Any) -> None:
    """Find the best parallel plans (degrees, schedule, micro-batches, recompute, ZeRO) for MODEL on --gpus.

    The job is --global-batch-size sequences of --seq-len tokens in --precision (defaults: 1024 x 8192,
    bf16); it is printed with the result. Degree flags (--tp 8 --pp 4 --zero 1 ...) pin those values;
    the rest is searched. Every number shown comes from the same model as `autoplan estimate`.
    Exit status 3 when no layout fits, with the closest one and the smallest GPU count that has a plan.
    """
    failures = failure_model(kw)
    data = request_from_file("search", keep=("fmt", "emit_dir", "top_k"))
    if data is not None:
        if click.get_current_context().get_parameter_source("top_k") is ParameterSource.COMMANDLINE:
            data["top"] = top_k  # how many plans to show: --top beside --request overrides the file's "top"
        request = validate_request(SearchRequest, data)
    else:
        request = SearchRequest(model=model, cluster=cluster_request(kw).model_dump(),
                                job=job_spec(kw).model_dump(), parallel=pop_parallel(kw), top=top_k, target=target,
                                rank_by=rank_by, failures=failures, software=pop_software(kw))
    specs = api.resolve(request)
    model_spec, cluster, job = specs.model, specs.cluster, specs.job
    progress = _Progress()
    try:
        result = api.search(request, progress=progress)
    finally:
        progress.close()
    if emit_dir:
        result = result.model_copy(update={"emitted": _emit(emit_dir, model_spec, request, job, result.plans)})
    if fmt == "json":
        data = result.model_dump(mode="json")
        if data["emitted"] is None:  # fields of flags not given are left out
            del data["emitted"]
        click.echo(json.dumps(data, indent=2))
    else:
        stats = result.search
        click.echo(describe_job(model_spec, cluster, job, result.cluster.efficiency_basis))
        click.echo(render_search_stats(stats.candidates, stats.evaluated, stats.pruned, stats.wall_time_s,
                                       stats.target))
        for p in result.plans:
            click.echo("")
            click.echo(render_plan(p.rank, p.parallel, p.prediction, p.explanation, job.precision,
                                   p.target if stats.target == "any" else None))
            if p.goodput is not None:
                click.echo(render_goodput(p.goodput))
        emitted = result.emitted
        if emitted is not None and emitted.error is None:
            click.echo("")
            click.echo(f"emitted plan #1 for {emitted.target} to {emitted.dir}: {', '.join(emitted.files)}")
            for note in emitted.notes:
                click.echo(f"  changed by the emitter: {note}")
    if result.emitted is not None and result.emitted.error is not None:
        fail(f"Error: --emit {emit_dir}: {result.emitted.error}", 2)
