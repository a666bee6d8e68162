"""`autoplan estimate`: score a parallel configuration a user already has."""

from __future__ import annotations

import json
from typing import Any

import click

from autoplan import api
from autoplan.cli import cli
from autoplan.cli.options import FLOAT, INT  # noqa: F401
from autoplan.cli.options import (cluster_options, cluster_request, format_option, job_options, job_spec,
                                  model_option, pop_software, request_from_file, request_option, software_options,
                                  stack, user_errors)
from autoplan.cli.goodput_options import failure_model, failure_options, render_goodput
from autoplan.inputs import strict
from autoplan.report import describe_job, describe_parallel, describe_software, render_prediction
from autoplan.schema import ESTIMATE_ANY, EstimateRequest, validate_request
from cost_models.specs import ParallelConfig, recompute_module_names_error


def parallel_options(required: bool, searched: bool = False, layout: bool = False, modules: bool | None = None) -> Any:
    """Degree flags; ``required`` for estimate, optional pins for search (``searched``: an omitted flag is
    searched, so the help shows no default) and emit (omitted: ParallelConfig's default). ``layout``: also
    Megatron's explicit pipeline layout and MTP layers (estimate and emit: they are priced, not searched). ``modules``
    (default: ``layout``): Megatron's recompute modules; True: as a pin of the searches (search, scale), which hold
    every plan to them, as --recompute."""
    opt = click.option

    def default(text: str) -> str:
        return "[searched]" if searched else f"[{text}]"
    return stack(
        opt("--tp", type=INT, required=required, help="tensor-parallel degree"),
        opt("--pp", type=INT, required=required, help="pipeline-parallel degree"),
        opt("--cp", type=INT, default=None, help=f"context-parallel degree {default('1')}"),
        opt("--ep", type=INT, default=None, help=f"expert-parallel degree; divides the target's expert ranks (megatron: tp*cp*dp with expert-TP 1; torchtitan: dp_shard*cp*tp) {default('1')}"),
        opt("--vp", type=INT, default=None, help=f"virtual stages per pipeline rank (interleaved) {default('1')}"),
        opt("--mbs", "micro_batch_size", type=INT, default=None,
            help=f"micro-batch size in sequences {default('1')}"),
        opt("--zero", "zero_stage", type=click.IntRange(0, 3), default=None,
            help="as the target runs it: megatron 0 DDP, 1 distributed optimizer, 2 Megatron-FSDP optim_grads, 3 "
                 f"torch FSDP2; torchtitan 0 replicate, 3 FSDP2; fsdp2 3 {default('megatron 1 (0 with Muon), else 3')}"),
        opt("--hsdp", "hsdp_shard_size", type=INT, default=None,
            help=f"HSDP shard-group size {default('none')}"),
        opt("--recompute", type=click.Choice(["none", "selective", "full"]), default=None, help=default("none")),
        opt("--sequence-parallel/--no-sequence-parallel", default=None, help=f"Megatron SP {default('on')}"),
        opt("--schedule", type=click.Choice(["1f1b", "interleaved", "zb-h1"]), default=None,
            help="pipeline schedule; vp > 1 is the interleaved one (Megatron) " + default("1f1b, interleaved with --vp > 1")),
        opt("--first-stage-layers", type=INT, default=None,
            help=f"decoder layers on pipeline stage 0 {default('even split')}"),
        opt("--last-stage-layers", type=INT, default=None,
            help=f"decoder layers on the last stage {default('even split')}"),
        opt("--account-for-embedding-in-pipeline-split", "account_for_embedding_in_pipeline_split", is_flag=True,
            default=None, help="the embedding counts as a layer of the pipeline split (Megatron)"),
        opt("--account-for-loss-in-pipeline-split", "account_for_loss_in_pipeline_split", is_flag=True,
            default=None, help="the output layer and loss count as a layer of the pipeline split (Megatron)"),
        *([] if not layout else [
            opt("--mtp-layers", "mtp_layers", type=click.IntRange(0, 16), default=None,
                help="MTP modules trained (Megatron --mtp-num-layers), overriding the model's; 0: without MTP "
                     "[the model's]"),
            opt("--pipeline-layout", "pipeline_layout", type=str, default=None, metavar="LAYOUT",
                help="Megatron --pipeline-model-parallel-layout: E embedding, t decoder layer, m MTP, L loss, '|' "
                     "between the pp*vp stages, e.g. 'Et|(tt|)*30mL' (sets vp; torchtitan: E, t and L only, emitted as "
                     "module_fqns_per_model_part) [even split]"),
        ]),
        *([] if not (layout if modules is None else modules) else [
            opt("--recompute-modules", "recompute_modules", type=str, default=None, callback=_modules,
                metavar="M1,M2", help="Megatron --recompute-modules (implies --recompute selective"
                + ("; every plan the search returns uses them; megatron target" if modules is True else "") + "): "
                "core_attn, moe_act, layernorm, mla_up_proj, mlp, moe, shared_experts; '' for none [core_attn]")]),
    )


def _modules(ctx: click.Context, param: click.Parameter, value: str | None) -> tuple[str, ...] | None:
    """A comma- or space-separated module list, checked as a request's is (``recompute_module_names_error``)."""
    if value is None:
        return None
    names = tuple(x for x in value.replace(",", " ").split() if x)
    if (err := recompute_module_names_error(names)) is not None:
        raise click.BadParameter(err)
    return names


PARALLEL_KEYS = ("tp", "pp", "cp", "ep", "vp", "micro_batch_size", "zero_stage", "hsdp_shard_size", "recompute",
                 "sequence_parallel", "schedule", "first_stage_layers", "last_stage_layers",
                 "account_for_embedding_in_pipeline_split", "account_for_loss_in_pipeline_split", "pipeline_layout",
                 "recompute_modules")


def pop_parallel(kw: dict[str, Any]) -> dict[str, Any]:
    """The degree flags the user gave (None = not given)."""
    return {k: v for k in PARALLEL_KEYS if (v := kw.pop(k, None)) is not None}


class FrameworkChoice(click.Choice):  # type: ignore[type-arg]
    """A framework; ``any`` (search's) gets the reason estimate cannot take it, not click's generic list."""

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if value == "any":
            self.fail(ESTIMATE_ANY, param, ctx)
        return super().convert(value, param, ctx)


@cli.command("estimate")
@model_option
@cluster_options
@job_options
@parallel_options(required=True, layout=True)
@failure_options
@click.option("--target", type=FrameworkChoice(["megatron", "torchtitan", "fsdp2"]), default="megatron",
              show_default=True, help="framework that runs the layout: its rules (cost_models.targets) refuse what it "
              "cannot run, and it is priced as it runs (memory, gradient dtype, knobs)")
@software_options
@request_option
@format_option
@user_errors
def estimate_cmd(model: str, fmt: str, target: str, **kw: Any) -> None:
    """Predict step time, tokens/s, MFU and memory per GPU of one parallel configuration, and its goodput
    after failures, checkpoints and restarts."""
    failures = failure_model(kw)
    data = request_from_file("estimate")
    mtp_layers = kw.pop("mtp_layers", None)
    if data is not None:
        request = validate_request(EstimateRequest, data)
    else:
        request = EstimateRequest(model=model, mtp_layers=mtp_layers, cluster=cluster_request(kw).model_dump(),
                                  job=job_spec(kw).model_dump(), parallel=strict(ParallelConfig, pop_parallel(kw), "parallel"),
                                  failures=failures, target=target, software=pop_software(kw))
    result = api.estimate(request)
    if fmt == "json":
        click.echo(json.dumps(result.model_dump(mode="json"), indent=2))
        return
    specs = api.resolve(request)
    click.echo(describe_job(specs.model, specs.cluster, specs.job, result.cluster.efficiency_basis))
    click.echo(f"plan: {describe_parallel(result.parallel, result.prediction.dp)}")
    click.echo(f"software: {describe_software(result.prediction.software)}")
    click.echo(render_prediction(result.prediction, specs.job.precision))
    if result.goodput is not None:
        click.echo(render_goodput(result.goodput))
