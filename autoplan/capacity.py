"""Capacity planning: the best plan per GPU count over a sweep (``autoplan scale``), as request and response
models (part of ``autoplan schema``) and the function the CLI, the Python API and ``serve`` call.

Strong scaling keeps the global batch; weak scaling grows it with the GPU count, either from
``tokens_per_gpu`` (``global_batch = N·tokens_per_gpu / seq_len``, rounded down) or, with ``scaling: weak``
alone, in proportion to the smallest size's batch. Scaling efficiency is tokens/s per GPU against the smallest
size that has a plan. Time and GPU-hours to train ``train_tokens`` use the tokens/s after failures (goodput).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Literal

from pydantic import Field, field_validator, model_validator

from autoplan import __version__
from autoplan.errors import ConfigError, InfeasibleError, UserInputError
from autoplan.inputs import json_type
from autoplan.request import ClusterRequest, MemoryHeadroom
from autoplan.schema import (MAX_ID_CHARS, MAX_NUM_GPUS, MODEL_DESCRIPTION, ClusterRecord, JobRequest, ModelRecord,
                             ModelSource, ParallelPins, Plan, RankBy, Status, Target, _Strict, validate_request)
from cost_models.errors import repeated_error
from cost_models.goodput import FailureModel
from cost_models.specs import JobSpec
from cost_models.targets import PROFILES, Software

if TYPE_CHECKING:
    from autoplan.api import Engine

MAX_SIZES = 32


class ClusterShape(_Strict):
    """A cluster without its size (``scale`` sweeps ``gpus``)."""

    gpu: str = Field(default="h100-sxm", description="GPU catalog name (see `autoplan hardware`)")
    gpus_per_node: int | None = Field(default=None, gt=0, description="None: the GPU catalog's")
    inter_node_gbps: float | None = Field(default=None, gt=0, description="per GPU, Gbit/s; None: catalog NIC")
    nvlink_domain_size: int | None = Field(default=None, gt=0, description="None: the GPU catalog's")
    profile: str | None = Field(default=None, description="cluster profile YAML from `autoplan calibrate`")
    memory_headroom: MemoryHeadroom | None = ClusterRequest.model_fields["memory_headroom"]
    """HBM every plan keeps free, as ``ClusterRequest``'s (was missing: ``scale --memory-headroom`` was dropped)."""
    efficiency: dict[str, Any] | None = ClusterRequest.model_fields["efficiency"]

    def efficiency_fields(self) -> dict[str, Any] | None:
        """As ``ClusterRequest.efficiency_fields`` (what the response records)."""
        return self.at(1).efficiency_fields()

    def at(self, num_gpus: int) -> ClusterRequest:
        return ClusterRequest(num_gpus=num_gpus, **self.model_dump())


class ScaleRequest(_Strict):
    """The best plan at each GPU count of a sweep."""

    kind: Literal["scale"] = "scale"
    id: str | None = Field(default=None, max_length=MAX_ID_CHARS)
    model: ModelSource = Field(description=MODEL_DESCRIPTION, examples=["llama3-8b"])
    cluster: ClusterShape = Field(default_factory=ClusterShape)
    gpus: list[int] = Field(min_length=1, max_length=MAX_SIZES, description="GPU counts to plan for")
    job: JobRequest = Field(default_factory=JobRequest, description="the job (weak scaling: at the smallest size)")
    scaling: Literal["strong", "weak"] = Field(default="strong", description="strong: fixed global batch")
    tokens_per_gpu: int | None = Field(default=None, gt=0, le=1 << 30,
                                       description="weak scaling: tokens per GPU per step (sets the batch)")
    train_tokens: float | None = Field(default=None, gt=0, le=1e18, description="tokens to train, for time/cost")
    gpu_hour_price: float | None = Field(default=None, ge=0, le=1e6, description="price of one GPU-hour")
    parallel: ParallelPins = Field(default_factory=ParallelPins, description="degrees to pin at every size")
    target: Target = "megatron"
    software: Software = Field(default_factory=Software, description="the target's knobs at every size, as in "
                               "search (omitted: its defaults; the search chooses the searched ones)")
    rank_by: RankBy = "step"
    failures: FailureModel = Field(default_factory=FailureModel)

    @field_validator("gpus")
    @classmethod
    def _sizes(cls, v: list[int]) -> list[int]:
        bad = [n for n in v if not 0 < n <= MAX_NUM_GPUS]
        if bad:
            raise ValueError(f"GPU counts must be in 1..{MAX_NUM_GPUS}, got {bad[0]}")
        if (err := repeated_error(v, "GPU count")) is not None:  # the one rule for lists: a repeat is a slip
            raise ValueError(err)
        return sorted(v)

    @model_validator(mode="after")
    def _price_needs_tokens(self) -> "ScaleRequest":
        if self.gpu_hour_price is not None and self.train_tokens is None:  # the cost is GPU-hours to train x price
            raise ValueError(f"gpu_hour_price={self.gpu_hour_price:g} prices the GPU-hours to train, which need "
                             "train_tokens (--train-tokens, e.g. 15T); give both or neither")
        return self

    @model_validator(mode="after")
    def _one_batch_source(self) -> "ScaleRequest":
        if self.tokens_per_gpu is not None and "global_batch_size" in self.job.model_fields_set:
            raise ValueError(f"tokens_per_gpu={self.tokens_per_gpu} sets the global batch at each size (GPUs x "
                             f"tokens_per_gpu / seq_len), so job.global_batch_size={self.job.global_batch_size} "
                             "would be ignored; give one or the other")
        return self

    def jobs(self) -> list[tuple[int, JobSpec]]:
        """(GPU count, job) of every size."""
        base = self.job.spec()
        n0 = self.gpus[0]
        out = []
        for n in self.gpus:
            if self.tokens_per_gpu is not None:
                gbs = n * self.tokens_per_gpu // base.seq_len
            elif self.scaling == "weak":
                gbs = base.global_batch_size * n // n0
            else:
                gbs = base.global_batch_size
            if gbs < 1:
                raise UserInputError(f"tokens_per_gpu={self.tokens_per_gpu} x {n} GPUs is less than one sequence of "
                                     f"seq_len={base.seq_len}; smallest valid: {-(-base.seq_len // n)}")
            out.append((n, base.model_copy(update={"global_batch_size": gbs})))
        return out


class ScaleRow(_Strict):
    num_gpus: int
    global_batch_size: int
    status: Status
    message: str | None = Field(default=None, description="why there is no plan (one line)")
    hint: str | None = None
    layout: str | None = Field(default=None, description="the best plan's degrees, e.g. 'tp4 pp4 cp1 zero1'")
    layout_changed: bool = Field(default=False, description="the best layout differs from the previous size's")
    tokens_per_s: float | None = None
    tokens_per_s_per_gpu: float | None = None
    mfu: float | None = None
    step_time_s: float | None = None
    peak_memory_gib: float | None = None
    scaling_efficiency: float | None = Field(default=None, description="tokens/s per GPU vs the smallest size")
    goodput: float | None = Field(default=None, description="share of wall time that is progress")
    goodput_tokens_per_s: float | None = None
    train_days: float | None = Field(default=None, description="wall days for train_tokens, after failures")
    gpu_hours: float | None = None
    cost: float | None = Field(default=None, description="gpu_hours x gpu_hour_price")
    plan: Plan | None = None


class ScaleResult(_Strict):
    """The ``scale`` response: one row per GPU count, smallest first."""

    version: str = Field(default=__version__)
    model: ModelRecord
    cluster: ClusterRecord = Field(description="the smallest size's cluster")
    scaling: Literal["strong", "weak"]
    train_tokens: float | None
    gpu_hour_price: float | None
    rows: list[ScaleRow]
    wall_time_s: float


def layout_label(p: Plan, with_target: bool = False) -> str:
    """'tp4 pp4 cp1 zero1'; ``with_target`` (``--target any``): '[torchtitan] tp2 ...', the framework that runs it."""
    par = p.parallel
    parts = ([f"[{p.target}]"] if with_target and p.target else []) + [f"tp{par.tp}", f"pp{par.pp}", f"cp{par.cp}"]
    if par.ep > 1:
        parts.append(f"ep{par.ep}")
    if par.vp > 1:
        parts.append(f"vp{par.vp}")
    parts.append(f"zero{par.zero_stage}")
    if par.recompute != "none":
        parts.append(f"rc-{par.recompute}")
    return " ".join(parts)


def scale(engine: Engine, req: ScaleRequest, progress: Callable[[int, int], None] | None = None,
          processes: int = 1) -> ScaleResult:
    """Run a sweep (``search.sweep``; ``processes`` > 1 forks, for single-threaded callers) and tabulate it."""
    import time

    from autoplan.api import _cluster_record, _model_record, classify, search_targets
    from search.score import Scorer
    from search.sweep import sweep

    t0 = time.perf_counter()
    jobs = req.jobs()
    first = engine.resolve_parts(req.model, req.cluster.at(jobs[0][0]), jobs[0][1], req.target)
    model, cluster0 = first.model, first.cluster
    family: dict[str, Scorer] = {}
    first: ConfigError | None = None
    for t in search_targets(req.target):  # each target on the cluster as it runs on it (any: every target)
        try:  # a knob the target lacks: error (any: that target is left out, as search leaves it)
            PROFILES[t].resolve(req.software, jobs[0][1], cluster0)
        except ConfigError as err:
            first = first or err
            continue
        own = engine.resolve_parts(req.model, req.cluster.at(jobs[0][0]), jobs[0][1], t).cluster

        def base(own: Any = own) -> Scorer:
            return Scorer(model, own, jobs[0][1], software=req.software)
        family[t] = engine.scorer_family(req.model, req.cluster, jobs[0][1], base, t, req.software)
    if not family:
        assert first is not None
        raise first if req.target != "any" else ConfigError(f"no target runs the knobs {req.software.given()} "
                                                             f"({first})")
    points = sweep(model, cluster0, jobs, target=req.target, pins=req.parallel.given(), top_k=1,
                   rank_by=req.rank_by, failures=req.failures, scorer=family, progress=progress,
                   processes=processes)
    rows: list[ScaleRow] = []
    ref: float | None = None
    prev: str | None = None
    for pt in points:
        if pt.result is None or not pt.result.plans:
            err = pt.error or InfeasibleError("no plan")
            status, message = classify(err)
            rows.append(ScaleRow(num_gpus=pt.num_gpus, global_batch_size=pt.job.global_batch_size, status=status,
                                 message=message, hint=getattr(err, "hint", None)))
            continue
        p, g = pt.result.plans[0], pt.goodputs[0]
        plan = Plan.model_validate({**p.model_dump(), "goodput": g})
        pred = p.prediction
        ref = ref or pred.tokens_per_s_per_gpu
        label = layout_label(plan, with_target=req.target == "any")
        days = gpu_hours = cost = None
        if req.train_tokens is not None:
            hours = req.train_tokens / g.tokens_per_s / 3600.0
            days, gpu_hours = hours / 24.0, hours * pt.num_gpus
            cost = gpu_hours * req.gpu_hour_price if req.gpu_hour_price is not None else None
        rows.append(ScaleRow(
            num_gpus=pt.num_gpus, global_batch_size=pt.job.global_batch_size, status="ok", layout=label,
            layout_changed=prev is not None and label != prev, tokens_per_s=pred.tokens_per_s,
            tokens_per_s_per_gpu=pred.tokens_per_s_per_gpu, mfu=pred.mfu, step_time_s=pred.step_time_s,
            peak_memory_gib=pred.peak_memory_gib, scaling_efficiency=pred.tokens_per_s_per_gpu / ref,
            goodput=g.goodput, goodput_tokens_per_s=g.tokens_per_s, train_days=days, gpu_hours=gpu_hours, cost=cost,
            plan=plan))
        prev = label
    last = rows[-1] if rows else None
    if last is not None and last.status == "infeasible" and last.hint is None and not any(
            r.status == "ok" for r in rows):  # no size has a plan: say where one starts, as search does
        from search.planner import smallest_feasible_gpus

        size = cluster0.model_copy(update={"num_gpus": last.num_gpus})
        n = smallest_feasible_gpus(model, size, points[-1].job, req.parallel.given(), family)
        rows[-1] = last.model_copy(update={"hint": f"smallest {size.gpu.name} cluster with a plan: {n} GPUs" if n else
                                           "no cluster of this GPU up to 65536 GPUs has a plan at this batch size "
                                           "and sequence length"})
    return ScaleResult(model=_model_record(model), cluster=_cluster_record(cluster0, req), scaling=(
        "weak" if req.tokens_per_gpu is not None else req.scaling), train_tokens=req.train_tokens,
        gpu_hour_price=req.gpu_hour_price, rows=rows, wall_time_s=time.perf_counter() - t0)


def parse_gpus(text: str) -> list[int]:
    """``64,128,256`` or ``64..8192`` (powers of two from the first to the last) or a mix of both."""
    out: list[int] = []
    for part in text.split(","):
        part = part.strip()
        try:
            if ".." in part:
                lo_s, hi_s = part.split("..", 1)
                lo, hi = int(lo_s), int(hi_s)
                if lo <= 0:
                    raise UserInputError(f"--gpus {text!r:.60}: a range starts at a positive GPU count, not {lo}")
                if lo > hi:
                    raise UserInputError(f"--gpus {text!r:.60}: the range {lo}..{hi} runs downwards; valid: {hi}..{lo}")
                n = lo
                while n <= hi:
                    out.append(n)
                    n *= 2
                    if len(out) > MAX_SIZES:
                        break
            else:
                out.append(int(part))
        except UserInputError:
            raise
        except ValueError:
            raise UserInputError(f"--gpus {text!r:.60}: expected a list like 256,512,1024 or a range like "
                                 "64..8192 (powers of two)") from None
    if len(out) > MAX_SIZES:
        raise UserInputError(f"--gpus {text!r:.60} makes more than {MAX_SIZES} sizes")
    if (err := repeated_error(out, "GPU count")) is not None:  # e.g. 8,8 or 64..256,128 (the range holds 128)
        raise UserInputError(f"--gpus {text!r:.60}: {err}")
    return out


def as_scale_request(data: Any) -> ScaleRequest:
    if isinstance(data, ScaleRequest):
        return data
    if not isinstance(data, dict):
        raise UserInputError(f"a scale request must be a JSON object, got {json_type(data)}")
    kind = data.get("kind", "scale")
    if kind != "scale":
        raise UserInputError(f"request kind is {kind!r:.40}; a scale request has kind 'scale'")
    return validate_request(ScaleRequest, data)


__all__ = ["ClusterShape", "ConfigError", "ScaleRequest", "ScaleResult", "ScaleRow", "as_scale_request", "scale"]
