"""Reference search: every layout of ``search.space`` × every layer split ``ParallelConfig`` can express with
Megatron's split flags (and, for an interleaved layout of a target that takes explicit layouts, the balanced layouts
``pipeline_split.layout_candidates`` lists: the family the planner weighs, not every layout string) × every
legal setting of the knobs the target searches (``TargetProfile.knob_candidates``), each scored by
``cost_models.estimate.estimate``. Slow by design (it is what the planner must equal); the
tests run it on small spaces and ``benchmarks/search_speed.py`` times it (or extrapolates it)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from cost_models.errors import ConfigError
from cost_models.estimate import CostWeights, Prediction, estimate
from cost_models.pipeline_split import layout_candidates
from cost_models.specs import ClusterSpec, JobSpec, ModelSpec, ParallelConfig
from cost_models.targets import PROFILES, Software
from search.space import ANY_TARGETS, Layout, Tally, Target, enumerate_layouts, module_ladder_for


def expressible_splits(n_layers: int, pp: int, vp: int = 1) -> Iterator[tuple[int | None, int | None] | None]:
    """(first_stage_layers, last_stage_layers) pairs ``ParallelConfig`` can state; None = default. With vp = 1:
    both given, ≥ 1 layer each and an even middle. With vp > 1 (Megatron's uneven interleaved pipelines): every
    first and/or last count — a superset; ``estimate`` refuses those megatron-core cannot build."""
    yield None
    if pp == 1:
        return
    if vp > 1:
        for n in range(1, n_layers):
            yield n, None
            yield None, n
    for first in range(1, n_layers):
        for last in range(1, n_layers - first + 1):
            rest = n_layers - first - last
            if vp > 1 or (pp == 2 and rest == 0) or (pp > 2 and rest > 0 and rest % (pp - 2) == 0):
                yield first, last


def expressible_split_fields(n_layers: int, pp: int, vp: int = 1) -> Iterator[dict[str, Any]]:
    """Every pipeline-split statement ``ParallelConfig`` can make for (pp, vp): first/last counts
    (:func:`expressible_splits`) and, with pp > 1, Megatron's embedding/loss accounting flags — each combination
    once; ``estimate`` refuses the ones megatron-core cannot build (e.g. flags together with counts)."""
    flags = [(False, False)] if pp == 1 else [(e, lo) for e in (False, True) for lo in (False, True)]
    for sp in expressible_splits(n_layers, pp, vp):
        for emb, loss in flags:
            fields: dict[str, Any] = {"account_for_embedding_in_pipeline_split": emb,
                                      "account_for_loss_in_pipeline_split": loss}
            if sp is not None:
                fields.update(first_stage_layers=sp[0], last_stage_layers=sp[1])
            yield fields


@dataclass(frozen=True)
class ExhaustiveBest:
    parallel: ParallelConfig
    prediction: Prediction
    points: int  # (layout, split) pairs scored


def exhaustive_points(model: ModelSpec, cluster: ClusterSpec, job: JobSpec, target: Target = "megatron",
                      pins: dict[str, Any] | None = None) -> Iterator[tuple[Layout, ParallelConfig]]:
    pins = dict(pins or {})
    ladders = {t: module_ladder_for(model, cluster, job, t) for t in (ANY_TARGETS if target == "any" else (target,))}
    for lay in enumerate_layouts(model, cluster, job, target, pins, Tally(), ladders):
        for fields in expressible_split_fields(model.num_layers, lay.pp, lay.vp):
            yield lay, ParallelConfig(**{**lay.parallel_kwargs(), **fields})
        prof = PROFILES.get(lay.target)
        if lay.vp > 1 and prof is not None and prof.searches_pipeline_layouts:  # the explicit layouts it weighs
            for sp in layout_candidates(model.num_layers, lay.pp, lay.vp, model.arch.mtp_layers):
                yield lay, ParallelConfig(**{**lay.parallel_kwargs(), "pipeline_layout": sp.layout.text})


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
        for sw in knob_settings(model, cluster, job, lay, par):
            try:
                pred = estimate(model, cluster, job, par, weights, target=lay.target,  # any: each layout's own
                                software=sw)
            except ConfigError:
                continue
            if not pred.fits:
                continue
            key = (pred.composite_cost, lay.sort_key())
            if best is None or key < best[:2]:
                best = (pred.composite_cost, lay.sort_key(), par, pred)
    return ExhaustiveBest(best[2], best[3], n) if best else None


def knob_settings(model: ModelSpec, cluster: ClusterSpec, job: JobSpec, lay: Layout,
                  par: ParallelConfig) -> list[Software]:
    """Every legal setting of the knobs the target's profile searches on this layout (none set by a user here),
    the default first: the layout knobs (``TargetProfile.layout_knob_options``) × the layer-time knobs
    (``TargetProfile.knob_candidates``); just the defaults where there is nothing to choose (estimate refuses the
    illegal ones)."""
    prof = PROFILES.get(lay.target)
    if prof is None:
        return [Software()]
    cands = prof.knob_candidates(model, cluster, job, par, None) or [{}]
    return [Software(**mem, **c) for mem in prof.layout_knob_options(cluster, job, par, {}) for c in cands]
