"""`autoplan scale`: the best plan per GPU count over a sweep, with scaling efficiency, time and cost."""

from __future__ import annotations

import json
import os
import sys
from typing import Any

import click

from autoplan import api
from autoplan.cli import cli
from autoplan.cli.catalog_cmd import render_table
from autoplan.cli.estimate_cmd import parallel_options, pop_parallel
from autoplan.cli.goodput_options import failure_model, failure_options
from autoplan.cli.options import (cluster_flags, flags_given, format_option, job_options, job_spec, model_option,
                                  pop_software, request_from_file, request_option, software_options, user_errors)
from autoplan.errors import UserInputError


def _tokens(text: str | None) -> float | None:
    """``15e12``, ``15T``, ``300B``, ``2.5G`` ... as a number of tokens."""
    if text is None:
        return None
    units = {"K": 1e3, "M": 1e6, "G": 1e9, "B": 1e9, "T": 1e12, "P": 1e15}
    t = text.strip().upper()
    try:
        value = float(t[:-1]) * units[t[-1]] if t and t[-1] in units else float(t)
    except ValueError:
        value = float("nan")
    if not 0 < value < float("inf"):
        raise UserInputError(f"--train-tokens {text!r:.40}: expected a positive count like 15e12 or 15T")
    return value


@cli.command("scale")
@model_option
@click.option("--gpus", "gpus", required=True,
              help="GPU counts: a list (256,512,1024) or a range of powers of two (64..8192)")
@cluster_flags(gpus=False)
@job_options
@click.option("--weak", "weak", is_flag=True, default=False,
              help="weak scaling: the global batch grows with the GPU count from its value at the smallest size")
@click.option("--tokens-per-gpu", type=click.IntRange(min=1), default=None,
              help="weak scaling: tokens per GPU per step (global batch = GPUs x this / seq-len)")
@click.option("--train-tokens", default=None, help="tokens to train (e.g. 15T or 15e12): time and GPU-hours")
@click.option("--gpu-hour-price", type=click.FloatRange(min=0), default=None, help="price of one GPU-hour")
@parallel_options(required=False, modules=True)
@software_options
@click.option("--target", type=click.Choice(["megatron", "torchtitan", "fsdp2", "any"]), default="megatron",
              show_default=True, help="framework the plans must run on (any: the best plan some target runs, "
                                      "priced as that target runs it)")
@click.option("--rank-by", type=click.Choice(["step", "goodput"]), default="step", show_default=True,
              help="best plan by step time, or by tokens/s after failures")
@failure_options
@click.option("--processes", type=click.IntRange(1, 64), default=None,
              help="plan the sizes in this many processes [the CPUs this process may use, at most 4]")
@click.option("--plot", "plot_path", type=click.Path(dir_okay=False), default=None,
              help="write throughput and scaling efficiency against GPU count (.png or .svg; needs the 'plot' extra)")
@request_option
@format_option
@user_errors
def scale_cmd(model: str, gpus: str, fmt: str, weak: bool, tokens_per_gpu: int | None,
              train_tokens: str | None, gpu_hour_price: float | None, target: str, rank_by: str,
              plot_path: str | None, processes: int | None, **kw: Any) -> None:
    """The best plan for MODEL at each GPU count of --gpus: throughput, MFU, scaling efficiency against the
    smallest size, goodput after failures and, with --train-tokens, days, GPU-hours and cost to train.

    Strong scaling (default) keeps --global-batch-size; --weak or --tokens-per-gpu grow it with the GPUs.
    Rows with no plan say why (exit 0 while one size has a plan). The sizes share cached layer costs."""
    from autoplan.capacity import ScaleRequest, parse_gpus

    if plot_path is not None:
        from autoplan.plot import check_plot_path
        check_plot_path(plot_path)
    failures = failure_model(kw)
    data = request_from_file("scale", keep=("fmt", "plot_path"))
    if data is not None:
        request = ScaleRequest.model_validate(data)
    else:
        shape = {k: kw.pop(k) for k in ("gpu", "gpus_per_node", "inter_node_gbps", "nvlink_domain_size", "profile",
                                         "memory_headroom")}
        job = job_spec(kw).model_dump()
        if not flags_given(("global_batch_size",)):  # unset: --tokens-per-gpu may set it (the request refuses both)
            del job["global_batch_size"]
        request = ScaleRequest(model=model, cluster=shape, gpus=parse_gpus(gpus), job=job,
                               scaling="weak" if weak else "strong", tokens_per_gpu=tokens_per_gpu,
                               train_tokens=_tokens(train_tokens), gpu_hour_price=gpu_hour_price,
                               parallel=pop_parallel(kw), target=target, rank_by=rank_by, failures=failures,
                               software=pop_software(kw))
    if processes is None:
        processes = min(4, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1)
    result = api.scale(request, processes=processes)
    if plot_path is not None:
        from autoplan.plot import plot_scale
        plot_scale(result, plot_path)
    if fmt == "json":
        click.echo(json.dumps(result.model_dump(mode="json"), indent=2))
    else:
        click.echo(render_scale(result))
    if plot_path is not None:
        click.echo(f"wrote {plot_path}", err=True)
    if not any(r.status == "ok" for r in result.rows):  # nothing planned: infeasible (3) or bad input (2)
        sys.exit(3 if any(r.status == "infeasible" for r in result.rows) else 2)


def render_scale(result: Any) -> str:
    cost = result.gpu_hour_price is not None and result.train_tokens is not None
    headers = ["GPUs", "batch", "best layout", "step s", "tokens/s", "MFU", "eff.", "goodput"]
    if result.train_tokens is not None:
        headers += ["days", "GPU-hours"] + (["cost"] if cost else [])
    rows = []
    notes = []
    for r in result.rows:
        if r.status != "ok":
            rows.append([r.num_gpus, r.global_batch_size, r.status, *["-"] * (len(headers) - 3)])
            notes.append(f"  {r.num_gpus} GPUs: {r.message}"  # an infeasible row's message ends with its hint
                         + (f" ({r.hint})" if r.hint and r.hint not in (r.message or "") else ""))
            continue
        row = [r.num_gpus, r.global_batch_size, ("* " if r.layout_changed else "  ") + (r.layout or ""),
               f"{r.step_time_s:.3f}", f"{r.tokens_per_s:,.0f}", f"{r.mfu * 100:.1f}%",
               f"{r.scaling_efficiency * 100:.1f}%", f"{r.goodput * 100:.1f}%"]
        if result.train_tokens is not None:
            row += [f"{r.train_days:,.1f}", f"{r.gpu_hours:,.0f}"] + ([f"{r.cost:,.0f}"] if cost else [])
        rows.append(row)
    n_ok = sum(r.status == "ok" for r in result.rows)
    head = (f"{result.model.name}: {result.scaling} scaling on {result.cluster.gpu}, {len(result.rows)} sizes "
            f"({n_ok} with a plan) in {result.wall_time_s:.2f} s")
    if result.train_tokens is not None:
        head += f"; {result.train_tokens:.3g} tokens to train, time after failures"
    foot = ["* the best layout changes here; eff. = tokens/s per GPU against the smallest size; "
            "goodput = share of wall time that is progress after failures, checkpoints and restarts"]
    return "\n".join([head, render_table(headers, rows, text_columns=3), *foot, *notes, *_plan_notes(result)])


def _plan_notes(result: Any) -> list[str]:
    """Each plan's notes (``rows[i].plan.prediction.notes``, as ``search`` and ``estimate`` show them), each distinct
    note once with the sizes whose plans carry it: a model's note (e.g. torchtitan ships no flavor of it) is on every
    size and would repeat down the sweep."""
    sizes: dict[str, list[int]] = {}
    for r in result.rows:
        for note in dict.fromkeys(r.plan.prediction.notes if r.plan is not None else []):
            sizes.setdefault(note, []).append(r.num_gpus)
    return [f"  note ({'every size' if len(at) == len(result.rows) > 1 else ', '.join(map(str, at)) + ' GPUs'}): "
            f"{note}" for note, at in sizes.items()]
