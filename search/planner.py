"""The outer search: enumerate layouts, prune, split layers into stages, rank, explain.

1. ``search.space.enumerate_layouts`` lists every layout that passes the hard constraints (tallying why
   the others were cut).
2. Each layout whose model state fits (``Scorer.state_lower_bound``) gets a cheap lower bound on its step time
   (perfectly balanced stages; nothing but the pipeline and its fill).
3. Layouts are visited in order of their time bound (branch and bound). A visited layout's peak memory is bounded
   first (``Scorer.memory_lower_bound``: over the limit, it is cut, tally ``memory_lower_bound``); layouts past the
   stop are never bounded (tally ``bound``): the memory bound of every layout cost more than the rest of the search
   (deepseek-v3 on 2048 H800s: 135,300 layouts, about 2,600 visited). Then the stage DP
   (``search.inter_op.best_split``) chooses the layer split under the memory limit and ``Scorer.score``
   prices it exactly as ``estimate`` would; the visit stops once a bound reaches the ``keep``-th best cost.
   Before a layout's intra-op ILP is solved, its split priced on the cost floors (``Scorer.tables(lower=True)``,
   ``_split_lower_bound``) may already reach that cost: the layout is skipped unsolved (tally ``split_bound``).
   A selective layout is not skipped because a smaller set of Megatron's recompute modules fits on the same layout:
   the larger set is slower, yet may still be a finalist (deepseek-v3 on 1024 H100s: plans #2 and #3 are one layout
   with the module ladder's third and fourth sets), and under the stage DP (pp > 1, vp = 1) its split, chosen by the
   DP's objective, is not the subset's. A floor on the superset's cost from the subset's own tables (its split-free
   pipeline optimum plus the fill: sound where every stage's time grows with the modules) was tried; on deepseek-v3
   and qwen3-235b-a22b (1024 GPUs) it cut only what ``split_bound`` cuts (the subsets the search splits seldom fit,
   so their supersets are the layouts it visits), and was left out.
4. Finalists are re-scored with ``cost_models.estimate.estimate`` — what users see — and ranked by the
   composite cost, ties broken by ``Layout.sort_key`` (simpler layouts first).

Each decoder layer kind is priced by the intra-op ILP on the layout's stage mesh (``Scorer.layer_solution``,
cached per (kind, mesh, mbs, recompute, target)); every plan carries the per-op shardings it chose
(``RankedPlan.op_shardings``) and the result counts the ILP solves this search ran (``ilp_solves``, cache hits apart).

``search`` never prints; progress goes to an optional callback ``progress(done, total)``.
"""

from __future__ import annotations

import bisect
import math
import re
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from itertools import islice
from typing import Any

import numpy as np
from pydantic import BaseModel, ConfigDict

from cost_models.errors import ConfigError, InfeasibleError, divisors
from cost_models.estimate import CostWeights, Prediction, dp_exposed_s, estimate
from cost_models.specs import ClusterSpec, JobSpec, ModelSpec, ParallelConfig, interleave_pp_error, vp_schedule_error
from cost_models.pipeline import pipeline_time_s
from cost_models.pipeline_split import PipelineSplit, candidates, layout_candidates
from cost_models.targets import PROFILES, get_profile, runtime_for
from cost_models.validate import check_precision, nvlink_tp_refusal, stage_layers, with_explicit_split
from search.explain import explain, knob_choice
from search.inter_op import StageTables, best_split, chunked_costs, stage_costs
from search.score import Scorer, default_split_layers, schedule_alpha, split_fields
from search.space import (ANY_TARGETS, MAX_LAYOUT_VP, MIN_CP_TOKENS, Layout, Tally, Target, enumerate_layouts,
                          interleavable_vp, pinnable_vps, tp_choices, zero_choices)

Progress = Callable[[int, int], None]
SPLIT_PINS = ("first_stage_layers", "last_stage_layers", "account_for_embedding_in_pipeline_split",
              "account_for_loss_in_pipeline_split")
CLOSEST_CANDIDATES = 32  # layouts (lowest memory bounds) priced exactly to name the closest miss
NEAREST_PROBES = 512  # GPU counts tried each way for the nearest one with a layout (an infeasible-by-shape job)


class RankedPlan(BaseModel):
    """One plan as the planner ranks it (``autoplan.schema.Plan`` is what the API publishes, goodput added)."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    rank: int
    parallel: ParallelConfig
    prediction: Prediction
    explanation: str
    op_shardings: dict[str, dict[str, str]]  # decoder layer kind → op → tp mode the intra-op ILP chose
    target: str = "megatron"  # the framework that runs it, priced with its runtime and efficiency (emit writes it)


class PlannerResult(BaseModel):
    """What ``search`` returns (``autoplan.schema.SearchResult`` is the published response built from it)."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    plans: list[RankedPlan]
    candidates: int  # layouts that passed the structural checks
    evaluated: int  # layouts whose split was chosen by the stage DP and scored
    pruned: dict[str, int]
    wall_time_s: float
    target: str
    ilp_solves: int  # intra-op ILP solves this search ran
    ilp_cache_hits: int  # layer requests answered from the ILP cache (this search's)


@dataclass(order=True)
class _Scored:
    cost: float
    key: tuple[Any, ...]
    layout: Layout = field(compare=False)
    layers: tuple[int, ...] = field(compare=False)
    peak_bytes: float = field(compare=False, default=0.0)


def _equivalent(a: _Scored, b: _Scored) -> bool:
    """Equal composite cost and peak memory (to 1e-9): e.g. cp=4·mbs=1 and cp=8·mbs=2 price the same."""
    return (math.isclose(a.cost, b.cost, rel_tol=1e-9, abs_tol=0.0)
            and math.isclose(a.peak_bytes, b.peak_bytes, rel_tol=1e-9, abs_tol=0.0))


def to_parallel(model: ModelSpec, lay: Layout, layers: tuple[int, ...]) -> ParallelConfig:
    """The ParallelConfig of a layout and split; first/last stage sizes (or, where Megatron's flags build no split
    of ``lay.vp``, the explicit layout) only when they differ from the default."""
    par = lay.parallel_config()
    if lay.pp > 1 and _default_layers(model, lay) != tuple(layers):
        par = ParallelConfig(**lay.parallel_kwargs(), **split_fields(layers, lay.vp, model.arch.mtp_layers))
    return with_explicit_split(model, par)


def _default_layers(model: ModelSpec, lay: Layout) -> tuple[int, ...] | None:
    """``default_split_layers`` of ``lay``'s config (``Scorer.default_layers`` caches it)."""
    return default_split_layers(model, lay.parallel_config())


def default_split(model: ModelSpec, lay: Layout) -> tuple[int, ...]:
    """The split ``lay`` runs with no split chosen: Megatron's default (``stage_layers``), or where its flags build
    none at ``lay.vp``, the first explicit layout the search weighs (``interleaved_candidates``)."""
    return _default_layers(model, lay) or tuple(interleaved_candidates(model, lay)[0].rank_layers)


def interleaved_candidates(model: ModelSpec, lay: Layout) -> tuple[PipelineSplit, ...]:
    """The splits the search weighs for an interleaved layout: Megatron's flag splits (``pipeline_split.candidates``)
    or, where there are none and the target takes explicit layouts (``TargetProfile.searches_pipeline_layouts``),
    the balanced layouts (``pipeline_split.layout_candidates``)."""
    L = model.num_layers
    found = candidates(L, lay.pp, lay.vp)
    prof = get_profile(lay.target)
    if not found and prof is not None and prof.searches_pipeline_layouts:
        found = layout_candidates(L, lay.pp, lay.vp, model.arch.mtp_layers)
    return found


def _time_lower_bound(lay: Layout, scorer: Scorer) -> float:
    total, slowest, fastest, head_t = scorer.time_summary(lay)
    t_lb = max(total / lay.pp, slowest, head_t + fastest) if lay.pp > 1 else total
    a = schedule_alpha(lay.schedule, lay.vp)
    return a * total + (lay.m - a) * t_lb + scorer.p2p_fill_s(lay)


ALPHA_SCHEDULES = ("1f1b", "interleaved", "zb-h1")  # cost_models.pipeline: T = α·Σ t + (m − α)·max t exactly


def _split_lower_bound(lay: Layout, scorer: Scorer, stop: float = np.inf) -> float:
    """A lower bound on the step time of the split ``_split`` picks (no split pins), before the intra-op ILP
    is solved, from ``Scorer.tables(lower=True)`` (every layer cost and activation at or below the ILP's).
    pp > 1, vp = 1: the stage DP's optimum on those tables and Megatron's default split priced on them, plus
    the fill. Otherwise the split is one of a few (pp = 1: all layers; vp > 1: ``interleaved_candidates``):
    the least, over those that fit the floor memory, of ``pipeline_time_s`` on the floor stage times (an interleaved
    rank's: over its chunks, as ``Scorer.score`` sums them; it is monotone in them) + fill + ``dp_exposed_s`` with an unbounded overlap window + the optimizer step
    (``Scorer.score``'s terms). Less 1e-9 for rounding; +inf when no split fits even the floor memory.
    ``stop``: for the explicit layouts (``pipeline_split.layout_candidates``, a dozen or so per layout), the least
    pipeline time + fill over them all (memory unchecked: a floor of the bound) is returned when it is already ≥
    ``stop`` (the caller cuts the layout either way; their memory and DP terms are the costly part)."""
    model, limit = scorer.model, scorer.limit_bytes
    default = scorer.default_layers(lay)
    if default is None and lay.vp == 1:
        return -np.inf  # _split decides
    if lay.pp > 1 and lay.vp == 1:
        assert default is not None
        tables = scorer.tables(lay, lower=True)
        if lay.schedule not in ALPHA_SCHEDULES:
            return -np.inf  # the stage DP's α·Σt + (m − α)·max t is pipeline_time_s only for these
        alpha = schedule_alpha(lay.schedule, lay.vp)
        found = best_split(tables, n_stages=lay.pp, n_microbatches=lay.m, inflight=scorer.inflight(lay),
                           mem_limit=limit, alpha=alpha)
        lb = np.inf if found is None else found[1]
        if min(default) >= 1 and float(scorer.stage_memory(lay, default, tables).max()) <= limit:
            t = stage_costs(tables, default)
            lb = min(lb, alpha * float(t.sum()) + (lay.m - alpha) * float(t.max()))
        return lb * (1 - 1e-9) + scorer.p2p_fill_s(lay)
    splits = ([tuple(sp.rank_layers) for sp in interleaved_candidates(model, lay)] if lay.vp > 1
              else [default])
    if lay.vp > 1 and np.isfinite(stop) and not candidates(model.num_layers, lay.pp, lay.vp):
        # the floor's times alone (no memory table yet), every explicit layout's ranks in one vectorized pass
        quick = min(pipeline_time_s(t, lay.m, lay.schedule, lay.vp)  # type: ignore[arg-type]
                    for t in scorer.split_rank_costs(scorer.lower_times(lay), lay, splits))  # type: ignore[arg-type]
        quick = quick * (1 - 1e-9) + scorer.p2p_fill_s(lay)
        if quick >= stop:
            return quick
    tables = scorer.tables(lay, lower=True)
    lb = np.inf
    for layers in splits:
        if float(scorer.stage_memory(lay, layers, tables).max()) > limit:
            continue
        # a rank's layers: its chunks with vp > 1 (Scorer.score's chunked_costs), not a contiguous range of its count
        t = chunked_costs(tables, scorer.rank_chunks(lay, layers)) if lay.vp > 1 else stage_costs(tables, layers)
        dp_s, _, opt_s, blocking = scorer.data_parallel(lay, layers)
        hidden_most = dp_exposed_s(dp_s, lay.zero_stage, np.inf, lay.m, scorer.cluster, blocking)  # falls as stages grow
        pipe = pipeline_time_s(list(t), lay.m, lay.schedule, lay.vp)  # type: ignore[arg-type]
        lb = min(lb, pipe + hidden_most + opt_s)
    return lb * (1 - 1e-9) + scorer.p2p_fill_s(lay)


def _legal_splits(layouts: list[Layout], model: ModelSpec, pins: dict[str, Any], tally: Tally) -> list[Layout]:
    """The layouts whose pinned split (first/last stage sizes, embedding / loss accounting) is one their target
    builds: its own pipeline rule (MambaStack's for a hybrid) and megatron-core's get_num_layers_to_build
    (``stage_layers``). When none is, that rule's error: bad input, not a layout that "does not fit"."""
    kept, first = [], None
    for lay in layouts:
        par = ParallelConfig(**lay.parallel_kwargs(), **{k: pins[k] for k in SPLIT_PINS if k in pins})
        err = PROFILES[lay.target].pipeline_rule_error(model, par)
        if err is None:
            try:
                stage_layers(model, par)
            except ConfigError as e:
                err = e
        if err is None:
            kept.append(lay)
        else:
            tally.cut("split_pin")
            first = first or err
    if not kept and first is not None:
        raise first
    return kept


def _split(lay: Layout, scorer: Scorer, pins: dict[str, Any],
           tables: StageTables | None = None) -> tuple[int, ...] | None:
    """The stage DP's split (or the pinned / forced one), None when nothing fits memory."""
    model = scorer.model
    tables = tables or scorer.tables(lay)
    if lay.vp > 1 and not any(k in pins for k in SPLIT_PINS):
        return _interleaved_split(lay, scorer, tables)
    if lay.pp == 1 or lay.vp > 1 or any(k in pins for k in SPLIT_PINS):
        par = ParallelConfig(**lay.parallel_kwargs(), **{k: pins[k] for k in SPLIT_PINS if k in pins})
        try:
            layers = tuple(stage_layers(model, par))
        except ConfigError:
            return None
        mem = scorer.stage_memory(lay, layers, tables)
        return layers if float(mem.max()) <= scorer.limit_bytes else None
    alpha = schedule_alpha(lay.schedule, lay.vp)
    found = best_split(tables, n_stages=lay.pp, n_microbatches=lay.m, inflight=scorer.inflight(lay),
                       mem_limit=scorer.limit_bytes, alpha=alpha)
    if found is None:
        return None
    # Among equally fast splits prefer Megatron's default (no first/last-stage flags to emit).
    default = tuple(stage_layers(model, lay.parallel_config()))
    if default != tuple(found[0]) and min(default) >= 1:
        t = stage_costs(tables, default)  # the DP's own stage costs
        obj = alpha * float(t.sum()) + (lay.m - alpha) * float(t.max())
        if (obj <= found[1] * (1 + 1e-12)
                and float(scorer.stage_memory(lay, default, tables).max()) <= scorer.limit_bytes):
            return default
    return tuple(found[0])


def _interleaved_split(lay: Layout, scorer: Scorer, tables: StageTables) -> tuple[int, ...] | None:
    """With ``vp > 1`` the stage DP's contiguous splits are not Megatron's: weigh its few legal interleaved
    splits (``interleaved_candidates``: even, embedding/loss accounting, first/last counts; else explicit layouts)
    by the exact score and keep the cheapest that fits (ties: the earlier candidate, i.e. what ``resolve`` picks)."""
    best: tuple[float, int, tuple[int, ...]] | None = None
    for i, sp in enumerate(interleaved_candidates(scorer.model, lay)):
        layers = tuple(sp.rank_layers)
        if float(scorer.stage_memory(lay, layers, tables).max()) > scorer.limit_bytes:
            continue
        cost = scorer.score(lay, layers, tables).composite_cost
        if best is None or (cost, i) < best[:2]:
            best = (cost, i, layers)
    return None if best is None else best[2]


def _knob_rule_error(lay: Layout, scorers: Mapping[str, Scorer]) -> ConfigError | None:
    """Why ``lay``'s target does not run the user's knobs on it (``TargetProfile.check_runtime``, as ``estimate``
    checks them: e.g. Megatron's TP overlap needs tp > 1 with SP, an FSDP2 reshard group must divide the shard group;
    under ``any`` a target without a knob the user set runs none of its layouts); None where it does, with its
    defaults or else with the knobs the search chose for it (legal if any setting is)."""
    if get_profile(lay.target) is None:
        return None
    sc = scorers[lay.target]
    err = sc.runtime_error(lay, {})
    if err is None:
        return None
    try:
        chosen = sc.chosen_knobs(lay)
    except ConfigError:
        return err
    return err if sc.runtime_error(lay, chosen) is not None else None


def _knob_refusal(errs: list[ConfigError], layouts: list[Layout], model: ModelSpec,
                  scorers: Mapping[str, Scorer], pins: Mapping[str, Any]) -> ConfigError:
    """Why no layout runs the user's knobs. One rule: its refusal. Several (each layout breaks the first rule it
    meets, so the first layout's refusal need not bind: ``--moe-a2a-overlap`` on DeepSeek-V3 reported "ep=1" though
    every ep > 1 layout was refused too, by the pipeline's rules): every rule, each once with a layout that breaks
    it, the choices valid under all of them, and, where a rule asks for the interleaved schedule, why the search
    built no interleaved layout."""
    if len(errs) == 1:
        return errs[0]
    valid = [v for v in errs[0].valid or [] if all(v in (e.valid or []) for e in errs[1:])]
    n = next(iter(scorers.values())).cluster.num_gpus
    shown: set[str] = set()
    reasons = []
    for e in errs:  # a source file cited again is written "same file" (the message stays under the CLI's 1000 chars)
        m = re.search(r"\(([^()]*?):(\d[\d,\- ]*)\)$", e.reason)
        if m is not None and m.group(1) in shown:
            reasons.append(f"{e.reason[:m.start()]}(same file:{m.group(2)})")
            continue
        shown.update([m.group(1)] if m is not None else [])
        reasons.append(e.reason)
    text = (f"no layout of {model.name} on {n} GPUs runs the settings asked for: each breaks one of these "
            f"{len(errs)} rules: " + "; ".join(reasons))
    wants_vp = any("interleaved" in str(v) for e in errs for v in e.valid or [])
    if wants_vp and not any(lay.vp > 1 for lay in layouts):
        text += f"; and no layout searched is interleaved: {_no_interleaving(model, layouts, pins)}"
    return ConfigError(text, valid=valid)


def _no_interleaving(model: ModelSpec, layouts: list[Layout], pins: Mapping[str, Any]) -> str:
    """Why ``layouts`` (the search's, after its rules) hold no interleaved (vp > 1) one (``space.schedule_choices``)."""
    if pins.get("vp") == 1 or pins.get("schedule", "interleaved") != "interleaved":
        return f"the pinned {'vp=1' if pins.get('vp') == 1 else 'schedule ' + str(pins['schedule'])}"
    for t in dict.fromkeys(lay.target for lay in layouts):
        prof = get_profile(t)
        if prof is not None and (err := prof.interleave_error(model)) is not None:
            return err.reason
    pps = sorted({lay.pp for lay in layouts if lay.pp > 1})
    if not pps:
        return "every layout has pp=1 (virtual stages need pp > 1)"
    n = model.num_layers
    targets = list(dict.fromkeys(lay.target for lay in layouts))
    split = [p for p in pps if any(interleavable_vp(model, t, p, v, pinned=pins.get("vp") == v)
                                   for t in targets for v in range(2, n // p + 1))]
    if not split:
        return (f"{model.name}'s {n} decoder layers have no split into pp x vp chunks (vp > 1) at pp "
                f"{', '.join(map(str, pps))} that the target runs (split flags, pipeline_split.split_ok, or an "
                f"explicit layout up to vp {MAX_LAYOUT_VP} unless vp is pinned)")
    return (f"at pp {', '.join(map(str, split))} the interleaved schedule needs the micro-batch count divisible by pp "
            "(Megatron), which no layout's is")


def _model_refusal(target: str, model: ModelSpec, job: JobSpec, sc: Scorer) -> ConfigError | None:
    """Why ``target`` builds no layout of ``model``: its profile's model rule, then the one its software version
    decides (``model_runtime_error``, with the user's knobs; a knob the target lacks is the layouts' own error)."""
    prof = PROFILES[target]
    if (err := prof.model_error(model)) is not None:
        return err
    try:
        rt = runtime_for(target, job, sc.cluster, None, sc.software)
    except ConfigError:
        return None
    return prof.model_runtime_error(model, rt)


def target_scorers(model: ModelSpec, cluster: ClusterSpec, job: JobSpec, target: str,
                   scorer: Scorer | Mapping[str, Scorer] | None, weights: CostWeights | None = None
                   ) -> dict[str, Scorer]:
    """The Scorer each searched target prices its layouts with. A target runs on its own cluster (its profile's
    efficiency set: ``autoplan`` resolves it with ``ClusterRequest.resolve(target)`` and passes a mapping); a
    single Scorer (or none: one on ``cluster``) serves every target. ``any`` searches every target of the
    mapping (all of ``ANY_TARGETS`` otherwise)."""
    targets = tuple(ANY_TARGETS) if target == "any" else (target,)
    if isinstance(scorer, Mapping):
        out = {t: scorer[t] for t in targets if t in scorer}
        if not out:
            raise ValueError(f"no scorer for target {target}")
    else:
        one = scorer if scorer is not None else Scorer(model, cluster, job, weights)
        out = {t: one for t in targets}
    for sc in out.values():  # the same job on the same GPUs; only the efficiency set differs per target
        same = sc.cluster.model_copy(update={"efficiency": cluster.efficiency}) == cluster
        if not (same and sc.serves(model, sc.cluster, job, weights)):
            raise ValueError("scorer was built for another model, cluster, job or weights")
    return out


def search(model: ModelSpec, cluster: ClusterSpec, job: JobSpec, *, target: Target = "megatron",
           pins: dict[str, Any] | None = None, top_k: int = 3, weights: CostWeights | None = None,
           progress: Progress | None = None, find_smallest_cluster: bool = True,
           scorer: Scorer | Mapping[str, Scorer] | None = None) -> PlannerResult:
    """The ``top_k`` best plans (fitting in memory), ranked by composite cost. ``target="any"``: the best plans any
    target runs, each layout priced by its own target's Scorer (``target_scorers``) and labelled with it.

    Raises ``InfeasibleError`` when no layout fits: the message names the closest layout and by how much
    it missed, the hint the smallest GPU count (same GPU) that has a plan.
    ``scorer``: a ``Scorer`` for the same (model, cluster, job, weights), to reuse its cached layer costs,
    parameter sums and DP times across requests (batch workers keep one per job); or a mapping target → Scorer
    (each on the cluster as that target runs on it)."""
    t0 = time.perf_counter()
    pins = dict(pins or {})
    tally = Tally()
    check_precision(job, cluster)
    if "tp" in pins:
        valid = tp_choices(model, cluster, target, {}, Tally())
        if pins["tp"] not in valid:
            t, domain = pins["tp"], cluster.nvlink_domain_size
            shards = not (model.num_attention_heads % t or model.ffn_hidden_size % t or cluster.num_gpus % t)
            why = (nvlink_tp_refusal(t, cluster) if shards and (t > domain or domain % t) else
                   f"tp={t} cannot shard {model.name} for {target} (heads {model.num_attention_heads}, KV heads "
                   f"{model.num_kv_heads}, ffn {model.ffn_hidden_size}, {cluster.num_gpus} GPUs)")
            raise ConfigError(why, valid=valid)
    scorers = target_scorers(model, cluster, job, target, scorer, weights)
    if pins.get("recompute_modules") is not None:  # Megatron's modules: the targets that run them (estimate's rule)
        errs = [e for t in scorers if (e := PROFILES[t].megatron_field_error("recompute_modules")) is not None]
        if len(errs) == len(scorers):
            raise errs[0]
        scorers = {t: sc for t, sc in scorers.items() if PROFILES[t].megatron_field_error("recompute_modules") is None}
    refusals = [e for t, sc in scorers.items() if (e := _model_refusal(t, model, job, sc)) is not None]
    if refusals and len(refusals) == len(scorers):  # no searched target builds the model: say why, not "infeasible"
        raise refusals[0]
    if "schedule" in pins:  # a schedule no searched target runs: the error estimate gives, not plans nobody runs
        offered = list(dict.fromkeys(s for t in scorers for s in PROFILES[t].schedules))
        if pins["schedule"] not in offered:
            raise ConfigError(f"schedule {pins['schedule']}: {' or '.join(scorers)} has no such schedule (pipeline "
                              f"schedules: {', '.join(offered)})", valid=offered)
    if "vp" in pins and "schedule" in pins:  # vp > 1 is interleaved: estimate's rule, not "valid: vp 1"
        why = vp_schedule_error(int(pins["vp"]), str(pins["schedule"]))
        if why is not None:
            raise ConfigError(why)
    if int(pins.get("vp", 1)) > 1 or pins.get("schedule") == "interleaved":  # a target that cannot interleave the
        builds = [t for t in scorers if PROFILES[t].model_error(model) is None]  # model: its rule
        errs = [e for t in builds if (e := PROFILES[t].interleave_error(model)) is not None]
        if errs and len(errs) == len(builds):
            raise errs[0]
    if pins.get("pp") == 1:  # interleaving on one pipeline rank: the rule itself (as estimate says), not "valid pp"
        vp = int(pins.get("vp", 1))
        why = interleave_pp_error(1, vp, "interleaved" if vp > 1 else str(pins.get("schedule", "1f1b")))
        if why is not None:
            raise ConfigError(why)
    if "zero_stage" in pins:  # a ZeRO stage no searched target runs: the target's own reason, as estimate gives it
        stages = sorted({z for t in scorers for z in PROFILES[t].zero_stages})
        if pins["zero_stage"] not in stages:
            why = "; ".join(PROFILES[t].zero_reason(pins["zero_stage"]) for t in scorers)
            raise ConfigError(f"zero_stage={pins['zero_stage']}: {why}", valid=stages)
    if pins.get("zero_stage") == 0 and pins.get("hsdp_shard_size", 1) != 1:  # ZeRO-0 shards in no group of any size
        # (a group of 1 breaks the one-rank rule first, as estimate says: ``_pinned_rule_error``)
        errs = [PROFILES[t].hsdp_error(0, int(pins["hsdp_shard_size"]), 1, 2 * int(pins["hsdp_shard_size"]))
                for t in scorers]  # (layout_error asks it for the whole dp*cp group too under ZeRO-0): estimate's rule
        if all(e is not None for e in errs):
            raise errs[0]  # type: ignore[misc]
    ilps = list({id(sc.ilp): sc.ilp for sc in scorers.values()}.values())
    solves0, hits0 = sum(c.misses for c in ilps), sum(c.hits for c in ilps)
    # Every layout in order of its step-time lower bound (ties: the simpler); the memory bound is asked only of those
    # the step-time bound has not cut yet. Of the layouts that fit it, the order and the cut are those of a list of
    # them alone (the cut holds at any later bound), so the plans are; what does not fit is cut where it is met.
    # A layout whose model state alone is over the limit (``Scorer.state_lower_bound``, ≤ its memory bound) is cut
    # before its step time is bounded; should no plan be found, its memory bound is asked then (the closest layout).
    bounded: list[tuple[float, tuple[Any, ...], Layout]] = []
    over_state: list[Layout] = []
    candidates = 0
    for lay in _iter_searched_layouts(model, cluster, job, pins, scorers, tally):
        candidates += 1
        scorer = scorers[lay.target].as_run(lay)
        if scorer.state_lower_bound(lay) > scorer.limit_bytes:
            tally.cut("memory_lower_bound")
            over_state.append(lay)
            continue
        bounded.append((_time_lower_bound(lay, scorer), lay.sort_key(), lay))
    bounded.sort(key=lambda x: (x[0], x[1]))
    misses: list[tuple[float, tuple[Any, ...], Layout]] = []  # (memory bound, key, layout) of what did not fit

    keep = top_k + 4  # finalists: top_k, the runner-up each is explained against, and a margin
    best: list[_Scored] = []
    evaluated = 0
    w_min = min((weights or CostWeights()).compute, (weights or CostWeights()).comm)
    for n, (lb, key, lay) in enumerate(bounded):
        if progress is not None and n % 64 == 0:
            progress(n, len(bounded))
        if len(best) >= keep and w_min * lb >= best[keep - 1].cost:
            tally.cut("bound", len(bounded) - n)
            break
        scorer = scorers[lay.target].as_run(lay)
        mem_lb = scorer.memory_lower_bound(lay)
        if mem_lb > scorer.limit_bytes:
            tally.cut("memory_lower_bound")
            misses.append((mem_lb, key, lay))
            continue
        if len(best) >= keep and not any(k in pins for k in SPLIT_PINS):
            stop = best[keep - 1].cost / w_min if w_min > 0 else np.inf
            split_lb = _split_lower_bound(lay, scorer, stop)  # the split on the cost floors, before any ILP solve
            if w_min * split_lb >= best[keep - 1].cost:
                tally.cut("split_bound" if np.isfinite(split_lb) else "memory")
                continue
        tables = scorer.tables(lay)
        layers = _split(lay, scorer, pins, tables)
        evaluated += 1
        if layers is None:
            tally.cut("memory")
            misses.append((scorer.memory_lower_bound(lay), key, lay))
            continue
        fs = scorer.score(lay, layers, tables)
        if not fs.fits:  # the DP's memory check and the scorer agree; guard against rounding
            tally.cut("memory")
            continue
        entry = _Scored(fs.composite_cost, key, lay, layers, fs.peak_memory_bytes)
        twin = next((b for b in best if _equivalent(b, entry)), None)
        if twin is not None:  # same cost and memory: one plan in different clothes; keep the simpler
            tally.cut("equivalent")
            if entry.key >= twin.key:
                continue
            best.remove(twin)
        best.append(entry)
        best.sort()
        del best[keep:]
    if progress is not None:
        progress(len(bounded), len(bounded))
    if not best:
        misses += _closest_over_state(over_state, scorers, misses)
        raise _infeasible(model, cluster, job, target, pins, misses, scorers, find_smallest_cluster, tally)

    finals = []
    for s in best:
        par = to_parallel(model, s.layout, s.layers)
        sc = scorers[s.layout.target].as_run(s.layout)
        pred = estimate(model, sc.cluster, job, par, weights, runtime=sc.runtime(s.layout))
        if pred.fits:
            finals.append((pred.composite_cost, s.key, par, pred, s.layout))
    finals.sort(key=lambda x: (x[0], x[1]))
    plans = []
    for i, (_, _, par, pred, lay) in enumerate(finals[:top_k]):
        nxt = finals[i + 1] if i + 1 < len(finals) else None
        text = explain(par, pred, nxt[2], nxt[3], cluster) if nxt else "no other layout fits"
        if nxt is not None and nxt[4].target != lay.target:
            text += f" (#{i + 2} runs on {nxt[4].target})"
        note = _knob_note(scorers[lay.target].as_run(lay), lay, par, pred, weights)
        text += f". {note[0].upper()}{note[1:]}" if note else ""
        par, runs = PROFILES[lay.target].runs_as(par, cluster.num_gpus)  # a pinned HSDP group of all dp*cp ranks
        if runs is not None:  # is the plain sharding (priced the same): the plan says what runs, and why
            text += f". Runs as: {runs}"
            pred = pred.model_copy(update={"software": {**pred.software, "runs_as": runs}})
        plans.append(RankedPlan(rank=i + 1, parallel=par, prediction=pred, explanation=text,
                                op_shardings=op_shardings(scorers[lay.target].as_run(lay), lay), target=lay.target))
    return PlannerResult(plans=plans, candidates=candidates, evaluated=evaluated, pruned=tally.as_dict(),
                         wall_time_s=time.perf_counter() - t0, target=target,
                         ilp_solves=sum(c.misses for c in ilps) - solves0,
                         ilp_cache_hits=sum(c.hits for c in ilps) - hits0)


def _closest_over_state(over_state: list[Layout], scorers: Mapping[str, Scorer],
                        misses: list[tuple[float, tuple[Any, ...], Layout]]
                        ) -> list[tuple[float, tuple[Any, ...], Layout]]:
    """(memory bound, key, layout) of the layouts cut on their model state that can be among the
    ``CLOSEST_CANDIDATES`` least (memory bound, key) of them and ``misses`` (what ``_infeasible`` names the closest
    from): bounded in order of their state bound, which is ≤ the memory bound, until it passes the last of those."""
    found = sorted(((lb, key) for lb, key, _ in misses))[:CLOSEST_CANDIDATES]
    out: list[tuple[float, tuple[Any, ...], Layout]] = []
    for state, key, lay in sorted(((scorers[lay.target].as_run(lay).state_lower_bound(lay), lay.sort_key(), lay)
                                    for lay in over_state), key=lambda x: (x[0], x[1])):
        if len(found) >= CLOSEST_CANDIDATES and state > found[-1][0]:
            break  # every later one's memory bound is above the CLOSEST_CANDIDATES found: none can enter
        lb = scorers[lay.target].as_run(lay).memory_lower_bound(lay)
        out.append((lb, key, lay))
        bisect.insort(found, (lb, key))
        del found[CLOSEST_CANDIDATES:]
    return out


def _knob_note(scorer: Scorer, lay: Layout, par: ParallelConfig, pred: Prediction,
               weights: CostWeights | None) -> str:
    """The knobs the search set on ``lay`` beyond the user's (``Scorer.chosen_knobs``) where they differ from the
    target's defaults, and the step time the defaults would give on the same layout (``search.explain``)."""
    base = scorer.target_default_runtime(lay)
    moved = {k: v for k, v in {**dict(lay.knobs), **scorer.chosen_knobs(lay)}.items() if getattr(base, k) != v}
    if not moved:
        return ""
    try:
        before: Prediction | None = estimate(scorer.model, scorer.cluster, scorer.job, par, weights, runtime=base)
    except ConfigError:
        before = None
    return knob_choice(moved, {k: getattr(base, k) for k in moved}, pred, before)


def op_shardings(scorer: Scorer, lay: Layout) -> dict[str, dict[str, str]]:
    """Per decoder layer kind, every op's tp mode in the ILP's solution (fused and follow ops share their node's)."""
    out: dict[str, dict[str, str]] = {}
    for kind in ("dense", "moe"):
        if kind in scorer.graphs:
            sol = scorer.layer_solution(lay, kind)
            out[kind] = {op: c.strategy.tp for c in sol.choices for op in c.ops}
    return out


# ==== infeasible jobs =================================================================================
def _infeasible(model: ModelSpec, cluster: ClusterSpec, job: JobSpec, target: Target, pins: dict[str, Any],
                misses: list[tuple[float, tuple[Any, ...], Layout]], scorers: Mapping[str, Scorer], find_smallest: bool,
                tally: Tally) -> InfeasibleError | ConfigError:
    if not misses:
        cut = ", ".join(f"{k} {v}" for k, v in tally.as_dict().items())
        if pins:  # the pins themselves are what no layout can satisfy: bad input (exit 2), as estimate says
            rule = _pinned_rule_error(model, cluster, job, target, pins, scorers)
            if rule is not None:
                return rule
            key, valid = _pin_choices(model, cluster, job, target, pins, scorers)
            why = ""
            if key in ("tp", "cp"):  # a target's hybrid-mixer rule names the reason (TargetProfile.hybrid_layout_error)
                tp, cp = int(pins.get("tp", 1)), int(pins.get("cp", 1))
                err = next((e for t in scorers if (e := PROFILES[t].hybrid_layout_error(model, tp, cp)) is not None),
                           None)
                why = f" ({err.reason})" if err is not None else ""
            c = int(pins.get("cp", 1))
            if key == "cp" and why == "" and (job.seq_len % (2 * c) or job.seq_len // c < MIN_CP_TOKENS):
                why = (f" (the search tries cp={c} only where seq_len is divisible by 2*cp = {2 * c} and each CP rank "
                       f"holds at least {MIN_CP_TOKENS} tokens: seq_len={job.seq_len})")
            if key == "ep" and not model.is_moe:
                why = f" (ep needs a MoE model; {model.name} is dense)"
            elif key == "ep":  # the target's expert rule at the most expert ranks a stage can have (tp*dp*cp = N/pp)
                ranks = cluster.num_gpus // int(pins.get("pp", 1))
                err = next((e for t in scorers if (e := PROFILES[t].expert_layout_error(
                    model, tp=1, pp=int(pins.get("pp", 1)), cp=1, dp_cp=ranks, ep=int(pins["ep"]), zero=3, hsdp=None))
                    is not None), None)
                why = f" ({err.reason})" if err is not None else ""
            t = int(pins.get("tp", 1))
            split = next((e for s in scorers if (e := PROFILES[s].sp_split_error(job.seq_len, t, c)) is not None), None)
            if key == "tp" and why == "" and model.is_moe and split is not None:  # check_parallel's SP rule
                why = f" (MoE with tp > 1 runs sequence parallelism: {split})"
            if key == "pp" and job.global_batch_size < int(pins["pp"]):  # 1F1B: m >= pp (check_parallel)
                why = (f" (a pipeline of pp={pins['pp']} needs at least {pins['pp']} micro-batches; global_batch_size="
                       f"{job.global_batch_size} makes at most {job.global_batch_size})")
            return ConfigError(f"no parallel layout of {model.name} on {cluster.num_gpus} GPUs keeps the pins "
                               f"{pins} and passes the hard constraints (target {target}; cut: {cut}); "
                               + (f"no layout keeps {key}={pins[key]}{why}" if valid else "relax the pins"),
                               valid=valid or None)
        near = _nearest_legal_gpus(model, cluster, job, target)
        fewer = _fewer_legal_gpus(model, cluster, job, target) if not near else None
        batches = _nearest_legal_batches(model, cluster, job, target)
        on_batch = (f"; on {cluster.num_gpus} GPUs, global batch sizes with a layout: "
                    + " and ".join(str(b) for b in batches)) if batches else ""
        return InfeasibleError(
            f"no parallel layout of {model.name} on {cluster.num_gpus} GPUs passes the hard constraints "
            f"(target {target}, pins {pins or 'none'}; cut: {cut})",
            hint=("nearest GPU counts with a layout: " + " and ".join(f"{n} GPUs" for n in near) + on_batch if near
                  else f"no GPU count within {NEAREST_PROBES} nodes of it has a layout; halving it, {fewer} GPUs does"
                  + on_batch if fewer else "change the global batch size or the GPU count"))
    # The closest: least peak memory of the default split among the layouts with the lowest bounds.
    misses.sort(key=lambda x: (x[0], x[1]))
    peak, lay = min(((float(scorers[lay.target].as_run(lay).stage_memory(
                          lay, default_split(model, lay),
                          scorers[lay.target].as_run(lay).tables(lay)).max()) / 2**30, lay)
                     for _, _, lay in misses[:CLOSEST_CANDIDATES]), key=lambda x: (x[0], x[1].sort_key()))
    limit = cluster.memory_limit_gib
    msg = (f"no layout of {model.name} fits in {limit:.1f} GiB per GPU on {cluster.num_gpus} x {cluster.gpu.name}; "
           f"closest: tp={lay.tp} pp={lay.pp} cp={lay.cp} ep={lay.ep} dp={lay.dp} mbs={lay.micro_batch_size} "
           f"recompute={lay.recompute} zero={lay.zero_stage} needs {peak:.1f} GiB ({peak - limit:+.1f} GiB)")
    hint = None
    if find_smallest:
        n = smallest_feasible_gpus(model, cluster, job, pins, scorers)
        hint = (f"smallest {cluster.gpu.name} cluster with a plan: {n} GPUs" if n else
                "no cluster of this GPU up to 65536 GPUs has a plan at this batch size and sequence length")
    return InfeasibleError(msg, hint=hint, closest=lay)


# Pins that choose how a layout holds its state rather than its shape: what a target rule may refuse on every layout
# the shape pins leave (``_pinned_rule_error``).
STATE_PINS = ("zero_stage", "hsdp_shard_size")
# Distinct layout shapes ``_pinned_rule_error`` asks before it gives up on a rule as the cause (integer checks).
RULE_PROBES = 256


def _pinned_rule_error(model: ModelSpec, cluster: ClusterSpec, job: JobSpec, target: Target,
                       pins: dict[str, Any], scorers: Mapping[str, Scorer]) -> ConfigError | None:
    """A pinned ZeRO stage or HSDP group that no layout keeps because a target rule refuses it with the shape pins
    (``zero_stage=3`` with ``pp=2`` on Megatron, ``hsdp_shard_size=1`` on dp*cp > 1): that rule as estimate says it
    (``TargetProfile.layout_error``) on the first layout the shape pins keep, at the pinned ZeRO stage or the one the
    target runs unset with the user's knobs (``default_zero_stage``: Megatron's Muon runs 0). None when some shape
    among the first ``RULE_PROBES`` distinct ones passes the rule (the cause is elsewhere) or none is left."""
    if not any(k in pins for k in STATE_PINS):
        return None
    rest = {k: v for k, v in pins.items() if k not in STATE_PINS}
    hsdp = pins.get("hsdp_shard_size")
    first: ConfigError | None = None
    shapes: set[tuple[Any, ...]] = set()
    for lay in enumerate_layouts(model, cluster, job, target, rest, Tally()):
        shape = (lay.target, lay.tp, lay.pp, lay.cp, lay.ep, lay.dp, lay.schedule)
        if shape in shapes or (hsdp == 1 and lay.dp * lay.cp == 1):
            continue  # the rules read the shape alone; one rank in all: a group of 1 is the whole group
        shapes.add(shape)
        if len(shapes) > RULE_PROBES:
            break
        prof = PROFILES[lay.target]
        zero = int(pins.get("zero_stage", prof.default_zero_stage(ParallelConfig().zero_stage,
                                                                      scorers[lay.target].software)))
        err = prof.layout_error(model, tp=lay.tp, pp=lay.pp, cp=lay.cp, ep=lay.ep, zero=zero,
                                hsdp=None if hsdp is None else int(hsdp), dp_cp=lay.dp * lay.cp,
                                schedule=lay.schedule)
        if err is None:
            return None
        first = first or err
    return first


def _pin_choices(model: ModelSpec, cluster: ClusterSpec, job: JobSpec, target: Target, pins: dict[str, Any],
                 scorers: Mapping[str, Scorer]) -> tuple[str, list[Any]]:
    """The first pin (in the user's order) whose value is what no layout keeps, with the values the layouts under
    the other pins take (the legal neighbours of a pin); ("", []) when no single pin is the cause. The layouts are
    the searched targets' (``scorers``), each with its module ladder as ``_searched_layouts`` enumerates them (so a
    ``recompute_modules`` pin's neighbours are the ladder's sets); not its knob rules and memory variants, which cost
    several times the enumeration per pin (deepseek-v3 on 256 GPUs unpinned: 3.9 s against 11.7-22.7 s)."""
    ladders = {t: sc.module_ladder(t) for t, sc in scorers.items()}
    for key in pins:
        rest = {k: v for k, v in pins.items() if k != key}
        if key == "hsdp_shard_size":  # the search offers few groups unpinned; a pin may take any that divides dp*cp
            values: set[Any] = set(_hsdp_sizes(model, cluster, job, target, rest))
        else:
            layouts = [lay for t in scorers
                       for lay in enumerate_layouts(model, cluster, job, t, rest, Tally(), ladders)]  # type: ignore[arg-type]
            values = {getattr(lay, key, None) for lay in layouts}
            if key == "vp":  # unpinned, explicit layouts stop at MAX_LAYOUT_VP; a pin may take any the target runs
                values.update(v for pp, t in {(lay.pp, lay.target) for lay in layouts if lay.vp > 1}
                              for v in pinnable_vps(model, t, pp))
        values.discard(None)
        if values:
            return key, sorted(values, key=lambda v: (str(type(v)), v))
    return "", []


def _hsdp_sizes(model: ModelSpec, cluster: ClusterSpec, job: JobSpec, target: Target,
                pins: dict[str, Any]) -> list[int]:
    """The HSDP shard-group sizes a pin may take under ``pins``: each divisor > 1 of a layout's dp*cp that one of
    its target's ZeRO stages shards in (``zero_choices`` with that pin)."""
    sizes: set[int] = set()
    seen: set[tuple[Any, ...]] = set()
    for lay in enumerate_layouts(model, cluster, job, target, pins, Tally()):
        key = (lay.target, lay.tp, lay.cp, lay.pp, lay.dp, lay.ep)
        if key in seen:
            continue
        seen.add(key)
        dp_cp = lay.dp * lay.cp
        sizes.update(d for d in divisors(dp_cp) if d > 1 and d not in sizes and zero_choices(
            lay.target, cluster, dp_cp, lay.pp, {**pins, "hsdp_shard_size": d}, Tally(), model, lay.tp, lay.cp,
            lay.ep))
    return sorted(sizes)


def _nearest_legal_gpus(model: ModelSpec, cluster: ClusterSpec, job: JobSpec, target: Target) -> list[int]:
    """The nearest GPU counts below and above ``cluster.num_gpus`` (whole nodes once past one) whose layouts pass
    the hard constraints (divisibility of the batch, heads, layers): what an infeasible-by-shape job can use."""
    n, step = cluster.num_gpus, cluster.gpus_per_node if cluster.num_gpus > cluster.gpus_per_node else 1
    def legal(k: int) -> bool:
        c = cluster.model_copy(update={"num_gpus": k})
        return next(iter(enumerate_layouts(model, c, job, target, {}, Tally())), None) is not None
    # at most NEAREST_PROBES counts each way: past a million GPUs a full scan would try ~10^5 counts (minutes)
    below = next((k for k in islice(range(n - (n % step or step), 0, -step), NEAREST_PROBES) if legal(k)), None)
    above = next((k for k in islice(range(n + step - n % step, 4 * n + 1, step), NEAREST_PROBES) if legal(k)), None)
    return [k for k in (below, above) if k is not None]


def _nearest_legal_batches(model: ModelSpec, cluster: ClusterSpec, job: JobSpec, target: Target) -> list[int]:
    """The nearest global batch sizes below and above ``job.global_batch_size`` (at most ``NEAREST_PROBES`` each
    way) whose layouts on ``cluster`` pass the hard constraints: the other way out of an infeasible-by-shape job."""
    def legal(b: int) -> bool:
        j = job.model_copy(update={"global_batch_size": b})
        return next(iter(enumerate_layouts(model, cluster, j, target, {}, Tally())), None) is not None
    b = job.global_batch_size
    below = next((k for k in islice(range(b - 1, 0, -1), NEAREST_PROBES) if legal(k)), None)
    above = next((k for k in range(b + 1, b + NEAREST_PROBES + 1) if legal(k)), None)
    return [k for k in (below, above) if k is not None]


def _fewer_legal_gpus(model: ModelSpec, cluster: ClusterSpec, job: JobSpec, target: Target) -> int | None:
    """The first of ``num_gpus`` halved, quartered, ... (whole nodes past one) whose layouts pass the hard
    constraints: a count that works when none near ``num_gpus`` does (a batch far too small for the cluster)."""
    n, node = cluster.num_gpus // 2, cluster.gpus_per_node
    while n >= 1:
        k = n - n % node if n > node else n
        if next(iter(enumerate_layouts(model, cluster.model_copy(update={"num_gpus": k}), job, target, {}, Tally())),
                None) is not None:
            return k
        n //= 2
    return None


def _searched_layouts(model: ModelSpec, cluster: ClusterSpec, job: JobSpec, pins: dict[str, Any],
                      scorers: Mapping[str, Scorer], tally: Tally) -> list[Layout]:
    """``_iter_searched_layouts`` as a list."""
    return list(_iter_searched_layouts(model, cluster, job, pins, scorers, tally))


def _iter_searched_layouts(model: ModelSpec, cluster: ClusterSpec, job: JobSpec, pins: dict[str, Any],
                           scorers: Mapping[str, Scorer], tally: Tally) -> Iterator[Layout]:
    """The layouts ``search`` prices on ``cluster`` (and ``_has_plan`` tries), in search order: each target's layouts
    with its Megatron selective-recompute module ladder (``Scorer.module_ladder``, unless the user pinned the
    modules), a pinned split's rule (``_legal_splits``), those whose target runs the knobs (``_knob_rule_error``;
    the rest are cut as ``knob_rule``), and each setting of the layout knobs (FSDP2 reshard_after_forward,
    Megatron's EP A2A overlap) as a layout of its own (``Scorer.knob_variants``). One layout at a time, so what is
    asked of it in a row is validated once (``Layout.parallel_config``). Raises ``ConfigError``, once every layout
    has been seen, where the pins or knobs rule out every layout: the rules the knobs break (``_knob_refusal``: bad
    input, not an infeasible job)."""
    ladders = {t: sc.module_ladder(t) for t, sc in scorers.items()}
    layouts: Iterable[Layout] = (lay for t in scorers for lay in enumerate_layouts(  # type: ignore[arg-type]
        model, cluster, job, t, pins, tally, ladders))  # type: ignore[arg-type]
    if any(k in pins for k in SPLIT_PINS):
        layouts = _legal_splits(list(layouts), model, pins, tally)
    seen: list[Layout] = []
    kept = False
    rules: dict[str, ConfigError] = {}  # each rule the cut layouts break, once (its first refusal), in layout order
    for lay in layouts:
        if not kept:  # only asked when none is kept
            seen.append(lay)
        err = _knob_rule_error(lay, scorers)
        if err is not None:
            tally.cut("knob_rule")
            rules.setdefault(re.sub(r"\d+", "#", err.reason), err)
            continue
        kept = True
        yield from scorers[lay.target].as_run(lay).knob_variants(lay)
    if seen and not kept and rules:
        raise _knob_refusal(list(rules.values()), seen, model, scorers, pins)


def _has_plan(model: ModelSpec, cluster: ClusterSpec, job: JobSpec, pins: dict[str, Any],
              scorers: Mapping[str, Scorer]) -> bool:
    """Whether ``search`` on ``cluster`` finds a layout and split that fit: the layouts it prices
    (``_searched_layouts``) and the split ``_split`` picks under the memory limit.
    ``scorers``: the searched targets' (``target_scorers``), re-derived at this GPU count so the knobs and each target's
    efficiency set are the search's."""
    derived: dict[int, Scorer] = {}  # one per Scorer (a single Scorer may serve every target)
    for sc in scorers.values():
        if id(sc) not in derived:
            derived[id(sc)] = sc.derive(sc.cluster.model_copy(update={"num_gpus": cluster.num_gpus}), job)
    scs = {t: derived[id(sc)] for t, sc in scorers.items()}
    bounded = []
    layouts = _iter_searched_layouts(model, cluster, job, pins, scs, Tally())
    while True:
        try:
            lay = next(layouts)
        except StopIteration:
            break
        except ConfigError:  # the pins or knobs rule out every layout at this size
            return False
        sc = scs[lay.target].as_run(lay)
        if sc.state_lower_bound(lay) > sc.limit_bytes:  # ≤ its memory bound: over it too
            continue
        lb = sc.memory_lower_bound(lay)
        if lb <= sc.limit_bytes:
            bounded.append((lb, lay.sort_key(), lay))
    bounded.sort(key=lambda x: (x[0], x[1]))  # most likely to fit first
    return any(_split(lay, scs[lay.target].as_run(lay), pins) is not None for _, _, lay in bounded)


def smallest_feasible_gpus(model: ModelSpec, cluster: ClusterSpec, job: JobSpec, pins: dict[str, Any],
                           scorers: Mapping[str, Scorer], limit: int = 65536) -> int | None:
    """Smallest GPU count above ``cluster.num_gpus`` with a plan, trying powers of two below one node and
    node · 2^k above (every size a cluster of this GPU can have on the way). ``scorers``: the search's per target
    (``_has_plan``)."""
    node = cluster.gpus_per_node
    sizes = [2**i for i in range(1, node.bit_length()) if 2**i < node]
    k = node
    while k <= limit:
        sizes.append(k)
        k *= 2
    for n in sorted(set(sizes)):
        if n <= cluster.num_gpus:
            continue
        if _has_plan(model, cluster.model_copy(update={"num_gpus": n}), job, pins, scorers):
            return n
    return None
