"""Several plans side by side (``autoplan compare``): each one's prediction and goodput, ranked, with the
differences that explain each gap (``search.explain``, computed from the two breakdowns).

A comparison is a list of estimate requests (each with its own model, cluster, job and layout), so plans of
different jobs or cluster sizes can stand side by side; the explanation then also names those differences."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal

from pydantic import Field

from autoplan import __version__
from autoplan.errors import UserInputError
from autoplan.inputs import json_type
from autoplan.schema import Estimate, EstimateRequest, RankBy, _Strict, validate_request

if TYPE_CHECKING:
    from autoplan.api import Engine

MAX_PLANS = 8


class CompareRequest(_Strict):
    kind: Literal["compare"] = "compare"
    id: str | None = Field(default=None, max_length=256)
    plans: list[EstimateRequest] = Field(min_length=2, max_length=MAX_PLANS, description="the plans, as estimates")
    rank_by: RankBy = Field(default="step", description="order by step time or by tokens/s after failures")


class CompareResult(_Strict):
    version: str = __version__
    plans: list[Estimate] = Field(description="in the order given")
    labels: list[str] = Field(description="where each plan came from (as given)")
    ranking: list[int] = Field(description="indices into plans, best first")
    rank_by: RankBy
    differences: list[str] = Field(description="for each plan after the best (ranking order): why the best wins")


def _throughput(e: Estimate, rank_by: str) -> float:
    if rank_by == "goodput" and e.goodput is not None:
        return e.goodput.tokens_per_s
    return e.prediction.tokens_per_s


def compare(engine: Engine, req: CompareRequest, labels: list[str] | None = None) -> CompareResult:
    from search.explain import explain

    labels = labels or [f"plan {i + 1}" for i in range(len(req.plans))]
    if len(labels) != len(req.plans):
        raise UserInputError(f"{len(labels)} labels for {len(req.plans)} plans")
    ests = [engine.estimate(p) for p in req.plans]
    # Plans that fit in memory first (as search ranks only those), then by throughput (tokens/s: plans of
    # different jobs compare by it); ties keep the order given.
    ranking = sorted(range(len(ests)),
                     key=lambda i: (not ests[i].prediction.fits, -_throughput(ests[i], req.rank_by), i))
    best = ests[ranking[0]]
    cluster = engine.resolve(req.plans[ranking[0]]).cluster
    diffs = []
    # none fits: the ranking is by throughput alone, and each explanation says so first
    none_fits = "" if best.prediction.fits else (
        f"No plan fits in memory ({labels[ranking[0]]}: {best.prediction.peak_memory_gib:.1f} GiB per GPU, limit "
        f"{best.prediction.memory_limit_gib:.1f}); by throughput alone, ")
    after_failures = " after failures" if req.rank_by == "goodput" else ""
    for i in ranking[1:]:
        e = ests[i]
        gap = 1 - _throughput(e, req.rank_by) / _throughput(best, req.rank_by)
        why = explain(best.parallel, best.prediction, e.parallel, e.prediction, cluster)
        why = why.replace("than the next plan", f"than {labels[i]}")
        jobs = _context_diff(best, e)
        if best.prediction.fits and not e.prediction.fits:
            text = (f"{labels[ranking[0]]} over {labels[i]}: {labels[i]} does not fit in memory "
                    f"({e.prediction.peak_memory_gib:.1f} GiB per GPU, limit {e.prediction.memory_limit_gib:.1f})"
                    + (f", though it would run {-gap:.1%} more tokens/s" if gap < 0 else
                       f" ({gap:.1%} fewer tokens/s{after_failures}): {why}"))
        else:
            text = f"{labels[ranking[0]]} over {labels[i]} ({gap:.1%} more tokens/s{after_failures}): {why}"
        text = none_fits + text
        if jobs:
            text += f" Also differ in {jobs}."
        if best.goodput is not None and e.goodput is not None and req.rank_by == "goodput":
            text += (f" Goodput {best.goodput.goodput:.1%} vs {e.goodput.goodput:.1%} (checkpoint "
                     f"{best.goodput.checkpoint_gib_per_rank:.2f} vs {e.goodput.checkpoint_gib_per_rank:.2f} GiB/rank).")
        diffs.append(text)
    return CompareResult(plans=ests, labels=labels, ranking=ranking, rank_by=req.rank_by, differences=diffs)


def _context_diff(a: Estimate, b: Estimate) -> str:
    out = []
    if a.model.name != b.model.name:
        out.append(f"model {a.model.name} vs {b.model.name}")
    for f in ("gpu", "num_gpus", "gpus_per_node", "inter_node_gbps", "nvlink_domain_size"):
        va, vb = getattr(a.cluster, f), getattr(b.cluster, f)
        if va != vb:
            out.append(f"{f} {va} vs {vb}")
    if (a.cluster.efficiency or {}) != (b.cluster.efficiency or {}):  # plan files found on different profiles
        # (None and {} both price on the catalog's efficiencies)
        out.append(f"efficiency {_efficiency(a)} vs {_efficiency(b)}")
    for f in ("global_batch_size", "seq_len", "precision"):
        va, vb = getattr(a.job, f), getattr(b.job, f)
        if va != vb:
            out.append(f"{f} {va} vs {vb}")
    return ", ".join(out)


def _efficiency(e: Estimate) -> str:
    """The efficiency fields a plan's cluster profile set, as ``k=v,...``; "the catalog's" without one."""
    fields = e.cluster.efficiency or {}
    return ",".join(f"{k}={v}" for k, v in sorted(fields.items())) or "the catalog's"


def as_compare_request(data: Any) -> CompareRequest:
    if isinstance(data, CompareRequest):
        return data
    if not isinstance(data, dict):
        raise UserInputError(f"a compare request must be a JSON object, got {json_type(data)}")
    data = dict(data)
    plans = data.get("plans")
    if isinstance(plans, list):
        data["plans"] = [{**p, "kind": p.get("kind", "estimate")} if isinstance(p, dict) else p for p in plans]
    return validate_request(CompareRequest, data)
