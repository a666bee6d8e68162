"""Capacity sweeps and goodput ranking on top of the planner (no printing; ``autoplan`` renders).

``sweep`` runs the planner once per GPU count. Every size shares one family of cached layer costs
(``Scorer.derive``: per-layer time and activations, parameters and in-flight counts do not depend on the GPU
count or the global batch), so a sweep of eight sizes costs little more than its largest search.

``rank_by_goodput`` re-ranks plans by their tokens/s after failures (``cost_models.goodput``). It stays exact
without touching the planner: the planner ranks by step time (the composite cost of a fitting plan), so a plan
it did not return is no faster than the slowest one it did, and its goodput is at most
``goodput_upper_bound``; the driver asks for more plans until the k-th best by goodput beats that bound.
"""

from __future__ import annotations

import multiprocessing as mp
import threading
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from typing import Any

from cost_models.errors import ConfigError, InfeasibleError
from cost_models.goodput import FailureModel, Goodput, goodput, goodput_upper_bound
from cost_models.specs import ClusterSpec, JobSpec, ModelSpec
from search.planner import PlannerResult, RankedPlan, search
from search.score import Scorer
from search.space import Target

MAX_GOODPUT_CANDIDATES = 256  # plans the goodput ranking may ask the planner for before it settles


@dataclass(frozen=True)
class SweepPoint:
    """One size of a sweep: the planner's result, or the error (bad input or infeasible) it raised."""

    num_gpus: int
    job: JobSpec
    result: PlannerResult | None = None
    goodputs: tuple[Goodput, ...] = ()
    error: ConfigError | InfeasibleError | None = None


def plan_goodput(model: ModelSpec, cluster: ClusterSpec, plan: RankedPlan, failures: FailureModel | None) -> Goodput:
    pred = plan.prediction
    return goodput(model, cluster, plan.parallel, pred.layers_per_stage, pred.step_time_s, pred.tokens_per_s,
                   failures)


def ranked_search(model: ModelSpec, cluster: ClusterSpec, job: JobSpec, *, target: Target = "megatron",
                  pins: dict[str, Any] | None = None, top_k: int = 3, rank_by: str = "step",
                  failures: FailureModel | None = None, scorer: Scorer | Mapping[str, Scorer] | None = None,
                  progress: Callable[[int, int], None] | None = None,
                  find_smallest_cluster: bool = True) -> tuple[PlannerResult, tuple[Goodput, ...]]:
    """The planner's search, ranked by step time or by goodput; each plan with its goodput."""
    def run(k: int) -> PlannerResult:
        return search(model, cluster, job, target=target, pins=pins, top_k=k, progress=progress, scorer=scorer,
                      find_smallest_cluster=find_smallest_cluster)

    if rank_by == "step":
        found = run(top_k)
        return found, tuple(plan_goodput(model, cluster, p, failures) for p in found.plans)
    if rank_by != "goodput":
        raise ConfigError(f"rank_by must be step or goodput, got {rank_by!r}", valid=["step", "goodput"])
    bound = goodput_upper_bound(model, cluster, failures)
    k = 2 * top_k + 4
    while True:
        found = run(k)
        scored = sorted(((plan_goodput(model, cluster, p, failures), p) for p in found.plans),
                        key=lambda x: (-x[0].tokens_per_s, x[1].rank))
        exhausted = len(found.plans) < k or k >= MAX_GOODPUT_CANDIDATES
        # Any plan not returned is no faster than the slowest returned one, and keeps at most `bound` of it.
        unseen = found.plans[-1].prediction.tokens_per_s * bound
        if exhausted or scored[min(top_k, len(scored)) - 1][0].tokens_per_s >= unseen:
            break
        k = min(2 * k, MAX_GOODPUT_CANDIDATES)
    kept = scored[:top_k]
    plans = [p.model_copy(update={"rank": i + 1, "explanation": f"#{i + 1} by goodput, #{p.rank} by step time. "
                                                                  + p.explanation})
             for i, (_, p) in enumerate(kept)]
    return found.model_copy(update={"plans": plans}), tuple(g for g, _ in kept)


def sweep(model: ModelSpec, cluster: ClusterSpec, jobs: Sequence[tuple[int, JobSpec]], *,
          target: Target = "megatron", pins: dict[str, Any] | None = None, top_k: int = 1, rank_by: str = "step",
          failures: FailureModel | None = None, scorer: Scorer | Mapping[str, Scorer] | None = None,
          progress: Callable[[int, int], None] | None = None, processes: int = 1) -> list[SweepPoint]:
    """The best plans at each ``(num_gpus, job)``; ``scorer``: a cached one of this model/GPU/network to
    derive every size's from (else one is made). Errors are kept per size, never raised.

    ``processes > 1`` plans the sizes in that many forked processes (each starts from the caches held at the
    fork). The results are the same. ``fork`` with live threads is unsafe, so a process with more than one
    thread (a server, a test runner that started some) plans in itself, as it does where ``fork`` does not exist."""
    scorer = scorer or Scorer(model, cluster, jobs[0][1]) if jobs else scorer
    kw = dict(target=target, pins=pins, top_k=top_k, rank_by=rank_by, failures=failures)
    if (processes > 1 and len(jobs) > 1 and progress is None and "fork" in mp.get_all_start_methods()
            and threading.active_count() == 1):  # fork only a single-threaded process (else: plan in this one)
        global _FORKED
        _FORKED = (model, cluster, scorer, kw)
        try:
            ctx = mp.get_context("fork")
            with ProcessPoolExecutor(min(processes, len(jobs)), mp_context=ctx) as pool:
                # Largest jobs (fewest GPUs: most micro-batches) first, so the pool stays busy to the end.
                order = sorted(range(len(jobs)), key=lambda i: jobs[i][0])
                done = dict(zip(order, pool.map(_forked_point, [jobs[i] for i in order])))
        finally:
            _FORKED = None
        return [_unpack(done[i]) for i in range(len(jobs))]
    return [_point(model, cluster, scorer, n, job, progress=progress, **kw) for n, job in jobs]


def _point(model: ModelSpec, cluster: ClusterSpec, scorer: Scorer | Mapping[str, Scorer] | None, n: int, job: JobSpec,
           **kw: Any) -> SweepPoint:
    size = cluster.model_copy(update={"num_gpus": n})
    try:
        ClusterSpec.model_validate(size.model_dump())  # the cross-field checks (whole nodes)
        sc: Scorer | dict[str, Scorer] = (
            Scorer(model, size, job) if scorer is None else
            {t: s.derive(s.cluster.model_copy(update={"num_gpus": n}), job) for t, s in scorer.items()}
            if isinstance(scorer, Mapping) else scorer.derive(size, job))  # any: each target on its own cluster
        found, goods = ranked_search(model, size, job, scorer=sc, find_smallest_cluster=False, **kw)
    except (ConfigError, InfeasibleError) as err:
        return SweepPoint(n, job, error=err)
    except ValueError as err:  # a cluster size that breaks a cross-field rule (e.g. not whole nodes)
        errors = getattr(err, "errors", None)
        text = errors()[0]["msg"].removeprefix("Value error, ") if callable(errors) else str(err)
        return SweepPoint(n, job, error=ConfigError(' '.join(text.split())))
    return SweepPoint(n, job, result=found, goodputs=goods)


_FORKED: tuple[Any, ...] | None = None  # (model, cluster, scorer, kw) for forked workers, set before the fork


def _forked_point(item: tuple[int, JobSpec]) -> tuple[Any, ...]:
    """A size in a forked worker; errors travel as (kind, message, hint): exceptions with keyword-only
    fields do not survive pickling."""
    assert _FORKED is not None
    model, cluster, scorer, kw = _FORKED
    pt = _point(model, cluster, scorer, item[0], item[1], **kw)
    err = pt.error
    packed = None if err is None else (type(err) is InfeasibleError, str(err.args[0]) if err.args else str(err),
                                       getattr(err, "hint", None), getattr(err, "valid", None))
    return pt.num_gpus, pt.job, pt.result, pt.goodputs, packed


def _unpack(data: tuple[Any, ...]) -> SweepPoint:
    n, job, result, goods, packed = data
    if packed is None:
        return SweepPoint(n, job, result=result, goodputs=goods)
    infeasible, message, hint, valid = packed
    if infeasible:
        return SweepPoint(n, job, error=InfeasibleError(message.removesuffix(f". {hint}") if hint else message,
                                                        hint=hint))
    err = ConfigError(message)
    err.valid = valid
    return SweepPoint(n, job, error=err)
