"""Reference search: every layout of ``search.space`` × every layer split ``ParallelConfig`` can express,
each scored by ``cost_models.estimate.estimate``. Slow by design (it is what the planner must equal); the
tests run it on small spaces and ``benchmarks/search_speed.py`` times it (or extrapolates it)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from cost_models.errors import ConfigError
from cost_models.estimate import CostWeights, Prediction, estimate
from cost_models.specs import ClusterSpec, JobSpec, ModelSpec, ParallelConfig
from search.space import Layout, Tally, Target, enumerate_layouts


def expressible_splits(n_layers: int, pp: int) -> Iterator[tuple[int, int] | None]:
    """(first_stage_layers, last_stage_layers) pairs with ≥ 1 layer each and an even middle; None = default."""
    yield None
    if pp == 1:
        return
    for first in range(1, n_layers):
        for last in range(1, n_layers - first + 1):
            rest = n_layers - first - last
            if (pp == 2 and rest == 0) or (pp > 2 and rest > 0 and rest % (pp - 2) == 0):
                yield first, last


@dataclass(frozen=True)
class ExhaustiveBest:
    parallel: ParallelConfig
    prediction: Prediction
    points: int  # (layout, split) pairs scored


def exhaustive_points(model: ModelSpec, cluster: ClusterSpec, job: JobSpec, target: Target = "megatron",
                      pins: dict[str, Any] | None = None) -> Iterator[tuple[Layout, ParallelConfig]]:
    pins = dict(pins or {})
    for lay in enumerate_layouts(model, cluster, job, target, pins, Tally()):
        splits = [None] if lay.vp > 1 else list(expressible_splits(model.num_layers, lay.pp))
        for sp in splits:
            if sp is None:
                yield lay, ParallelConfig(**lay.parallel_kwargs())
            else:
                yield lay, ParallelConfig(**lay.parallel_kwargs(), first_stage_layers=sp[0], last_stage_layers=sp[1])


def exhaustive_search(model: ModelSpec, cluster: ClusterSpec, job: JobSpec, target: Target = "megatron",
                      pins: dict[str, Any] | None = None, weights: CostWeights | None = None,
                      max_points: int | None = None) -> ExhaustiveBest | None:
    """The least composite cost among fitting (layout, split) points; None if none fits."""
    best: tuple[float, tuple[Any, ...], ParallelConfig, Prediction] | None = None
    n = 0
    for lay, par in exhaustive_points(model, cluster, job, target, pins):
        if max_points is not None and n >= max_points:
            break
        n += 1
        try:
            pred = estimate(model, cluster, job, par, weights, target=None if target == "any" else target)
        except ConfigError:
            continue
        if not pred.fits:
            continue
        key = (pred.composite_cost, lay.sort_key())
        if best is None or key < best[:2]:
            best = (pred.composite_cost, lay.sort_key(), par, pred)
    return ExhaustiveBest(best[2], best[3], n) if best else None
