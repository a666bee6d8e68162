"""cost_models.host_cover: the graphed non-MoE layers' device work the MoE layers' host issue runs beside (the
backward has no host sync), in estimate and in the search's Scorer alike."""

from __future__ import annotations

import pytest

from cost_models.ep_comm import host_wait_s
from cost_models.estimate import estimate, graphs_for, runtime_for
from cost_models.host_cover import backward_device_s, forward_device_s, host_light_kinds, moe_host_cover_s
from cost_models.layer_cost import LayerCost, layer_cost
from cost_models.specs import JobSpec, ParallelConfig
from cost_models.targets import Software
from cost_models.validate import pipeline_split

from autoplan.catalog.cluster import build_cluster
from autoplan.catalog.registry import catalog_model


def _lc(f: float, b: float) -> LayerCost:
    return LayerCost(forward_s=f, backward_s=b, recompute_s=0.0, attention_s=0.0, tp_s=0.0, ep_s=0.0, cp_s=0.0,
                     tp_bytes=0.0, ep_bytes=0.0, cp_bytes=0.0)


LIGHT = frozenset({"mamba", "attention"})


def test_cover_is_the_backward_of_the_graphed_layers_after_each_moe_layer() -> None:
    kinds = ["mamba", "moe", "mamba", "attention", "moe", "mamba"]
    lcs = [_lc(1.0 + i, 10.0 * (i + 1)) for i in range(len(kinds))]
    seq = list(zip(range(len(kinds)), kinds, lcs))
    synced = moe_host_cover_s(seq, True, LIGHT)
    assert synced == [0.0, 30.0 + 40.0, 0.0, 0.0, 60.0, 0.0]
    # without a sync the host runs ahead in the forward too: the layers before the MoE layer
    free = moe_host_cover_s(seq, False, LIGHT)
    assert free == [0.0, 70.0 + 1.0, 0.0, 0.0, 60.0 + 3.0 + 4.0, 0.0]
    # an eagerly issued layer covers nothing (its own host issue is not priced), nor do the layers beyond it
    assert moe_host_cover_s(seq, True, frozenset({"attention"})) == [0.0] * 6
    # a chunk boundary (ids not consecutive) ends the run
    jump = [(0, "moe", lcs[1]), (1, "mamba", lcs[2]), (7, "mamba", lcs[5])]
    assert moe_host_cover_s(jump, True, LIGHT) == [30.0, 0.0, 0.0]
    assert backward_device_s(lcs[2]) == 30.0 and forward_device_s(lcs[2]) == 3.0


def test_transformer_stacks_get_no_cover() -> None:
    """All-MoE stacks and dense-first ones (DeepSeek's, Kimi's): a dense-first layer runs after every MoE layer in
    the backward, so nothing is queued ahead of an MoE layer's backward issue."""
    seq = [(0, "dense", _lc(1, 2)), (1, "dense", _lc(1, 2)), (2, "moe", _lc(1, 2)), (3, "moe", _lc(1, 2))]
    every = frozenset({"dense", "mlp", "mamba", "attention"})
    assert moe_host_cover_s(seq, True, every) == [0.0] * 4


def test_host_light_kinds_follow_the_graph_scope() -> None:
    cluster = build_cluster("b300", 64, target="megatron")
    job, par = JobSpec(global_batch_size=512, seq_len=8192, precision="fp8"), ParallelConfig(tp=1, ep=8, zero_stage=1)

    def kinds(**sw: object) -> frozenset[str]:
        return host_light_kinds(runtime_for("megatron", job, cluster, par, Software(megatron_core="0.18.0", **sw)))

    assert kinds() == frozenset()
    assert kinds(moe_dispatcher="hybridep", cuda_graph_impl="transformer_engine",
                 cuda_graph_scope=("attn", "mamba", "moe_router", "moe_preprocess")) == LIGHT
    assert kinds(moe_dispatcher="hybridep", cuda_graph_impl="transformer_engine",
                 cuda_graph_scope=("attn", "moe_router")) == frozenset({"attention"})


def test_a_graphed_gdn_layer_covers_like_a_graphed_dense_layer() -> None:
    """A Gated DeltaNet layer is a Megatron TransformerLayer with the GatedDeltaNet module as its self_attention: the
    attn and mlp scopes together graph it whole, as an empty scope and full_iteration do, and neither alone does
    (host_cover.GRAPH_SCOPES_OF_KIND). So in the mixed GDN stack the moe layer 5 (gdn_dense 4 before it, gdn_dense 6
    and dense 7 after it) gets the backward of layers 6 and 7 as cover, and without a sync the forward of 4 and 3."""
    model, cluster, job = _gdn_mixed()
    par = ParallelConfig(tp=1, pp=1, ep=4, micro_batch_size=1)

    def light(impl: str, scope: tuple[str, ...]) -> frozenset[str]:
        return host_light_kinds(runtime_for("megatron", job, cluster, par,
                                            Software(cuda_graph_impl=impl, cuda_graph_scope=scope)))

    for impl, scope in [("transformer_engine", ("attn", "mlp")), ("transformer_engine", ("attn", "mlp", "moe_router")),
                        ("transformer_engine", ()), ("local", ()), ("local", ("full_iteration",))]:
        assert {"dense", "gdn_dense"} <= light(impl, scope), (impl, scope)
    for scope in [("attn",), ("mlp",), ("attn", "moe_router")]:
        assert "gdn_dense" not in light("transformer_engine", scope) and "dense" not in light("transformer_engine", scope)
    from cost_models.opgraph import layer_kinds

    kinds = layer_kinds(model)
    assert kinds[3:8] == ["dense", "gdn_dense", "moe", "gdn_dense", "dense"]
    lcs = [_lc(1.0 + i, 10.0 * (i + 1)) for i in range(len(kinds))]
    seq = list(zip(range(len(kinds)), kinds, lcs))
    graphed = light("transformer_engine", ("attn", "mlp"))
    assert moe_host_cover_s(seq, True, graphed)[5] == 70.0 + 80.0
    assert moe_host_cover_s(seq, False, graphed)[5] == 70.0 + 80.0 + 5.0 + 4.0
    assert moe_host_cover_s(seq, True, graphed)[2] == 40.0 + 50.0  # gdn_moe 2: dense 3, gdn_dense 4


def _super_b300(scope: tuple[str, ...]) -> tuple:
    model, cluster = catalog_model("nemotron-3-super-120b-a12b"), build_cluster("b300", 64, target="megatron")
    job = JobSpec(global_batch_size=512, seq_len=8192, precision="fp8")
    par = ParallelConfig(tp=1, ep=8, zero_stage=1, micro_batch_size=1, sequence_parallel=False)
    sw = Software(megatron_core="0.18.0", fp8_recipe="mxfp8", moe_dispatcher="hybridep", moe_force_balance=True,
                  cuda_graph_impl="transformer_engine", cuda_graph_scope=scope)
    return model, cluster, job, par, sw


def test_estimate_takes_the_cover_off_the_moe_host_waits() -> None:
    """Nemotron 3 Super on 64 B300, ep 8 (64 local experts, the host-bound published layout): with its Mamba and
    attention layers graphed, each MoE layer's backward host issue runs beside the next layers' backward; the step's
    host-bound time is the per-layer waits less exactly that, and the search's Scorer prices it alike."""
    from search.score import Scorer
    from search.space import Layout

    model, cluster, job, par, sw = _super_b300(("attn", "mamba", "moe_router", "moe_preprocess"))
    pred = estimate(model, cluster, job, par, target="megatron", software=sw)
    rt = runtime_for("megatron", job, cluster, par, sw)
    graphs = graphs_for(model, job.seq_len)
    costs = {k: layer_cost(graphs[k], model, cluster, job, par, 64, rt) for k in ("moe", "mamba", "attention")}
    m = pred.num_microbatches
    moe_layers = model.hybrid_pattern.count("E") + model.arch.mtp_layers * model.arch.mtp_pattern.count("E")
    per_layer = costs["moe"].host_s * moe_layers * m  # every MoE layer's wait, priced alone
    assert costs["moe"].host_s > 0 and pred.time.host_bound_s < per_layer - 1.0  # seconds off the step
    # the cover each main-stack MoE layer gets: the graphed layers after it, up to the next MoE layer
    pattern = model.hybrid_pattern
    covers = []
    for i, s in enumerate(pattern):
        if s == "E":
            run = pattern[i + 1:].split("E")[0]
            covers.append(sum(backward_device_s(costs["mamba" if c == "M" else "attention"]) for c in run))
    lc = costs["moe"]
    expect = sum(host_wait_s(graphs["moe"], model, cluster, par, rt, lc.total_s - lc.host_s, lc.forward_share,
                             lc.sync_window_s, c) for c in covers)
    expect += lc.host_s * model.arch.mtp_layers * model.arch.mtp_pattern.count("E")  # the MTP block's: no cover
    assert pred.time.host_bound_s == pytest.approx(expect * m, rel=1e-9)
    # the Scorer of the search agrees with estimate on this layout (one cost model)
    lay = Layout(tp=1, cp=1, pp=1, dp=64, ep=8, micro_batch_size=1, m=m, recompute="none", zero_stage=1,
                 hsdp_shard_size=None, schedule="1f1b", vp=1, sequence_parallel=False)
    assert pipeline_split(model, par).pp == 1
    fs = Scorer(model, cluster, job, software=sw).score(lay, (model.num_layers,))
    assert fs.step_time_s == pytest.approx(pred.step_time_s, rel=1e-9)


def test_no_cover_without_graphed_neighbours() -> None:
    """The same layout with the attention and Mamba layers issued eagerly: no cover, the waits as layer_cost prices
    them one by one."""
    model, cluster, job, par, sw = _super_b300(("moe_router", "moe_preprocess"))
    pred = estimate(model, cluster, job, par, target="megatron", software=sw)
    rt = runtime_for("megatron", job, cluster, par, sw)
    lc = layer_cost(graphs_for(model, job.seq_len)["moe"], model, cluster, job, par, 64, rt)
    moe_layers = model.hybrid_pattern.count("E") + model.arch.mtp_layers * model.arch.mtp_pattern.count("E")
    assert pred.time.host_bound_s == pytest.approx(lc.host_s * moe_layers * pred.num_microbatches, rel=1e-9)


def _super_layout(pp: int, vp: int, m: int) -> object:
    from search.space import Layout
    return Layout(tp=1, cp=1, pp=pp, dp=64 // pp, ep=8, micro_batch_size=1, m=m, recompute="none", zero_stage=1,
                  hsdp_shard_size=None, schedule="1f1b" if vp == 1 else "interleaved", vp=vp, sequence_parallel=False)


@pytest.mark.parametrize("pp,vp", [(2, 1), (4, 1), (2, 2)])
def test_scorer_prices_the_cover_per_split_as_estimate(pp: int, vp: int) -> None:
    """An MoE layer that ends a stage (or, with vp, a chunk) has no graphed layers after it on its rank: estimate
    prices its wait with the rank-local cover; the Scorer's whole-stack tables get the same per-split correction."""
    from search.score import Scorer

    model, cluster, job, par, sw = _super_b300(("attn", "mamba", "moe_router", "moe_preprocess"))
    par = ParallelConfig(**{**par.model_dump(), "pp": pp, "vp": vp,
                                            "schedule": "interleaved" if vp > 1 else "1f1b"})
    pred = estimate(model, cluster, job, par, target="megatron", software=sw, check=False)
    split = pipeline_split(model, par)
    sc = Scorer(model, cluster, job, software=sw)
    lay = _super_layout(pp, vp, pred.num_microbatches)
    layers = tuple(split.rank_layers)
    assert sc.cover_correction_s(lay, layers).max() > 0.0  # a cut falls after an MoE layer
    assert sc.score(lay, layers).step_time_s == pytest.approx(pred.step_time_s, rel=1e-9)


def test_lower_pieces_floor_the_exact_pieces_under_cover() -> None:
    """The planner's bounds (lower_pieces, time_summary) price each MoE layer's wait with the whole stack's cover,
    the most any split leaves it: every entry stays at or below the exact table's, Super's and a transformer
    MoE's (no cover there) alike."""
    import numpy as np

    from search.score import Scorer
    from search.space import Layout

    model, cluster, job, par, sw = _super_b300(("attn", "mamba", "moe_router", "moe_preprocess"))
    sc = Scorer(model, cluster, job, software=sw)
    lay = _super_layout(2, 1, 16)
    lo, ex = np.diff(sc.lower_pieces(lay)[0]), np.diff(sc.layer_pieces(lay)[0])
    assert (lo <= ex * (1 + 1e-12)).all()
    total, slowest, fastest, head_t = sc.time_summary(lay)
    assert total <= (ex.sum() + sc.layer_pieces(lay)[1]) * (1 + 1e-12) and slowest <= ex.max() * (1 + 1e-12)

    mix, h100 = catalog_model("mixtral-8x7b"), build_cluster("h100-sxm", 16, target="megatron")
    mjob = JobSpec(global_batch_size=64, seq_len=4096, precision="bf16")
    msc = Scorer(mix, h100, mjob)
    mlay = Layout(tp=1, cp=1, pp=2, dp=8, ep=8, micro_batch_size=1, m=8, recompute="none", zero_stage=1,
                  hsdp_shard_size=None, schedule="1f1b", vp=1, sequence_parallel=False)
    lo, ex = np.diff(msc.lower_pieces(mlay)[0]), np.diff(msc.layer_pieces(mlay)[0])
    assert (lo <= ex * (1 + 1e-12)).all()
    assert msc.time_summary(mlay)[0] <= (ex.sum() + msc.layer_pieces(mlay)[1]) * (1 + 1e-12)


def _gdn_mixed() -> tuple:
    """A small Gated DeltaNet stack with both MoE kinds and graphed dense layers between them: GDN every other layer,
    every third layer MoE, so kinds gdn_dense, dense, gdn_moe, dense, gdn_dense, moe, ... (12 layers). The dense and
    gdn_dense layers (attention or GDN + MLP) are CUDA-graphed (scope attn, mlp): each MoE layer but the last has
    two after it to cover its host issue."""
    from cost_models.specs import ModelSpec

    model = ModelSpec(name="tiny-gdn-moe", num_layers=12, hidden_size=512, ffn_hidden_size=1024,
                      num_attention_heads=8, num_kv_heads=2, vocab_size=4096, num_experts=64, moe_top_k=4,
                      moe_ffn_hidden_size=256, moe_layer_freq=3,
                      gdn={"num_key_heads": 4, "num_value_heads": 8, "key_head_dim": 64, "value_head_dim": 64,
                           "full_attention_every": 2})
    return model, build_cluster("h100-sxm", 8, target="megatron"), JobSpec(global_batch_size=64, seq_len=4096)


@pytest.mark.parametrize("drop", [False, True], ids=["dropless", "drop-and-pad"])
@pytest.mark.parametrize("pp,vp,split", [(1, 1, {}), (2, 1, {"first_stage_layers": 3, "last_stage_layers": 9}),
                                         (2, 2, {})], ids=["pp1", "pp2-cut-after-gdn-moe", "vp2"])
def test_scorer_prices_each_moe_kinds_own_wait_and_cover_as_estimate(drop: bool, pp: int, vp: int,
                                                                     split: dict) -> None:
    """A stack with gdn_moe and moe layers: every MoE kind waits on its host with its own device time, forward share
    and window (ep_comm.host_wait_s), its covered layers too, and the Scorer's per-layer times, per-split cover
    correction and step time are estimate's (the search kept one MoE time per stack, the moe kind's, and gave the
    covered gdn_moe layers the moe layers' time)."""
    import numpy as np

    from cost_models.opgraph import layer_kinds
    from search.score import Scorer
    from search.space import Layout

    model, cluster, job = _gdn_mixed()
    kinds = layer_kinds(model)
    assert kinds[:6] == ["gdn_dense", "dense", "gdn_moe", "dense", "gdn_dense", "moe"]
    sw = Software(cuda_graph_impl="transformer_engine", cuda_graph_scope=("attn", "mlp"),
                  **({"moe_capacity_factor": 1.0} if drop else {}))
    par = ParallelConfig(tp=1, pp=pp, vp=vp, ep=4, micro_batch_size=1, schedule="interleaved" if vp > 1 else "1f1b",
                         **split)
    pred = estimate(model, cluster, job, par, target="megatron", software=sw)
    rt = runtime_for("megatron", job, cluster, par, sw)
    graphs = graphs_for(model, job.seq_len)
    lc = {k: layer_cost(graphs[k], model, cluster, job, par, pred.dp, rt) for k in set(kinds)}
    assert lc["gdn_moe"].host_s > 0 and lc["moe"].host_s > 0
    seq = list(zip(range(len(kinds)), kinds, [lc[k] for k in kinds]))
    covers = moe_host_cover_s(seq, not drop, host_light_kinds(rt))
    # every MoE layer but the last has graphed layers after it; without a sync the last one has them before it
    assert [i for i, c in enumerate(covers) if c > 0] == ([2, 5, 8, 11] if drop else [2, 5, 8])
    sc = Scorer(model, cluster, job, software=sw)
    lay = Layout(tp=1, cp=1, pp=pp, dp=8 // pp, ep=4, micro_batch_size=1, m=pred.num_microbatches,
                 recompute="none", zero_stage=1, hsdp_shard_size=None, schedule=par.schedule, vp=vp)
    assert sc.chosen_knobs(lay) == {}
    # whole-stack per-layer times: each layer's own kind's, its host wait with the whole stack's cover
    want = [lc[k].total_s if c == 0.0 else lc[k].total_s - lc[k].host_s
            + host_wait_s(graphs[k], model, cluster, par, rt, lc[k].total_s - lc[k].host_s, lc[k].forward_share,
                          lc[k].sync_window_s, c) for k, c in zip(kinds, covers)]
    assert np.diff(sc.layer_pieces(lay)[0]) == pytest.approx(want, rel=1e-12)
    layers = tuple(pipeline_split(model, par).rank_layers)
    assert (sc.cover_correction_s(lay, layers).max() > 0.0) == (pp > 1)  # a cut after a gdn_moe layer
    assert sc.score(lay, layers).step_time_s == pytest.approx(pred.step_time_s, rel=1e-9)
    lo = np.diff(sc.lower_pieces(lay)[0])
    assert (lo <= np.diff(sc.layer_pieces(lay)[0]) * (1 + 1e-12)).all()
