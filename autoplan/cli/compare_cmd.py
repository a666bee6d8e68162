"""`autoplan compare`: two or more plans side by side, and why the best one wins."""

from __future__ import annotations

import difflib
import json
import re
from pathlib import Path
from typing import Any

import click

from autoplan import api
from autoplan.cli import cli
from autoplan.cli.catalog_cmd import render_table
from autoplan.cli.goodput_options import failure_model, failure_options
from autoplan.cli.options import (PLAN_FILE_FIELDS, cluster_flags, cluster_request, flags_given, format_option,
                                  job_options, job_spec, pop_software, software_options, user_errors)
from autoplan.errors import UserInputError

# Degree-spec keys as the CLI flags spell them, to ParallelConfig fields.
KEYS = {"tp": "tp", "pp": "pp", "cp": "cp", "ep": "ep", "vp": "vp", "mbs": "micro_batch_size",
        "micro_batch_size": "micro_batch_size", "zero": "zero_stage", "zero_stage": "zero_stage",
        "hsdp": "hsdp_shard_size", "recompute": "recompute", "schedule": "schedule",
        "sp": "sequence_parallel", "sequence_parallel": "sequence_parallel",
        "first_stage_layers": "first_stage_layers", "last_stage_layers": "last_stage_layers",
        "account_for_embedding_in_pipeline_split": "account_for_embedding_in_pipeline_split",
        "account_for_loss_in_pipeline_split": "account_for_loss_in_pipeline_split"}
SHOWN_KEYS = sorted(set(KEYS) - {"micro_batch_size", "zero_stage"})
_INDEX = re.compile(r"^#(-?\d+)$")
_TRUE, _FALSE = ("1", "true", "on", "yes"), ("0", "false", "off", "no")


def _degrees(text: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for item in text.split(","):
        key, _, value = item.strip().partition("=")
        key = key.strip()
        field = KEYS.get(key)
        if field is None:
            close = difflib.get_close_matches(key, list(KEYS), n=2)
            raise UserInputError(f"plan {text!r:.60}: {key!r:.30} is not a degree"
                                 + (f" (did you mean {' or '.join(close)}?)" if close else "")
                                 + f"; use KEY=VALUE with KEY in {', '.join(SHOWN_KEYS)}")
        if not value.strip():
            raise UserInputError(f"plan {text!r:.60}: {key} has no value; write {key}=VALUE")
        if field in out:
            raise UserInputError(f"plan {text!r:.60}: {key.strip()} is given twice (which one is meant?)")
        v: Any = value.strip()
        if field == "sequence_parallel":
            if v.lower() not in _TRUE + _FALSE:
                raise UserInputError(f"plan {text!r:.60}: {key}={value!r:.20} must be true or false; "
                                     f"valid: {', '.join(_TRUE + _FALSE)}")
            v = v.lower() in _TRUE
        elif field not in ("recompute", "schedule"):
            try:
                v = int(v)
            except ValueError:
                raise UserInputError(f"plan {text!r:.60}: {key}={value!r:.20} must be an integer") from None
        out[field] = v
    return out


_BARE = re.compile(r"\s*([A-Za-z_]+)\s*[:\s]?\s*(-?\d*)\s*")


def _not_a_plan(text: str) -> str:
    """Why ``text`` (no '=', no '#', no file) is no PLAN, with the form meant where it reads as one: a bare degree
    key ('tp', 'tp8', 'tp:8') is KEY=VALUE, a bare number is #K."""
    form = "a PLAN is FILE[#K], #K or KEY=VALUE,..."
    if (m := _BARE.fullmatch(text)) and (m.group(1) in KEYS or difflib.get_close_matches(m.group(1), list(KEYS), n=1)):
        key = m.group(1) if m.group(1) in KEYS else difflib.get_close_matches(m.group(1), list(KEYS), n=1)[0]
        return (f"plan {text!r:.80}: a degree is written KEY=VALUE (e.g. {key}={m.group(2) or 'VALUE'}), several "
                f"joined by commas as tp=8,pp=4; {form}")
    if text.strip().lstrip("-").isdigit():
        return f"plan {text!r:.80}: no such file; plan K of the search is written #K (e.g. #{text.strip()}); {form}"
    return f"plan {text!r:.80}: no such file ({form})"


def _is_file(text: str) -> bool:
    """Whether PLAN ``text`` names a saved result (``FILE[#K]``), as the loop of ``compare_cmd`` reads it."""
    path = text.partition("#")[0] if not text.startswith("#") else ""
    return bool(path) and Path(path).expanduser().is_file()


def _estimate_of(path: str, index: int) -> dict[str, Any]:
    """The estimate request of plan ``index`` (1-based) of a saved search or estimate result."""
    from autoplan.emit import load_plan
    from autoplan.emit.plan import load_cluster_request, plan_target

    target = plan_target(path, index) or "megatron"  # the target it was priced for
    plan = load_plan(path, index, target)
    cluster = load_cluster_request(path).model_copy(update={"memory_headroom": plan.cluster.memory_headroom})
    return {"model": plan.model.model_dump(exclude_none=True), "target": target,
            # the cluster it was priced on (its profile's efficiency too) and the limit it was checked against
            "cluster": cluster.model_dump(exclude_none=True),
            "job": plan.job.model_dump(), "parallel": plan.parallel.model_dump(exclude_none=True),
            "software": plan.software.given()}  # the knobs it was priced with (the search chose the unset ones)


@cli.command("compare")
@click.argument("plans", nargs=-1, required=True, metavar="PLAN PLAN [PLAN]...")
@click.option("--model", default=None, help="for #K and degree plans: catalog name, HF config.json or spec file")
@cluster_flags(gpus_required=False)
@job_options
@click.option("--target", type=click.Choice(["megatron", "torchtitan", "fsdp2", "any"]), default="megatron",
              show_default=True, help="for #K plans: the search's target (each plan is priced for the target that "
                                      "runs it); for degree plans: the target (any: megatron)")
@click.option("--rank-by", type=click.Choice(["step", "goodput"]), default="step", show_default=True)
@software_options
@failure_options
@format_option
@user_errors
def compare_cmd(plans: tuple[str, ...], model: str | None, target: str, rank_by: str, fmt: str,
                **kw: Any) -> None:
    """Compare PLANs side by side: step time, throughput, MFU, goodput, time and memory breakdowns, and the
    differences that explain each gap to the best.

    \b
    A PLAN is one of
      FILE[#K]        a saved `estimate`/`search --format json` result (plan K of a search, 1-based; #1 default)
      #K              plan K of `autoplan search` for --model/--gpus and the job flags
      tp=8,pp=4,...   degrees (keys as the estimate flags: tp pp cp ep vp mbs zero hsdp recompute schedule sp)
                      for --model/--gpus and the job flags"""
    if len(plans) < 2:
        raise UserInputError(f"compare needs two or more plans, got {len(plans)}")
    failures = failure_model(kw).model_dump()
    knobs = pop_software(kw).given()  # for #K and degree plans, as search/estimate take them (files keep theirs)
    context: dict[str, Any] | None = None
    if model is not None:
        if kw.get("num_gpus") is None:
            raise UserInputError("--model needs --gpus (the cluster of #K and degree plans)")
        context = {"model": model, "cluster": cluster_request(kw).model_dump(exclude_none=True),
                   "job": job_spec(kw).model_dump()}
    requests: list[dict[str, Any]] = []
    searched: Any = None
    for text in plans:
        path, _, k = text.partition("#") if not text.startswith("#") else ("", "", text[1:])
        if path and Path(path).expanduser().is_file():
            idx = int(k) if k.isdigit() and int(k) >= 1 else (1 if not k else None)
            if idx is None:
                raise UserInputError(f"plan {text!r:.80}: #{k} must be a plan number from 1")
            requests.append({**_estimate_of(str(Path(path).expanduser()), idx), "failures": failures})
            continue
        if path and "=" not in text and not text.startswith("#"):  # neither #K nor degrees: a file is meant
            raise UserInputError(_not_a_plan(text))
        if context is None:
            raise UserInputError(f"plan {text!r:.80} is not a file; #K and degree plans need --model and --gpus")
        m = _INDEX.match(text) if text.startswith("#") else None
        if text.startswith("#") and not m:
            raise UserInputError(f"plan {text!r:.80}: #K takes a plan number of the search, 1..50")
        if m:
            k_i = int(m.group(1))
            if k_i < 1 or k_i > 50:
                raise UserInputError(f"plan {text!r}: K must be in 1..50 (the search's plans are numbered from 1)")
            if searched is None or len(searched.plans) < k_i:
                searched = api.search({**context, "top": max(k_i, 3), "target": target, "failures": failures,
                                       "software": knobs})
            if k_i > len(searched.plans):
                raise UserInputError(f"plan {text!r}: the search found {len(searched.plans)} plan(s)")
            from autoplan.emit.plan import priced_software

            found = searched.plans[k_i - 1]
            requests.append({**context, "parallel": found.parallel.model_dump(exclude_none=True),
                             "failures": failures, "target": found.target,  # priced as the target that runs it
                             "software": priced_software(found.prediction.software).given()})  # its knobs
        else:
            requests.append({**context, "parallel": _degrees(text), "failures": failures, "software": knobs,
                             **({"target": target} if target != "any" else {})})
    if all(_is_file(text) for text in plans):  # flags no plan takes (files keep their own)
        # a file's plan keeps the target and knobs it was priced with
        unused = flags_given(("model", *PLAN_FILE_FIELDS, "target", *knobs))
        if unused:
            raise UserInputError(f"every PLAN is a file, which holds its model, cluster, job, target and knobs: "
                                 f"{', '.join(unused)} would be ignored; give them with #K or degree plans (tp=8,pp=4)")
    result = api.compare({"plans": requests, "rank_by": rank_by}, labels=list(plans))
    if fmt == "json":
        click.echo(json.dumps(result.model_dump(mode="json"), indent=2))
        return
    click.echo(render_compare(result))


def render_compare(result: Any) -> str:
    from autoplan.report import describe_parallel
    from search.explain import PART_NAMES, step_parts

    order = result.ranking
    ests = [result.plans[i] for i in order]
    # rank, then where the plan came from ("search #2": a bare "#2" next to the rank "#1" read as two ranks)
    headers = ["", *[f"#{n + 1} " + ("search " if result.labels[i].startswith("#") else "") + result.labels[i]
                     for n, i in enumerate(order)]]
    rows: list[list[object]] = []

    def row(name: str, values: list[object]) -> None:
        rows.append([name, *values])

    row("model / GPUs", [f"{e.model.name} / {e.cluster.num_gpus} {e.cluster.gpu}" for e in ests])
    row("batch x seq", [f"{e.job.global_batch_size} x {e.job.seq_len}" for e in ests])
    row("layout", [describe_parallel(e.parallel, e.prediction.dp) for e in ests])
    row("step time s", [f"{e.prediction.step_time_s:.3f}" for e in ests])
    row("tokens/s", [f"{e.prediction.tokens_per_s:,.0f}" for e in ests])
    row("MFU", [f"{e.prediction.mfu * 100:.1f}%" for e in ests])
    row("goodput", [f"{e.goodput.goodput * 100:.1f}%" if e.goodput else "-" for e in ests])
    row("tokens/s after failures", [f"{e.goodput.tokens_per_s:,.0f}" if e.goodput else "-" for e in ests])
    row("checkpoint every", [f"{e.goodput.interval_steps} steps" if e.goodput else "-" for e in ests])
    parts = [step_parts(e.prediction) for e in ests]
    for k in parts[0]:
        if any(p[k] > 0 for p in parts):
            row(f"  {PART_NAMES[k]} s", [f"{p[k]:.3f}" for p in parts])
    row("peak memory GiB", [f"{e.prediction.peak_memory_gib:.1f} / {e.prediction.memory_limit_gib:.0f}"
                            + ("" if e.prediction.fits else " OVER") for e in ests])
    for k in ("weights", "grads", "optimizer", "activations", "transients", "overhead"):
        if any(e.prediction.memory_gib.get(k, 0) > 0 for e in ests):
            row(f"  {k} GiB", [f"{e.prediction.memory_gib.get(k, 0.0):.1f}" for e in ests])
    lines = [render_table(headers, rows, text_columns=len(headers)), "", "why:"]
    lines += [f"  {d}" for d in result.differences]
    return "\n".join(lines)
