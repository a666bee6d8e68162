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
