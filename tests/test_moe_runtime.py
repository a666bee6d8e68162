"""MoE run-time knobs of the megatron target (``cost_models.moe``): the dispatcher (alltoall / DeepEP / HybridEP), the EP
all-to-all overlap, forced balance and token drop. Each term is recomputed from its formula, and each test fails if
the term is dropped from the pricing."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest

from autoplan.catalog import build_cluster, load_model
from cost_models.collectives import RankStrides
from cost_models.errors import ConfigError
from cost_models.estimate import estimate
from cost_models.gemm import expected_max_normal
from cost_models.a2a_overlap import OverlapNodes
from cost_models.ep_comm import a2a_overlap_compute_split, a2a_overlap_exposed_s, moe_all_to_all, moe_all_to_all_parts
from cost_models.layer_cost import LayerCost, layer_cost
from cost_models.op_cost import op_compute
from cost_models.memory import graphs_for
from cost_models.moe import (DISPATCHER_SMS, dispatcher_sm_fraction, host_synced, moe_load_imbalance,
                             nccl_alltoall_ctas)
from cost_models.specs import JobSpec, ParallelConfig
from cost_models.targets import MEGATRON, Software

from cli_emit import emitted_megatron_args

QWEN = "qwen3-235b-a22b"  # 128 experts, top-8, hidden 4096, expert FFN 1536
JOB = JobSpec(global_batch_size=1024, seq_len=4096, precision="bf16")


def _rt(sw: Software, cluster, par: ParallelConfig, job: JobSpec = JOB):  # noqa: ANN001, ANN202
    rt = MEGATRON.resolve(sw, job, cluster, par)
    MEGATRON.check_runtime(load_model(QWEN), cluster, job, par, rt)
    return rt


def _moe_layer(sw: Software, cluster, par: ParallelConfig, job: JobSpec = JOB):  # noqa: ANN001, ANN202
    model = load_model(QWEN)
    graph = graphs_for(model, job.seq_len)["moe"]
    return layer_cost(graph, model, cluster, job, par, par.dp(cluster.num_gpus), _rt(sw, cluster, par, job))


def test_forced_balance_spread_matches_a_simulated_router() -> None:
    """``moe_router_force_load_balancing`` routes each token to k distinct experts drawn uniformly (random normal
    logits, top-k): simulate it and compare the busiest EP rank's load with the closed form."""
    e, k, ep, tokens = 64, 8, 8, 512
    rng = np.random.default_rng(0)
    ratios = []
    for _ in range(200):
        logits = rng.standard_normal((tokens * ep, e))  # every rank's tokens reach every EP rank
        chosen = np.argpartition(logits, -k, axis=1)[:, -k:]
        per_rank = np.bincount((chosen // (e // ep)).ravel(), minlength=ep)
        ratios.append(per_rank.max() / per_rank.mean())
    simulated = float(np.mean(ratios))
    closed = 1 + expected_max_normal(ep) * math.sqrt((1 - 1 / ep) * (e - k) / (e - 1) / (tokens * k))
    assert simulated == pytest.approx(closed, rel=0.004)
    model = load_model(QWEN).model_copy(update={"num_experts": e, "moe_top_k": k})
    cluster = build_cluster("h100-sxm", 64)
    par = ParallelConfig(tp=1, pp=1, ep=ep, micro_batch_size=1)
    rt = MEGATRON.resolve(Software(moe_force_balance=True), JobSpec(seq_len=tokens), cluster, par)
    assert moe_load_imbalance(model, JobSpec(seq_len=tokens), par, cluster, rt) == pytest.approx(closed)
    assert closed < cluster.efficiency.moe_imbalance  # a learned router's spread is the catalog's, larger


def test_imbalance_scales_expert_compute_and_all_to_all_bytes() -> None:
    """ρ multiplies the busiest rank's expert tokens and its all-to-all bytes: forced balance and a capacity factor
    of 1.0 (token drop with padding: ρ = the factor) price them below the catalog's learned-router ρ."""
    cluster = build_cluster("b200", 64)
    par = ParallelConfig(tp=1, pp=8, ep=8, micro_batch_size=1)
    base = _moe_layer(Software(), cluster, par)
    for sw in (Software(moe_force_balance=True), Software(moe_capacity_factor=1.0)):
        rho = moe_load_imbalance(load_model(QWEN), JOB, par, cluster, _rt(sw, cluster, par))
        cost = _moe_layer(sw, cluster, par)
        assert cost.ep_bytes / base.ep_bytes == pytest.approx(rho / cluster.efficiency.moe_imbalance)
        assert cost.forward_s < base.forward_s
    assert moe_load_imbalance(load_model(QWEN), JOB, par, cluster,
                              _rt(Software(moe_capacity_factor=1.25), cluster, par)) == 1.25


def _sm_slow(share: float, plain: LayerCost) -> float:
    """The compute factor of a layer whose all-to-alls (``plain``'s, run without the overlap) hold ``share`` of the
    SMs beside its compute while they run: C + f·min(A, C/(1 − f)) over C (layer_cost.a2a_sm_slowdown)."""
    compute = plain.forward_s + plain.backward_s
    return 1 + share * min(plain.ep_s, compute / (1 - share)) / compute


def test_a2a_overlap_hides_ep_behind_compute_and_hybridep_takes_its_sms() -> None:
    """``--overlap-moe-expert-parallel-comm``: the layer's EP time shows only past its compute; HybridEP's kernels
    hold 16 of the GPU's SMs (TC ``moe_hybridep_num_sms``) while they run, slowing the compute beside them."""
    cluster = build_cluster("gb200", 256)
    par = ParallelConfig(tp=1, pp=8, vp=3, ep=32, micro_batch_size=1, schedule="interleaved")
    plain = _moe_layer(Software(moe_dispatcher="hybridep"), cluster, par)
    over = _moe_layer(Software(moe_dispatcher="hybridep", moe_a2a_overlap=True), cluster, par)
    slow = _sm_slow(DISPATCHER_SMS["hybridep"] / 148, plain)  # Blackwell: 148 SMs (NVIDIA, "Inside Blackwell Ultra")
    assert 1 < slow <= 1 / (1 - DISPATCHER_SMS["hybridep"] / 148)
    assert over.forward_s == pytest.approx(plain.forward_s * slow)
    assert over.ep_s < plain.ep_s
    assert over.ep_s >= max(0.0, plain.ep_s - (plain.forward_s + plain.backward_s) * slow)


def test_a2a_overlap_is_priced_as_the_schedule_runs() -> None:
    """Megatron-Core's A2A overlap issues a layer's forward (micro-batch i) and backward (j) onto two streams, each
    micro-batch's nodes chained by its event (cost_models.a2a_overlap; test_a2a_overlap checks the order against the
    installed megatron-core). A short attention forward cannot hide a long combine backward even when the layer's
    total compute exceeds the total traffic: comb_b 1 beside attn_f 0.1, then mlp_b 1 waits for it; dispatch_f 1
    beside mlp_b 1; dispatch_b 1 (after mlp_b) beside mlp_f 0.5 (after dispatch_f); combine_f 1 (after mlp_f and
    dispatch_b) beside attn_b 3. Step = 1 + 1 + 1 + 3 = 6 against 4.6 of compute: 1.4 shows."""
    assert a2a_overlap_exposed_s([1.0, 1.0, 1.0, 1.0], OverlapNodes(0.1, 3.0, 0.5, 1.0)) == pytest.approx(1.4)
    # In layer_cost: H100 nodes (ep 32 over four nodes) with its parts and compute split, recomputed
    cluster = build_cluster("h100-sxm", 256)
    par = ParallelConfig(tp=2, pp=8, vp=4, ep=32, micro_batch_size=1, schedule="interleaved")
    sw = Software(moe_a2a_overlap=True)
    model, rt = load_model(QWEN), _rt(sw, cluster, par)
    graph = graphs_for(model, JOB.seq_len)["moe"]
    stride = RankStrides.megatron(par.tp, par.cp, par.dp(cluster.num_gpus)).ep
    parts = moe_all_to_all_parts(model, cluster, JOB, 4096 / 2, 32, stride, rho=cluster.efficiency.moe_imbalance)
    nodes = a2a_overlap_compute_split(graph, model, cluster, JOB, par, rt)
    # NCCL's all-to-all over four nodes holds 16 of the H100's 132 SMs (its p2p channels: gpus.yaml) beside compute
    f, a2a = 16 / 132, sum(p[0] for p in parts)
    compute = nodes.attn_f + nodes.attn_b + nodes.mlp_f + nodes.mlp_b + nodes.comb_f + nodes.comb_b
    slow = 1 + f * min(a2a, compute / (1 - f)) / compute  # while the all-to-alls run (layer_cost.a2a_sm_slowdown)
    nodes = OverlapNodes(*(x * slow for x in (nodes.attn_f, nodes.attn_b, nodes.mlp_f, nodes.mlp_b, nodes.comb_f,
                                              nodes.comb_b)))
    cost = _moe_layer(sw, cluster, par)
    assert cost.forward_s == pytest.approx(nodes.attn_f + nodes.mlp_f + nodes.comb_f)
    assert cost.ep_s == pytest.approx(a2a_overlap_exposed_s([p[0] for p in parts], nodes))
    assert cost.ep_s > 0.0
    # The ``moe`` recompute module re-runs dispatch and combine inside the backward's recompute, outside the
    # overlap's phases: those four all-to-alls stay exposed on top of the overlapped ones.
    moe_rc = par.model_copy(update={"recompute": "selective", "recompute_modules": ("moe",)})
    rerun = _moe_layer(sw, cluster, moe_rc)
    again = rerun.ep_bytes / cost.ep_bytes - 1  # the share of the four all-to-alls re-sent (forward dispatch+combine)
    assert again > 0
    assert rerun.ep_s == pytest.approx(cost.ep_s + again * sum(p[0] for p in parts))


def test_hybridep_sends_one_copy_per_remote_domain() -> None:
    """Across NVLink domains HybridEP (like DeepEP) sends a token once per remote domain over the NIC; NCCL's
    alltoall sends every remote copy. Inside one domain the two move the same bytes, NCCL's at its own all-to-all
    busbw (``a2a_link_ratio`` of ``link_bus``), HybridEP's at the ring's (``link_bus``)."""
    model = load_model(QWEN)
    cross = build_cluster("h100-sxm", 256)  # ep 16 spans two 8-GPU nodes
    a2a_s, a2a_b = moe_all_to_all(model, cross, JOB, 4096, 16, dispatcher="alltoall")
    hyb_s, hyb_b = moe_all_to_all(model, cross, JOB, 4096, 16, dispatcher="hybridep")
    dee_s, dee_b = moe_all_to_all(model, cross, JOB, 4096, 16, dispatcher="deepep")
    assert hyb_s < a2a_s and (hyb_s, hyb_b) == (dee_s, dee_b)  # bf16 job: DeepEP's fp8 dispatch does not apply
    nvl72 = build_cluster("gb200", 256)
    (hyb_s, hyb_b), (a2a_s, a2a_b) = (moe_all_to_all(model, nvl72, JOB, 4096, 32, dispatcher=d)
                                      for d in ("hybridep", "alltoall"))
    lat = 4 * 31 * nvl72.gpu.link_latency_us * 1e-6
    eff = nvl72.efficiency
    assert hyb_b == a2a_b and (a2a_s - lat) / (hyb_s - lat) == pytest.approx(1 / eff.a2a_link_ratio)


@pytest.mark.parametrize("sw, par, match", [
    (Software(moe_a2a_overlap=True), ParallelConfig(tp=1, pp=8, ep=8), "virtual pipeline"),
    (Software(moe_a2a_overlap=True), ParallelConfig(tp=1, pp=1, ep=1), "expert parallelism"),
    (Software(moe_a2a_overlap=True), ParallelConfig(tp=1, pp=1, ep=8, recompute="full"), "full recomputation"),
    (Software(moe_dispatcher="deepep", moe_capacity_factor=1.0), ParallelConfig(tp=1, pp=1, ep=8), "capacity"),
])
def test_refusals(sw: Software, par: ParallelConfig, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        _rt(sw, build_cluster("h100-sxm", 64), par)


def test_moe_knob_on_a_dense_model_is_refused() -> None:
    cluster, par = build_cluster("h100-sxm", 8), ParallelConfig(tp=1, pp=1)
    rt = MEGATRON.resolve(Software(moe_force_balance=True), JOB, cluster, par)
    with pytest.raises(ConfigError, match="dense model"):
        MEGATRON.check_runtime(load_model("llama3-8b"), cluster, JOB, par, rt)


def test_estimate_with_knobs_and_catalog_default_unchanged() -> None:
    """Unset knobs price as before (the catalog's dispatcher, no overlap, its ρ); the knobs move the step."""
    model, cluster = load_model(QWEN), build_cluster("b200", 64)
    par = ParallelConfig(tp=1, pp=8, vp=2, ep=8, micro_batch_size=1, schedule="interleaved")
    base = estimate(model, cluster, JOB, par, target="megatron")
    same = estimate(model, cluster, JOB, par, target="megatron", software=Software(moe_dispatcher="alltoall"))
    assert same.step_time_s == base.step_time_s
    over = estimate(model, cluster, JOB, par, target="megatron",
                    software=Software(moe_a2a_overlap=True, moe_force_balance=True))
    assert over.step_time_s < base.step_time_s
    assert over.time.exposed_comm_s.get("ep", 0.0) < base.time.exposed_comm_s["ep"]


def test_emitted_flags_reach_megatron_core(tmp_path) -> None:  # noqa: ANN001
    """The knobs are emitted as Megatron-LM flags and megatron-core's TransformerConfig accepts them."""
    TransformerConfig = pytest.importorskip("megatron.core.transformer").TransformerConfig

    from autoplan.validate.megatron_checks import transformer_config_kwargs
    from autoplan.validate.megatron_lm import stand_in_te_version

    stand_in_te_version()  # what the validate path does first: no Transformer Engine on this CPU machine
    ns = emitted_megatron_args(["--model", QWEN, "--gpu", "gb200", "--gpus", "256", "--tp", "1", "--pp", "8",
                                "--vp", "3", "--ep", "32", "--mbs", "1", "--global-batch-size", "8192",
                                "--seq-len", "4096", "--schedule", "interleaved",
                                "--account-for-embedding-in-pipeline-split", "--account-for-loss-in-pipeline-split",
                                "--moe-dispatcher", "hybridep", "--moe-a2a-overlap", "--moe-force-balance",
                                "--target", "megatron"], tmp_path)
    assert ns.moe_token_dispatcher_type == "flex" and ns.moe_flex_dispatcher_backend == "hybridep"
    assert ns.overlap_moe_expert_parallel_comm and ns.moe_router_force_load_balancing
    _, kw = transformer_config_kwargs(ns)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cfg = TransformerConfig(**kw)
    assert cfg.overlap_moe_expert_parallel_comm and cfg.moe_flex_dispatcher_backend == "hybridep"
    drop = emitted_megatron_args(["--model", QWEN, "--gpu", "b200", "--gpus", "64", "--tp", "1", "--pp", "8",
                                  "--ep", "8", "--mbs", "1", "--global-batch-size", "1024", "--seq-len", "4096",
                                  "--account-for-embedding-in-pipeline-split", "--account-for-loss-in-pipeline-split",
                                  "--moe-capacity-factor", "1.0", "--target", "megatron"], tmp_path / "drop")
    assert drop.moe_token_dispatcher_type == "alltoall" and drop.moe_expert_capacity_factor == 1.0
    assert drop.moe_pad_expert_input_to_capacity
    _, kw = transformer_config_kwargs(drop)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert TransformerConfig(**kw).moe_pad_expert_input_to_capacity


def test_host_bound_layer_waits_for_its_host() -> None:
    """``moe_host_s_per_expert`` (0 without a target; Megatron-Core's fitted value in gpus.yaml frameworks), the host's
    time proportional to the rank's experts. Drop-and-pad (no host sync): the layer takes max(device, host). Dropless
    (the dispatcher blocks the host each layer forward until the device reaches the experts): the forward's expert
    issue (4 of TE's 10 per-expert kernels) overlaps only the device work after the sync, the backward's its own
    device work; the estimate reports the wait and a step carries it."""
    model = load_model(QWEN)
    base_cluster = build_cluster("b200", 64)
    par = ParallelConfig(tp=1, pp=8, ep=8, micro_batch_size=1, account_for_embedding_in_pipeline_split=True,
                         account_for_loss_in_pipeline_split=True)
    experts = model.num_experts // par.ep
    drop = Software(moe_capacity_factor=1.0)

    def at(host_s: float):  # the cluster with ``host_s`` of host time per layer-micro-batch
        return base_cluster.model_copy(update={"efficiency": base_cluster.efficiency.model_copy(
            update={"moe_host_s_per_expert": host_s / experts})})

    device = _moe_layer(drop, base_cluster, par)
    assert device.host_s == 0.0
    bound = _moe_layer(drop, at(1.5 * device.total_s), par)
    assert bound.host_s == pytest.approx(0.5 * device.total_s)
    assert bound.total_s == pytest.approx(1.5 * device.total_s)
    assert _moe_layer(drop, at(0.5 * device.total_s), par).host_s == 0.0  # device-bound: nothing shows
    # dropless, recomputed from the layer's forward share and post-sync window: the window is the experts' forward
    # and the dispatch all-to-all (alltoall issues it after its sync point)
    plain = _moe_layer(Software(), base_cluster, par)
    graph = graphs_for(model, JOB.seq_len)["moe"]
    rt = _rt(Software(), base_cluster, par)
    expert_f = sum(op_compute(op, graph, model, base_cluster, JOB, par, rt).forward_s for op in graph.ops
                   if op.kind == "experts")
    stride = RankStrides.megatron(par.tp, par.cp, par.dp(base_cluster.num_gpus)).ep
    disp_f = moe_all_to_all_parts(model, base_cluster, JOB, 4096, 8, stride, rho=moe_load_imbalance(
        model, JOB, par, base_cluster, rt))[0][0]
    assert plain.sync_window_s == pytest.approx(expert_f + disp_f)
    for h in (1.5 * plain.total_s, 0.9 * plain.total_s):
        synced = _moe_layer(Software(), at(h), par)
        want = max(0.0, 0.4 * h - plain.sync_window_s) + max(0.0, 0.6 * h - (1 - plain.forward_share) * plain.total_s)
        assert synced.host_s == pytest.approx(want)
    # below the device's time the synced layer still waits (its forward's issue cannot run ahead); max() would not
    assert _moe_layer(Software(), at(0.9 * plain.total_s), par).host_s > 0.0
    a = estimate(model, base_cluster, JOB, par, target="megatron")
    b = estimate(model, at(1.5 * plain.total_s), JOB, par, target="megatron")
    assert a.time.host_bound_s == 0.0 and b.time.host_bound_s > 0.0
    assert b.step_time_s > a.step_time_s + 0.9 * b.time.host_bound_s


def test_cluster_profile_moe_settings_are_resolved_checked_and_emitted() -> None:
    """A cluster profile's (or the catalog's) dispatcher and A2A overlap are what the runtime carries: the checks
    see them (the overlap on pp 4 without vp is Megatron's refusal) and the knob line reports them."""
    base = build_cluster("h100-sxm", 64)
    eff = base.efficiency.model_copy(update={"moe_dispatcher": "deepep", "moe_a2a_overlap": True})
    cluster = base.model_copy(update={"efficiency": eff})
    ok = ParallelConfig(tp=2, pp=4, vp=2, ep=8, micro_batch_size=1, schedule="interleaved")
    rt = _rt(Software(), cluster, ok)
    assert (rt.moe_dispatcher, rt.moe_a2a_overlap) == ("deepep", True)
    assert (_rt(Software(), base, ok).moe_dispatcher, _rt(Software(), base, ok).moe_a2a_overlap) == \
        (base.efficiency.moe_dispatcher, base.efficiency.moe_a2a_overlap)
    with pytest.raises(ConfigError, match="1857-1861"):
        _rt(Software(), cluster, ParallelConfig(tp=2, pp=4, ep=8, micro_batch_size=1))


def test_a2a_overlap_mtp_refusals() -> None:
    """Megatron refuses the overlap with more than one MTP layer, and with MTP on pp 1 (TC:1889-1897)."""
    cluster = build_cluster("h100-sxm", 256)
    job = JobSpec(global_batch_size=512, seq_len=4096)
    v3 = load_model("deepseek-v3")
    two = v3.model_copy(update={"arch": v3.arch.model_copy(update={"mtp_layers": 2})})
    sw = Software(moe_a2a_overlap=True)
    for model, par, match in ((two, ParallelConfig(pp=8, vp=2, ep=32, schedule="interleaved"), "1889-1891"),
                              (v3, ParallelConfig(pp=1, ep=32), "1892-1897")):
        rt = MEGATRON.resolve(sw, job, cluster, par)
        with pytest.raises(ConfigError, match=match):
            MEGATRON.check_runtime(model, cluster, job, par, rt)


def test_capacity_factor_must_be_finite() -> None:
    with pytest.raises(ValueError):
        Software(moe_capacity_factor=math.inf)


def test_nccl_alltoall_takes_its_p2p_channels_sms() -> None:
    """NCCL runs one CTA per p2p channel with work; an all-to-all fills the communicator's p2p channels (H100: 32
    inside a node, 16 across nodes, as NCCL logs them on p5.48xlarge; H800: 16 in a node, nccl#892), fewer across
    nodes where 2 per remote peer cannot fill them. GPUs without a public log price none (as before)."""
    h100 = build_cluster("h100-sxm", 256)
    assert nccl_alltoall_ctas(h100, 8, 1) == 32  # one node
    assert nccl_alltoall_ctas(h100, 32, 2) == 16  # ep 32 at stride 2: eight nodes
    assert nccl_alltoall_ctas(h100, 2, 8) == 2  # one remote peer: 2 channels
    assert nccl_alltoall_ctas(h100, 1, 1) == 0
    assert nccl_alltoall_ctas(build_cluster("h800", 8), 8, 1) == 16
    assert nccl_alltoall_ctas(build_cluster("gb200", 64), 64, 1) == 0
    assert dispatcher_sm_fraction("alltoall", h100, 16, 1) == pytest.approx(16 / 132)
    assert dispatcher_sm_fraction("hybridep", h100, 16, 1) == pytest.approx(DISPATCHER_SMS["hybridep"] / 132)


def test_nccl_alltoall_slows_compute_only_under_the_overlap() -> None:
    """The all-to-all's SMs cost compute only where the two run side by side (the A2A overlap): Qwen3-235B on H100,
    ep 16 over two nodes, the layer's compute slower by 16 of 132 SMs for as long as its all-to-alls run with the
    overlap, unchanged without it."""
    cluster = build_cluster("h100-sxm", 256)
    par = ParallelConfig(tp=1, pp=8, vp=4, ep=16, micro_batch_size=1, schedule="interleaved")
    plain = _moe_layer(Software(moe_dispatcher="alltoall"), cluster, par)
    over = _moe_layer(Software(moe_dispatcher="alltoall", moe_a2a_overlap=True), cluster, par)
    slow = _sm_slow(16 / 132, plain)
    assert 1 < slow <= 1 / (1 - 16 / 132)
    assert over.forward_s == pytest.approx(plain.forward_s * slow)
    assert over.backward_s == pytest.approx(plain.backward_s * slow)
    gb200 = build_cluster("gb200", 256)  # no NCCL channel log in the catalog: compute unchanged
    par = par.model_copy(update={"ep": 32})
    assert _moe_layer(Software(moe_dispatcher="alltoall", moe_a2a_overlap=True), gb200, par).forward_s == \
        pytest.approx(_moe_layer(Software(moe_dispatcher="alltoall"), gb200, par).forward_s)


def test_sm_based_dispatcher_needs_the_gpus_sm_count() -> None:
    """DeepEP / HybridEP take SMs from compute: the share comes from the catalog's sm_count (H800: 20 of 132, the
    DeepSeek-V3 report §3.2.2); a GPU without one (AMD) is refused rather than priced with another GPU's count."""
    assert dispatcher_sm_fraction("deepep", build_cluster("h800", 8)) == pytest.approx(20 / 132)
    assert dispatcher_sm_fraction("alltoall", build_cluster("mi300x", 8)) == 0.0
    with pytest.raises(ConfigError, match="sm_count"):
        dispatcher_sm_fraction("deepep", build_cluster("mi300x", 8))



def _megatron_dispatcher_source() -> list[str] | None:
    """Lines of the installed megatron-core 0.16.1's token_dispatcher.py (the target's version), or None."""
    import importlib.util
    from pathlib import Path

    try:
        spec = importlib.util.find_spec("megatron.core.transformer.moe")
    except ModuleNotFoundError:
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    from megatron.core import package_info

    if package_info.__version__ != "0.16.1":  # the lines cited are core_v0.16.1's
        return None
    return (Path(list(spec.submodule_search_locations)[0]) / "token_dispatcher.py").read_text().splitlines()


def test_permutation_passes_are_the_dispatchers_own() -> None:
    """``moe.permutation_passes``: Megatron-Core's alltoall dispatcher permutes the routed copies before its
    all-to-all and, where the rank holds more than one expert, sorts them by local expert after it ("Permutation 2";
    the combine undoes both); DeepEP and HybridEP permute once. Read from the installed megatron-core (0.16.1, the
    target's version) where it is there, then priced: dispatch / combine move PERMUTE_BYTES per routed copy per
    pass."""
    from cost_models.op_traffic import PERMUTE_BYTES, op_traffic_bytes
    from cost_models.moe import MEGATRON_PERMUTE_PASSES, permutation_passes

    src = _megatron_dispatcher_source()
    if src is not None:
        def lines(first: int, last: int) -> str:
            return "\n".join(src[first - 1:last])

        assert "permute(" in lines(633, 644) and "unpermute(" in lines(833, 840)
        assert "Permutation 2: Sort tokens by local expert" in lines(703, 703)
        assert "if self.num_local_experts > 1:" in lines(707, 707) and "sort_chunks_by_idxs(" in lines(732, 737)
        assert ".transpose(0, 1)" in lines(708, 730) and ".contiguous()" in lines(708, 730)  # drop-and-pad
        assert "Unpermutation 2" in lines(752, 752) and "sort_chunks_by_idxs(" in lines(767, 772)
        assert "return hidden_states, self.dispatched_probs" in lines(1078, 1079)  # HybridEP: in its library
        assert "permute(" in lines(1298, 1304) and "unpermute(" in lines(1310, 1316)  # DeepEP: once each way
    assert set(MEGATRON_PERMUTE_PASSES) == {"alltoall", "deepep", "hybridep"}

    model = load_model(QWEN)
    cluster = build_cluster("b200", 64)
    graph = graphs_for(model, JOB.seq_len)["moe"]
    disp = next(op for op in graph.ops if op.kind == "dispatch")
    comb = next(op for op in graph.ops if op.kind == "combine")
    copies = 4096 * model.moe_top_k * model.hidden_size  # routed copies x width, one micro-batch, tp 1
    for ep, dispatcher, passes in ((8, "alltoall", 2), (128, "alltoall", 1), (8, "deepep", 1), (8, "hybridep", 1)):
        par = ParallelConfig(tp=1, pp=8, ep=ep, micro_batch_size=1)
        rt = _rt(Software(moe_dispatcher=dispatcher), cluster, par)
        n = permutation_passes(cluster, model.num_experts // ep, rt)
        assert n == passes
        for op in (disp, comb):
            got = op_traffic_bytes(op, graph, model, JOB, par, rt, permute_passes=n)
            assert got == pytest.approx((PERMUTE_BYTES[0] * copies * passes, PERMUTE_BYTES[1] * copies * passes))
    # the drop-and-pad copy of the capacity-padded chunks is the same second pass; the op's memory time carries it
    par = ParallelConfig(tp=1, pp=8, ep=8, micro_batch_size=1)
    drop = op_compute(disp, graph, model, cluster, JOB, par, _rt(Software(moe_capacity_factor=1.0), cluster, par))
    deepep = op_compute(disp, graph, model, cluster, JOB, par, _rt(Software(moe_dispatcher="deepep"), cluster, par))
    assert drop.mem_f == pytest.approx(2 * deepep.mem_f)
    assert permutation_passes(cluster, 16, None) == 1  # without a runtime (the intra-op ILP's ops): one pass


@pytest.mark.parametrize("dispatcher", ["alltoall", "hybridep", "deepep"])
def test_a2a_overlap_keeps_the_host_sync_where_the_dispatcher_syncs_after_the_backward_experts(dispatcher: str) -> None:
    """Under the A2A overlap (combined 1F1B) the backward's experts are issued before the forward's dispatch and
    experts: every dispatcher syncs in the dispatch node on the forward's attention (alltoall's D2H event, DeepEP's
    CPU wait for the routed counts, HybridEP's blocking dispatch; ``a2a_overlap.HOST_SYNC_NODE``), the backward's
    expert work still queued: the host runs ahead, max(device, host), where without the overlap the same sync drains
    the device before the forward's expert issue (the synced formula). (s13: deepep was priced as draining under the
    overlap, from the expert node's ``.item()``, which reads the CPU tensor DeepEP's dispatch returned.)"""
    model = load_model(QWEN)
    base_cluster = build_cluster("b200", 64)
    par = ParallelConfig(tp=1, pp=1, ep=8, micro_batch_size=1)
    for overlap in (True, False):
        sw = Software(moe_dispatcher=dispatcher, moe_a2a_overlap=overlap)
        device = _moe_layer(sw, base_cluster, par)
        h = 0.9 * device.total_s  # host below the device's time
        cluster = base_cluster.model_copy(update={"efficiency": base_cluster.efficiency.model_copy(
            update={"moe_host_s_per_expert": h / (model.num_experts // par.ep)})})
        layer = _moe_layer(sw, cluster, par)
        assert host_synced(cluster, par, _rt(sw, cluster, par)) is not overlap
        if overlap:
            assert layer.host_s == 0.0
        else:
            want = (max(0.0, 0.4 * h - device.sync_window_s)
                    + max(0.0, 0.6 * h - (1 - device.forward_share) * device.total_s))
            assert layer.host_s == pytest.approx(want) and layer.host_s > 0.0


def test_host_cost_has_a_per_layer_term_beside_the_per_expert_one() -> None:
    """``moe_host_s_per_layer`` (the layer's issue whatever its experts) adds to ``moe_host_s_per_expert`` × local
    experts: drop-and-pad (no sync), the layer waits max(0, host − device) with either term alone or both."""
    model = load_model(QWEN)
    base = build_cluster("b200", 64)
    par = ParallelConfig(tp=1, pp=8, ep=8, micro_batch_size=1, account_for_embedding_in_pipeline_split=True,
                         account_for_loss_in_pipeline_split=True)
    drop = Software(moe_capacity_factor=1.0)
    experts = model.num_experts // par.ep

    def at(per_layer: float, per_expert: float):  # noqa: ANN202
        return base.model_copy(update={"efficiency": base.efficiency.model_copy(
            update={"moe_host_s_per_layer": per_layer, "moe_host_s_per_expert": per_expert})})

    device = _moe_layer(drop, at(0.0, 0.0), par).total_s
    h = 1.5 * device
    assert _moe_layer(drop, at(h, 0.0), par).host_s == pytest.approx(0.5 * device)
    assert _moe_layer(drop, at(0.0, h / experts), par).host_s == pytest.approx(0.5 * device)
    assert _moe_layer(drop, at(h / 2, h / 2 / experts), par).host_s == pytest.approx(0.5 * device)


def _megatron_core_lines(module: str) -> list[str] | None:
    """Lines of an installed megatron-core 0.16.1 module (dotted name), or None."""
    import importlib.util
    from pathlib import Path

    try:
        spec = importlib.util.find_spec(module)
        from megatron.core import package_info
    except ModuleNotFoundError:
        return None
    if spec is None or spec.origin is None or package_info.__version__ != "0.16.1":
        return None
    return Path(spec.origin).read_text().splitlines()


def test_fp8_experts_pad_the_routed_rows_unless_they_come_aligned() -> None:
    """``moe.quantization_padded``: under fp8 Megatron-Core's TEGroupedMLP wraps fc1 / fc2 in TE's Fp8Padding /
    Fp8Unpadding (a copy of every routed row each way, forward and backward) unless the per-expert counts come
    aligned: HybridEP pads them in its permute, drop-and-pad gives capacity·tp·ep rows per expert (aligned or not).
    The copies are priced on fc1 (its input) and fc2 (its output) only, QUANT_PADDING_BYTES per element."""
    from cost_models.moe import quantization_padded
    from cost_models.op_traffic import QUANT_PADDING_BYTES, op_traffic_bytes

    experts = _megatron_core_lines("megatron.core.transformer.moe.experts")
    dispatcher = _megatron_dispatcher_source()
    if experts is not None and dispatcher is not None:
        assert "Fp8Padding(self.num_local_experts)" in experts[604] and "Fp8Unpadding" in experts[605]
        assert "self.config.fp8 or self.config.fp4" in experts[645] and "quantization_padding(" in experts[647]
        assert "self.quantization_unpadding(output" in experts[761]
        assert "pad_multiple = get_align_size_for_quantization" in dispatcher[1035]  # HybridEP, under fp8 / fp4
        assert "self.capacity * self.tp_size * self.ep_size" in dispatcher[496]  # drop-and-pad's rows per expert

    model = load_model(QWEN)
    cluster = build_cluster("h100-sxm", 64)
    fp8 = JobSpec(global_batch_size=1024, seq_len=4096, precision="fp8")
    par = ParallelConfig(tp=1, pp=8, ep=8, micro_batch_size=1)

    def padded(sw: Software, job: JobSpec = fp8) -> bool:
        return quantization_padded(model, job, par, cluster, _rt(sw, cluster, par, job))

    assert padded(Software(moe_dispatcher="alltoall")) and padded(Software(moe_dispatcher="deepep"))
    assert not padded(Software(moe_dispatcher="hybridep"))
    assert not padded(Software(moe_dispatcher="alltoall"), JOB)  # bf16: no TE padding
    # drop-and-pad: 4096 tokens x 8 / 128 experts = 256 per expert, x c, x ep 8 rows per local expert
    assert not padded(Software(moe_capacity_factor=1.0))  # 256 x 8 = 2048: a multiple of 16
    assert padded(Software(moe_capacity_factor=1.01))  # ceil(258.56) = 259, x 8 = 2072: not one
    assert not quantization_padded(model, fp8, par, cluster, None)
    # tp 2 with SP: each rank routes 2048 tokens, 128 per expert, x ep 8 = 1024 rows (expert-TP 1: the dispatcher's
    # tp_size is expert-TP's, not TP's); 1.01: ceil(129.28) = 130 x 8 = 1040, a multiple of 16, not of MXFP8's 32
    tp2 = ParallelConfig(tp=2, pp=4, ep=8, micro_batch_size=1, sequence_parallel=True)
    b200 = build_cluster("b200", 64)
    for gpu, recipe, want in ((cluster, "tensorwise", False), (b200, "mxfp8", True)):
        sw = Software(moe_capacity_factor=1.01, fp8_recipe=recipe)
        assert quantization_padded(model, fp8, tp2, gpu, _rt(sw, gpu, tp2, fp8)) is want, recipe
    if dispatcher is not None:
        assert "tp_size" in dispatcher[73] + dispatcher[74] + dispatcher[75] + dispatcher[76]

    graph = graphs_for(model, fp8.seq_len)["moe"]
    rt = _rt(Software(moe_dispatcher="alltoall"), cluster, par, fp8)
    copies = 4096 * model.moe_top_k  # routed rows on this rank, one micro-batch (tp 1)
    extra = {}
    for op in (o for o in graph.ops if o.kind == "experts"):
        with_pad = op_traffic_bytes(op, graph, model, fp8, par, rt, quant_padding=True)
        without = op_traffic_bytes(op, graph, model, fp8, par, rt)
        extra[op.name] = (with_pad[0] - without[0], with_pad[1] - without[1])
    row = copies * model.hidden_size  # fc1's input and fc2's output are hidden wide
    assert extra["expert_gate_proj"] == pytest.approx((QUANT_PADDING_BYTES[0] * row, QUANT_PADDING_BYTES[1] * row))
    assert extra["expert_up_proj"] == (0.0, 0.0)  # one GroupedLinear with gate: its input is padded once
    assert extra["expert_down_proj"] == pytest.approx((QUANT_PADDING_BYTES[0] * row, QUANT_PADDING_BYTES[1] * row))
    # and op_compute prices them where the rule says so: HybridEP's fc1 lacks exactly the padding's HBM time
    fc1 = next(o for o in graph.ops if o.name == "expert_gate_proj")
    a2a = op_compute(fc1, graph, model, cluster, fp8, par, rt)
    hyb = op_compute(fc1, graph, model, cluster, fp8, par, _rt(Software(moe_dispatcher="hybridep"), cluster, par, fp8))
    from cost_models.gemm import hbm_time_s
    assert a2a.mem_f - hyb.mem_f == pytest.approx(hbm_time_s(QUANT_PADDING_BYTES[0] * row, cluster), rel=1e-6)


def test_padding_copies_run_on_capacity_rows_and_in_bf16_layers_of_a_quantized_run() -> None:
    """Drop-and-pad hands every local expert its capacity rows (token_dispatcher.py:485-500), so TE's padding copies,
    like the other routed-row kernels, run on c x the routed copies (``moe.routed_rows``). A bf16 layer of an fp8 run
    (``first_last_layers_bf16``) still pads: TEGroupedMLP reads the global ``config.fp8`` and the layer only leaves
    the autocast (``moe.run_pad_align``); a bf16 run does not."""
    from dataclasses import replace

    from cost_models.gemm import hbm_time_s
    from cost_models.moe import quantization_padded, routed_rows, run_pad_align
    from cost_models.op_traffic import QUANT_PADDING_BYTES, op_traffic_bytes
    from cost_models.quant_layout import run_as

    model = load_model(QWEN)
    cluster = build_cluster("h100-sxm", 64)
    fp8 = JobSpec(global_batch_size=1024, seq_len=4096, precision="fp8")
    par = ParallelConfig(tp=1, pp=8, ep=8, micro_batch_size=1)
    graph = graphs_for(model, fp8.seq_len)["moe"]
    fc1 = next(o for o in graph.ops if o.name == "expert_gate_proj")
    row = 4096 * model.moe_top_k * model.hidden_size  # fc1's input: the routed copies, hidden wide (tp 1)

    cap = _rt(Software(moe_capacity_factor=1.01, fp8_recipe="tensorwise"), cluster, par, fp8)
    assert quantization_padded(model, fp8, par, cluster, cap) and routed_rows(model, fp8, par, cluster, cap) == 1.01
    got = op_compute(fc1, graph, model, cluster, fp8, par, cap)
    copies = op_traffic_bytes(fc1, graph, model, fp8, par, cap, quant_padding=True)[0]
    assert copies - op_traffic_bytes(fc1, graph, model, fp8, par, cap)[0] == pytest.approx(QUANT_PADDING_BYTES[0] * row)
    assert got.mem_f == pytest.approx(hbm_time_s(copies * 1.01, cluster)
                                      + got.gemm_f * cluster.efficiency.memory_bound_fraction, rel=1e-9)

    for gpu, recipe, align in (("h100-sxm", "tensorwise", 16), ("b200", "mxfp8", 32)):
        c = build_cluster(gpu, 64)
        rt = _rt(Software(moe_dispatcher="alltoall", fp8_recipe=recipe), c, par, fp8)
        job_b, rt_b = run_as(fp8, rt, "bf16")
        assert job_b.precision == "bf16" and rt_b.fp8_recipe is None and rt_b.quantized_run == recipe
        assert run_pad_align(job_b, rt_b) == run_pad_align(fp8, rt) == align
        assert quantization_padded(model, job_b, par, c, rt_b)
        bare = replace(rt_b, quantized_run=None)  # what a bf16 run's layer is
        assert run_pad_align(job_b, bare) == 0 and not quantization_padded(model, job_b, par, c, bare)
        extra = op_compute(fc1, graph, model, c, job_b, par, rt_b).mem_f \
            - op_compute(fc1, graph, model, c, job_b, par, bare).mem_f
        assert extra == pytest.approx(hbm_time_s(QUANT_PADDING_BYTES[0] * row, c), rel=1e-9)
    bf16 = _rt(Software(moe_dispatcher="alltoall"), cluster, par, JOB)
    assert not quantization_padded(model, JOB, par, cluster, bf16)
