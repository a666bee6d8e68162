"""The search's stage DP picks the layer split that ``estimate`` prices best, and prices it as ``estimate`` does.

Nemotron 3 hybrid stacks (Mamba / attention layers between MoE layers) with their non-MoE layers CUDA-graphed: an
MoE layer's host issue runs beside the graphed layers queued next to it (``cost_models.host_cover``), and a stage
edge cuts that run — so a stage's time is not a sum of per-layer times. Every split Megatron can express at vp 1
(``[f, q × (pp − 2), last]``, what the DP weighs) is priced with the full ``estimate``; the DP's choice
(``planner._split``) must be the one whose pipeline time is least, and its stage costs (``inter_op.stage_costs``
on ``Scorer.tables``) must be ``estimate``'s stage times (``estimate.stage_time_parts``).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import replace

import numpy as np
import pytest

from cost_models.ep_comm import host_wait_s
from cost_models.errors import ConfigError
from cost_models.estimate import estimate, stage_time_parts
from cost_models.host_cover import (CoverRun, consecutive_ranges, cover_runs, host_light_kinds, moe_host_cover_s,
                                   range_wait_table, rank_wait_delta_s)
from cost_models.layer_cost import LayerCost
from cost_models.moe import host_synced
from cost_models.pipeline import pipeline_time_s
from cost_models.specs import JobSpec, ParallelConfig
from cost_models.targets import Software
from cost_models.validate import pipeline_split, stage_layers

from autoplan.catalog.cluster import build_cluster
from autoplan.catalog.registry import catalog_model
from search.inter_op import stage_costs
from search.planner import _split, to_parallel
from search.score import Scorer
from search.space import Layout

GRAPHED = ("attn", "mamba", "moe_router", "moe_preprocess")


def _setup(name: str, pp: int, synced: bool, mbs: int = 1) -> tuple:
    """64 B300, ep 8, the published host-bound Super layout's knobs (tests/test_host_cover.py) at ``pp``; without
    a per-layer sync (drop-and-pad: ``moe_capacity_factor``) the forward's runs before an MoE layer cover it too."""
    model, cluster = catalog_model(name), build_cluster("b300", 64, target="megatron")
    job = JobSpec(global_batch_size=512, seq_len=8192, precision="fp8")
    sw = Software(megatron_core="0.18.0", fp8_recipe="mxfp8", moe_dispatcher="hybridep", moe_force_balance=True,
                  cuda_graph_impl="transformer_engine", cuda_graph_scope=GRAPHED,
                  **({} if synced else {"moe_capacity_factor": 1.0}))
    dp = 64 // pp
    lay = Layout(tp=1, cp=1, pp=pp, dp=dp, ep=8, micro_batch_size=mbs, m=512 // (dp * mbs), recompute="none",
                 zero_stage=1, hsdp_shard_size=None, schedule="1f1b", vp=1, sequence_parallel=False)
    return model, cluster, job, Scorer(model, cluster, job, software=sw), lay


def _expressible(L: int, pp: int) -> list[tuple[int, ...]]:
    """Every vp-1 split Megatron builds: first / last stage counts, the middle ranks equal (pipeline_split)."""
    if pp == 2:
        return [(f, L - f) for f in range(1, L)]
    return [(f, *[q] * (pp - 2), L - f - (pp - 2) * q)
            for q in range(1, (L - 2) // (pp - 2) + 1) for f in range(1, L - (pp - 2) * q)]


CASES = [  # (model, pp, synced): the first two a cover-blind DP got wrong; the others it priced wrong (stage times)
    ("nemotron-3-super-120b-a12b", 4, True),  # blind: (24, 25, 25, 14), 0.2% slower than (26, 24, 24, 14)
    ("nemotron-3-nano-30b-a3b", 8, False),  # blind: (8, 7 × 6, 2), 2.8% slower than (7 × 7, 3)
    ("nemotron-3-super-120b-a12b", 2, False),
    ("nemotron-3-nano-30b-a3b", 4, False),
]

@pytest.mark.parametrize("name,pp,synced", CASES)
def test_stage_dp_split_is_the_one_estimate_prices_best(name: str, pp: int, synced: bool) -> None:
    """Brute force over every expressible split with ``estimate``. The DP minimises the pipeline time
    (``pipeline_time_s`` of the stage times) under the memory limit: its split must reach the least one estimate
    finds, to 1e-9. Here its step time is estimate's least too (to 1e-9), though the DP does not weigh the DP /
    optimizer terms a split moves (the heaviest stage's parameters; the one micro-batch of compute that hides the
    gradient reduce): at ZeRO-1 with most of the step in the pipeline they do not change the choice. Were a case
    to make them, the pipeline-time assertion still holds and this one needs that stated tolerance. Before the DP
    read the cover its stage edges cut (``Scorer.cover_table``) it missed the best split in the first two cases."""
    model, cluster, job, sc, lay = _setup(name, pp, synced)
    assert sc.cover_table(lay) is not None and sc.cover_table(lay).max() > 0.0  # edges do cut covers here
    tables = sc.tables(lay)
    chosen = _split(lay, sc, {}, tables)
    assert chosen is not None
    rt = sc.runtime(lay)
    pipes, steps = {}, {}
    for layers in _expressible(model.num_layers, pp):
        par = to_parallel(model, lay, layers)
        pred = estimate(model, cluster, job, par, runtime=rt, check=False)
        if not pred.fits:
            continue
        stage_t = [sum(p.values()) for p in stage_time_parts(model, cluster, job, par, rt, lay.dp)]
        pipes[layers] = pipeline_time_s(stage_t, lay.m, lay.schedule, lay.vp)
        steps[layers] = pred.step_time_s
        if layers == chosen:
            chosen_t = stage_t
    assert chosen in pipes
    best = min(pipes, key=lambda k: (pipes[k], k))
    assert pipes[chosen] <= pipes[best] * (1 + 1e-9), (chosen, pipes[chosen], best, pipes[best])
    # the DP prices its choice as estimate does, stage by stage
    np.testing.assert_allclose(stage_costs(tables, chosen), chosen_t, rtol=1e-9, atol=0.0)
    assert steps[chosen] <= min(steps.values()) * (1 + 1e-9)


def _rank_local_correction(sc: Scorer, lay: Layout, layers: tuple[int, ...]) -> np.ndarray:
    """Per rank, Σ over its MoE layers of the host wait with ``moe_host_cover_s`` on the rank's own layer ids (as
    ``estimate.host_cover_delta_s`` prices it; runs stop at id gaps: stage and chunk edges) − with the whole stack's:
    computed directly, layer by layer, without ``range_wait_table``."""
    chosen = sc.chosen_knobs(lay)
    rt, par = sc.runtime(lay), sc._bound_par(lay, lay.recompute)
    synced, light = host_synced(sc.cluster, par, rt), host_light_kinds(rt)
    seq = [(i, k, sc._layer_cost(lay, sc.bound_key(lay), k, chosen)) for i, k in enumerate(sc.kind_of)]
    whole = moe_host_cover_s(seq, synced, light)
    lc = seq[sc.kind_of.index("moe")][2]
    device = lc.total_s - lc.host_s

    def wait(cover: float) -> float:
        return host_wait_s(sc.graphs["moe"], sc.model, sc.cluster, par, rt, device, lc.forward_share,
                           lc.sync_window_s, cover)

    out = []
    for ids in pipeline_split(sc.model, to_parallel(sc.model, lay, layers)).layer_ids:
        local = moe_host_cover_s([seq[i] for i in ids], synced, light)
        out.append(sum(wait(c) - wait(whole[i]) for i, c in zip(ids, local) if sc.kind_of[i] == "moe"))
    return np.array(out)


def _refused(sc: Scorer, lay: Layout, layers: tuple[int, ...]) -> bool:
    try:
        pipeline_split(sc.model, to_parallel(sc.model, lay, layers))
    except ConfigError:
        return True
    return False


@pytest.mark.parametrize("name,pp,synced", CASES + [("nemotron-3-nano-30b-a3b", 3, True)])
def test_cover_correction_is_the_rank_local_cover_at_vp_1_and_2(name: str, pp: int, synced: bool) -> None:
    """``Scorer.cover_table`` (what the DP adds per range) is ≥ 0 everywhere (so the DP's bounds stay bounds), and
    ``cover_correction_s``, which reads it over each rank's chunks (``host_cover.rank_wait_delta_s``), is the
    rank-local cover's wait less the whole stack's, priced layer by layer, on expressible vp-1 splits and on the
    vp-2 splits Megatron builds (first / last stage counts divisible by vp): one function for both."""
    model, _, _, sc, lay = _setup(name, pp, synced)
    table = sc.cover_table(lay)
    assert table is not None and (table >= 0.0).all()
    cut = checked = 0
    for vp, step in ((1, 7), (2, 3)):
        lv = replace(lay, vp=vp, schedule="1f1b" if vp == 1 else "interleaved")
        default = tuple(stage_layers(model, to_parallel(model, lv, (model.num_layers,))))
        for layers in [default, *_expressible(model.num_layers, pp)[::step]]:
            if any(n % vp for n in layers) or _refused(sc, lv, layers):
                continue
            got = sc.cover_correction_s(lv, layers)
            np.testing.assert_allclose(got, _rank_local_correction(sc, lv, layers), rtol=1e-12, atol=1e-15)
            checked += vp > 1
            cut += vp > 1 and got.max() > 0.0
    assert checked > 0 and (cut > 0 or pp == 2), (checked, cut)  # at pp > 2 chunk edges cut covers in some vp-2 split


def _lc(f: float, b: float) -> LayerCost:
    return LayerCost(forward_s=f, backward_s=b, recompute_s=0.0, attention_s=0.0, tp_s=0.0, ep_s=0.0, cp_s=0.0,
                     tp_bytes=0.0, ep_bytes=0.0, cp_bytes=0.0)


def _wait(c: float) -> float:  # a host wait that is not linear in the cover
    return max(0.0, 40.0 - c) ** 1.5


LIGHT = frozenset({"mamba", "attention"})


def _cover_case(synced: bool) -> tuple[list, Callable[[float], float], list[float], np.ndarray]:
    """A hybrid stack's (id, kind, cost) sequence, the wait, its whole-stack cover (host-light kinds ``LIGHT``) and
    ``range_wait_table``."""
    kinds = ["mamba", "moe", "mamba", "attention", "moe", "moe", "mamba", "dense", "mamba", "moe", "mamba"]
    seq = [(i, k, _lc(1.0 + i, 3.0 * (i + 1))) for i, k in enumerate(kinds)]
    whole = moe_host_cover_s(seq, synced, LIGHT)
    return seq, _wait, whole, range_wait_table(cover_runs(seq, synced, LIGHT), len(seq), _wait)


@pytest.mark.parametrize("synced", [True, False])
def test_range_wait_table_is_moe_host_cover_on_every_slice(synced: bool) -> None:
    """``range_wait_table[i, j]`` = Σ over the MoE entries of ``layers[i:j]`` of wait(``moe_host_cover_s`` on that
    slice) − wait(its cover on the whole), for every ``i < j``, with a wait that is not linear in the cover."""
    seq, wait, whole, table = _cover_case(synced)
    for i, j in itertools.combinations(range(len(seq) + 1), 2):
        local = moe_host_cover_s(seq[i:j], synced, LIGHT)
        expect = sum(wait(c) - wait(whole[i + a]) for a, c in enumerate(local) if seq[i + a][1] == "moe")
        assert table[i, j] == pytest.approx(expect, abs=1e-9), (i, j)
    assert not table[np.tril_indices(len(seq) + 1)].any()  # only i < j is a range


@pytest.mark.parametrize("synced", [True, False])
def test_rank_wait_delta_reads_the_table_over_any_ids(synced: bool) -> None:
    """``rank_wait_delta_s`` on any increasing id set (an interleaved rank's chunks; chunks that touch, as when the
    ranks between hold no decoder layer, are one run for ``moe_host_cover_s`` and one range here) is Σ wait(cover on
    those ids) − wait(whole cover) over their MoE entries; ``consecutive_ranges`` cuts at the id gaps only."""
    assert consecutive_ranges([0, 1, 2, 5, 6, 9]) == [(0, 3), (5, 7), (9, 10)]
    assert consecutive_ranges([3, 4, 5, 6]) == [(3, 7)] and consecutive_ranges([]) == []
    seq, wait, whole, table = _cover_case(synced)
    for mask in range(1, 2 ** len(seq), 5):
        ids = [i for i in range(len(seq)) if mask >> i & 1]
        local = moe_host_cover_s([seq[i] for i in ids], synced, LIGHT)
        expect = sum(wait(c) - wait(whole[i]) for i, c in zip(ids, local) if seq[i][1] == "moe")
        assert rank_wait_delta_s(table, ids) == pytest.approx(expect, abs=1e-9), ids


def test_cover_run_reads_the_slice_cover() -> None:
    """``CoverRun.cover_s(start, end)`` is the cover ``moe_host_cover_s`` gives on ``layers[start:end]``."""
    run = CoverRun(at=3, after=(0.0, 5.0, 9.0), before=(0.0, 1.0))
    assert run.cover_s() == 10.0
    assert run.cover_s(3, 4) == 0.0 and run.cover_s(2, 5) == 6.0 and run.cover_s(0, 9) == 10.0


@pytest.mark.parametrize("name,gpus,tp,ep,pp", [("deepseek-v3", 256, 4, 8, 8), ("glm-4.5-air", 64, 2, 8, 4),
                                                ("llama3-8b", 32, 2, 1, 4)])
def test_stage_costs_are_estimates_stage_times_dense_first_mtp_and_dense(name: str, gpus: int, tp: int, ep: int,
                                                                        pp: int) -> None:
    """The other per-stage terms ``estimate`` adds, on the DP's tables: dense-first layers then MoE layers (their
    kinds per layer), the head and losses on the last stage, the MTP blocks there (DeepSeek-V3, GLM-4.5-Air: one
    MTP layer each) — once, not twice — and nothing extra on the first stage (the embedding's time is priced by
    neither). Megatron's default split and two uneven ones."""
    model, cluster = catalog_model(name), build_cluster("h100-sxm", gpus, target="megatron")
    job = JobSpec(global_batch_size=256, seq_len=4096)
    dp = gpus // (tp * pp)
    lay = Layout(tp=tp, cp=1, pp=pp, dp=dp, ep=ep, micro_batch_size=1, m=256 // dp, recompute="selective",
                 zero_stage=1, hsdp_shard_size=None, schedule="1f1b", vp=1, sequence_parallel=True)
    sc = Scorer(model, cluster, job)
    tables, rt, L = sc.tables(lay), sc.runtime(lay), model.num_layers
    mid = (L - 2) // pp
    default = tuple(stage_layers(model, ParallelConfig(**lay.parallel_kwargs())))
    rest = L - 1 - mid * (pp - 2)
    for layers in [default, (1, *[mid] * (pp - 2), rest), (rest, *[mid] * (pp - 2), 1)]:
        par = to_parallel(model, lay, layers)
        assert tuple(pipeline_split(model, par).rank_layers) == layers
        got = stage_costs(tables, layers)
        want = [sum(p.values()) for p in stage_time_parts(model, cluster, job, par, rt, dp)]
        np.testing.assert_allclose(got, want, rtol=1e-9, atol=0.0)


@pytest.mark.parametrize("zero", [1, 2, 3])
def test_interleaved_scorer_sums_each_ranks_chunks_as_estimate(zero: int) -> None:
    """Mixtral 8x7B with every other layer dense (a model file's moe_layer_freq 2), pp 2, vp 16: each chunk is one
    layer, so rank 0 holds the 16 even layers and rank 1 the 16 odd ones; the contiguous ranges [0, 16), [16, 32)
    hold 8 of each. Before Scorer.rank_chunks: zero 1 Scorer 2.254 s / 52.3 GiB against estimate's 2.911 s /
    61.1 GiB; zero 2 (the per-micro-batch grad bucket) 3.200 / 41.2 vs 4.330 / 51.3; zero 3 (the gathered units)
    2.753 / 35.3 vs 3.656 / 45.4."""
    from cost_models.specs import ModelSpec

    model = ModelSpec(**{**catalog_model("mixtral-8x7b").model_dump(), "name": "mixtral-alt", "moe_layer_freq": 2})
    cluster, job = build_cluster("h100-sxm", 64), JobSpec(global_batch_size=256, seq_len=4096)
    par = ParallelConfig(pp=2, vp=16, ep=8, schedule="interleaved", zero_stage=zero)
    # pricing agreement only: zero 3 with pp 2 is a layout Megatron refuses (estimate's check says so), priced anyway
    pred = estimate(model, cluster, job, par, target="megatron", check=False)
    lay = Layout(tp=1, cp=1, pp=2, dp=32, ep=8, micro_batch_size=1, m=pred.num_microbatches, recompute=par.recompute,
                 zero_stage=zero, hsdp_shard_size=None, schedule="interleaved", vp=16, sequence_parallel=False)
    fs = Scorer(model, cluster, job).score(lay, tuple(pipeline_split(model, par).rank_layers))
    assert fs.step_time_s == pytest.approx(pred.step_time_s, rel=1e-9)
    assert fs.peak_memory_bytes / 2**30 == pytest.approx(pred.peak_memory_gib, rel=1e-9)
