"""The search's knob candidates are cached on what the profile read (``search.score.Scorer.knob_key``), not on a
hand-picked subset of the layout: Megatron's knob rules read ep, schedule and recompute (moe_a2a_overlap,
TransformerConfig:1857-1878 @ core_v0.16.1), which the old key (target, zero, pp, tp, cp, sp, modules) left out, so
the first layout of a key decided the candidates of the others. With --moe-a2a-overlap an ep=1 layout (where every
setting is refused) left the ep>1 layouts of its key with no choice: the search returned cp_comm_type p2p where the
legal a2a is cheaper."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from autoplan.api import Engine
from autoplan.catalog import build_cluster, load_model
from autoplan.emit.plan import priced_software
from cost_models.errors import ConfigError
from cost_models.estimate import estimate
from cost_models.specs import JobSpec, ParallelConfig
from cost_models.targets import PROFILES, Software, runtime_for
from search.score import Scorer
from search.space import Layout, Tally, enumerate_layouts

MODEL, GPUS, SEQ, GBS = "olmoe-1b-7b", 16, 32768, 64
USER = {"moe_a2a_overlap": True}


def _layout(**kw: Any) -> Layout:
    base = dict(tp=1, cp=4, pp=1, dp=4, ep=4, micro_batch_size=1, m=4, recompute="selective", zero_stage=1,
                hsdp_shard_size=None, schedule="1f1b", vp=1)
    return Layout(**{**base, **kw})  # type: ignore[arg-type]


# layouts of the old key (megatron, zero 1, pp, tp 1, cp 4, SP, no modules) on which Megatron refuses
# moe_a2a_overlap for a field the old key did not hold: ep=1 (TC:1862-1864), recompute=full (TC:1870-1878)
@pytest.mark.parametrize("refused", [dict(ep=1), dict(recompute="full")], ids=["ep1", "full"])
def test_candidates_do_not_depend_on_the_layouts_priced_before(refused: dict[str, Any]) -> None:
    model, cluster = load_model(MODEL), build_cluster("h100-sxm", GPUS)
    job = JobSpec(global_batch_size=GBS, seq_len=SEQ)
    sw = Software(**USER)
    good, bad = _layout(), _layout(**refused)
    fresh = Scorer(model, cluster, job, software=sw)
    want_good, want_bad = fresh.knob_candidates(good), Scorer(model, cluster, job, software=sw).knob_candidates(bad)
    assert len(want_good) > 1 and want_bad == []  # a choice on one, every setting refused on the other
    for order in ((good, bad), (bad, good)):
        sc = Scorer(model, cluster, job, software=sw)
        got = {lay: sc.knob_candidates(lay) for lay in order}
        assert got == {good: want_good, bad: want_bad}
        assert sc.chosen_knobs(good) == fresh.chosen_knobs(good)
        assert sc.knob_key(good) != sc.knob_key(bad)


def test_every_returned_plan_runs_its_knobs_and_took_the_cheapest_legal_setting() -> None:
    res = Engine().search({"model": MODEL, "cluster": {"gpu": "h100-sxm", "num_gpus": GPUS},
                           "job": {"global_batch_size": GBS, "seq_len": SEQ}, "parallel": {"cp": 4}, "top": 10,
                           "target": "megatron", "software": USER})
    model, cluster = load_model(MODEL), build_cluster("h100-sxm", GPUS)
    job = res.job
    assert len(res.plans) == 10
    for plan in res.plans:
        par: ParallelConfig = plan.parallel
        prof = PROFILES[plan.target or "megatron"]
        sw = priced_software(plan.prediction.software)
        prof.check(model, cluster, job, par, runtime_for(prof.name, job, cluster, par, sw))  # Megatron runs it
        cands = prof.knob_candidates(model, cluster, job, par, Software(**USER))
        assert len(cands) > 1  # every plan here has a cp_comm_type to choose
        times = [estimate(model, cluster, job, par, target=prof.name, software=Software(**USER, **c)).step_time_s
                 for c in cands]
        assert plan.prediction.step_time_s == pytest.approx(min(times), rel=1e-9), (par, sw.cp_comm_type)


# ---- the per-layer caches' bound key ----------------------------------------------------------------------------

def _same_bound_key(lay: Layout, gpus: int, sc: Scorer) -> list[Layout]:
    """Layouts whose per-layer pieces the Scorer caches under ``lay``'s bound key and knobs (``Scorer.bound_key``):
    other ZeRO stages, pipeline depths and schedules, and each setting of the layout knobs the target offers
    (``Scorer.knob_variants``: FSDP2's reshard_after_forward, Megatron's EP A2A overlap). What those change in the
    runtime priced with (``Scorer._runtime_with`` keys on them) is never what a layer's time, activations or host
    wait read, but for the layout knobs that change a layer (``layer_time_layout_knobs``), which the key holds:
    one key per setting of those."""
    out = []
    for zero in (0, 1, 2, 3):
        for pp, schedule, vp in ((1, "1f1b", 1), (2, "1f1b", 1), (2, "interleaved", 2)):
            dp = gpus // (lay.tp * lay.cp * pp)
            var = replace(lay, zero_stage=zero, pp=pp, schedule=schedule, vp=vp, dp=dp)
            out += [v for v in sc.knob_variants(var)]
    layer_knobs = PROFILES[lay.target].layer_time_layout_knobs
    settings = {tuple(kv for kv in v.knobs if kv[0] in layer_knobs) for v in out}
    assert len({sc.bound_key(v) for v in out}) == len(settings)
    return out


def _pieces(sc: Scorer, lay: Layout) -> list[Any]:
    import numpy as np

    time, head_t, acts, head_a = sc.layer_pieces(lay)
    out: list[Any] = [sc.chosen_knobs(lay), list(time), head_t, list(acts), head_a, sc.exact_pieces(lay),
                      sc.act_pieces(lay), sc.bound_pieces(lay), list(sc.floor_per_layer(lay)),
                      list(np.diff(sc.lower_pieces(lay)[0]))]
    if not sc.no_ilp:
        out += [sc.knob_delta_s(lay, k) for k in sc.kinds]
    return out


@pytest.mark.parametrize("name, target, gpus, seq, par", [
    ("llama3-8b", "torchtitan", 16, 4096, dict(tp=2)),  # compile / async TP searched; reshard_after_forward
    ("llama3-8b", "fsdp2", 16, 4096, dict(tp=2)),  # reshard_after_forward True, False, a node
    ("mixtral-8x7b", "megatron", 32, 8192, dict(tp=2, cp=2, ep=2)),  # cp_comm_type searched, its floor
    ("qwen3-next-80b-a3b", "megatron", 64, 4096, dict(tp=2, ep=16)),  # no ILP; both MoE kinds wait on the host
], ids=["torchtitan", "fsdp2", "megatron-cp", "megatron-gdn"])
def test_per_layer_caches_hold_for_every_layout_of_their_key(name: str, target: str, gpus: int, seq: int,
                                                             par: dict[str, int]) -> None:
    """The Scorer's per-layer caches (``_lc``, ``_knob_delta``, ``_ktime``, ``_pieces``, ``_acts``, ``_bounds``,
    ``_floor_layers``, ``_covers``, ``_layer``) key on the bound key and the knob fields, not on the ZeRO stage, the
    pipeline or the ``Layout.knobs`` that change no layer, which the runtime they price with is resolved from: a
    Scorer that priced the other layouts of a key first answers each as a fresh one does. (A layout knob the key left
    out, or a ZeRO / pipeline-dependent runtime default, that changed a layer's price would make the first layout of a
    key decide the others'.)"""
    model, cluster = load_model(name), build_cluster("h100-sxm", gpus, target=target)
    job = JobSpec(global_batch_size=256, seq_len=seq)
    base = Layout(**{**dict(tp=1, cp=1, pp=1, dp=1, ep=1, micro_batch_size=1, m=8, recompute="none", zero_stage=1,
                            hsdp_shard_size=None, schedule="1f1b", vp=1, target=target), **par})  # type: ignore[arg-type]
    shared = Scorer(model, cluster, job)
    layouts = _same_bound_key(base, gpus, shared)
    # every target here offers a layout knob: FSDP2's reshard_after_forward, Megatron's A2A overlap (ep > 1)
    assert any(v.knobs for v in layouts)
    if target == "megatron":
        assert len({shared.bound_key(v) for v in layouts}) == 2  # overlap off and on: a layer's price differs
    for lay in layouts:
        fresh = Scorer(model, cluster, job)
        fresh.ilp = shared.ilp  # the intra-op ILP's cache keys on its whole request
        assert _pieces(shared, lay) == _pieces(fresh, lay), lay


# ---- the memory bound of memory-neutral layout knobs ------------------------------------------------------------

@pytest.mark.parametrize("pp, schedule, vp, recompute", [(1, "1f1b", 1, "none"), (2, "interleaved", 2, "none"),
                                                          (4, "interleaved", 4, "selective")],
                         ids=["pp1", "pp2-vp2", "pp4-vp4-selective"])
def test_memory_neutral_layout_knobs_change_no_priced_byte(pp: int, schedule: str, vp: int, recompute: str) -> None:
    """``TargetProfile.memory_neutral_layout_knobs`` (Megatron's EP A2A overlap) change no byte of ``estimate``'s
    memory, so the search bounds a layout's memory once for every setting of them (``Scorer.memory_lower_bound``):
    the cached bound of each setting equals the bound a fresh Scorer computes for that setting itself."""
    name, gpus = "mixtral-8x7b", 32
    model, cluster = load_model(name), build_cluster("h100-sxm", gpus)
    job = JobSpec(global_batch_size=64, seq_len=4096)
    prof = PROFILES["megatron"]
    assert prof.memory_neutral_layout_knobs == {"moe_a2a_overlap"}
    lay = Layout(tp=2, cp=1, pp=pp, dp=gpus // (2 * pp), ep=8, micro_batch_size=1, m=64 // (gpus // (2 * pp)),
                 recompute=recompute, zero_stage=1, hsdp_shard_size=None, schedule=schedule, vp=vp)
    shared = Scorer(model, cluster, job)
    variants = shared.knob_variants(lay)
    assert [dict(v.knobs) for v in variants] == [{}, {"moe_a2a_overlap": True}]  # the overlap legal on each
    par = ParallelConfig(**lay.parallel_kwargs())
    mems = [estimate(model, cluster, job, par, target="megatron", software=Software(moe_a2a_overlap=on), check=False)
            for on in (False, True)]
    assert mems[0].step_time_s != mems[1].step_time_s  # the knob is priced ...
    assert mems[0].memory_gib == mems[1].memory_gib  # ... and changes no byte
    for var in variants:
        assert shared.memory_lower_bound(var) == Scorer(model, cluster, job)._memory_lower_bound(var)


# ---- what the cached rule checks read ---------------------------------------------------------------------------

def test_knob_key_holds_what_the_profile_read_not_what_parallel_config_validation_read() -> None:
    """Building a ``ParallelConfig`` runs its validators, which read pp, vp, schedule, recompute and the modules: the
    recorded config is built before the recording starts, so only the profile's reads key the cache. On cp=1
    Megatron offers no cp_comm_type (``MegatronProfile.knob_options`` reads cp alone), so every such layout shares one
    entry; recorded with the validators' reads the key held 7 fields, and llama3-70b on 1024 GPUs missed the cache on
    3,580 of 16,164 layouts."""
    model, cluster = load_model("llama3-70b"), build_cluster("h100-sxm", 64)
    sc = Scorer(model, cluster, JobSpec(global_batch_size=64, seq_len=4096))
    lays = [Layout(tp=4, cp=1, pp=pp, dp=16 // pp, ep=1, micro_batch_size=1, m=64 // (16 // pp), recompute=rc,
                   zero_stage=1, hsdp_shard_size=None, schedule=sched, vp=vp)
            for pp, sched, vp in ((1, "1f1b", 1), (4, "1f1b", 1), (4, "interleaved", 2)) for rc in ("none", "full")]
    keys = {sc.knob_key(lay) for lay in lays}
    assert len(keys) == 1
    (_, fields, _), = keys
    assert fields == ("cp",)
    assert all(sc.knob_candidates(lay) == [] for lay in lays)


@pytest.mark.parametrize("name, gpus, seq, user", [
    ("olmoe-1b-7b", 16, 32768, {"moe_a2a_overlap": True}),  # refused on ep 1, full recompute, pp > 1 without vp
    ("llama3-8b", 16, 8192, {"tp_comm_overlap": True}),  # refused where tp = 1 or SP is off
], ids=["a2a-overlap", "tp-overlap"])
def test_cached_rule_checks_answer_as_the_profile_does_on_every_layout(name: str, gpus: int, seq: int,
                                                                     user: dict[str, Any]) -> None:
    """``Scorer.runtime_error`` and ``knob_candidates`` cache the profile's answers on the fields it read
    (``Scorer._recorded``); one Scorer asked of every layout the search enumerates, in its order, answers each as
    ``check_runtime`` and ``knob_candidates`` do on that layout alone (a read the record missed would let an earlier
    layout decide a later one's)."""
    model, cluster = load_model(name), build_cluster("h100-sxm", gpus)
    job = JobSpec(global_batch_size=64, seq_len=seq)
    sw = Software(**user)
    sc = Scorer(model, cluster, job, software=sw)
    prof = PROFILES["megatron"]
    ladders = {"megatron": sc.module_ladder("megatron")}
    lays = list(enumerate_layouts(model, cluster, job, "megatron", {}, Tally(), ladders))
    assert len(lays) > 100
    refused = 0
    for lay in lays:
        par = ParallelConfig(**lay.parallel_kwargs())
        try:
            prof.check_runtime(model, cluster, job, par, runtime_for("megatron", job, cluster, par, sw))
            want = None
        except ConfigError as err:
            want = str(err)
        got = sc.runtime_error(lay, {})
        assert (None if got is None else str(got)) == want, lay
        refused += want is not None
        assert sc.knob_candidates(lay) == prof.knob_candidates(model, cluster, job, par, sw), lay
    assert 0 < refused < len(lays)  # both answers occur
