"""The intra-op pass on real layers: the Megatron pattern, GQA limits, memory pressure, targets, cache."""

from __future__ import annotations

import itertools
from collections import Counter

import numpy as np
import pytest

import search.intra_op as intra_op
from autoplan.catalog import build_cluster, load_model
from cost_models.errors import ConfigError, InfeasibleError
from search.intra_op import (
    IlpSolution,
    IntraOpCache,
    IntraOpRequest,
    IntraOpResult,
    build_layer_problem,
    prune_dominated,
    solve_ilp,
    solve_layer,
)
from search.mesh import LogicalMesh, MeshAxis
from cost_models.layer_cost import tp_exposed_fraction

GiB = 2**30
MEGATRON_COLUMN = ("q_proj", "gate_proj", "up_proj", "k_proj", "v_proj")
MEGATRON_ROW = ("o_proj", "down_proj")


@pytest.fixture(scope="module")
def llama70b():
    return load_model("llama3-70b")


@pytest.fixture(scope="module")
def mesh_dp16_tp8():
    return LogicalMesh.from_degrees(build_cluster("h100-sxm", 1024), dp=16, tp=8)


def req(**kw) -> IntraOpRequest:
    return IntraOpRequest(**{"kind": "dense", "seq_len": 8192, "num_microbatches": 8, **kw})


def tp_counts(r: IntraOpResult, phase: str, exposed_only: bool = True) -> Counter:
    return Counter(k.kind for _, k in r.collectives(MeshAxis.TP, phase) if not (exposed_only and k.overlapped)
                   for _ in range(int(k.count)))


# ---- sanity: llama3-70b on dp16 × tp8 is Megatron's pattern ------------------------------------------
@pytest.mark.parametrize("target", ["megatron", "torchtitan", "any"])
def test_llama70b_megatron_pattern(llama70b, mesh_dp16_tp8, target) -> None:
    r = solve_layer(llama70b, mesh_dp16_tp8, req(target=target))
    assert r.status == "optimal"
    for op in MEGATRON_COLUMN:
        assert r.strategy(op).tp in ("col", "col_sp"), op
    for op in MEGATRON_ROW:
        assert r.strategy(op).tp in ("row", "row_sp"), op
    assert r.strategy("attn_core").tp == "F" and not r.strategy("attn_core").kv_replicated
    dp = mesh_dp16_tp8.axes.index(MeshAxis.DP)
    for c in r.choices:  # batch on dp everywhere
        assert all(lay[dp] == "B" for _, lay in c.strategy.in_layouts + c.strategy.out_layouts)
    assert r.reshards == ()  # layouts line up along every edge, including layer_out → next layer_in


def test_without_sp_two_plus_two_all_reduces(llama70b, mesh_dp16_tp8) -> None:
    r = solve_layer(llama70b, mesh_dp16_tp8, req(target="megatron", sequence_parallel=False))
    assert tp_counts(r, "fwd") == Counter(all_reduce=2)  # o_proj, down_proj (Megatron's g)
    assert tp_counts(r, "bwd") == Counter(all_reduce=2)  # QKV, gate/up input grads (Megatron's f)
    assert {n for n, k in r.collectives(MeshAxis.TP, "fwd")} == {"o_proj", "down_proj"}
    assert r.strategy("attn_norm").tp == "R"
    # Payload = the full activation 2·s·b·h bytes (COST_MODEL.md §4).
    s, b, h = 8192, 1, llama70b.hidden_size
    assert all(k.payload_bytes == pytest.approx(2 * s * b * h) for _, k in r.collectives(MeshAxis.TP, "fwd"))


def test_with_sp_all_gather_reduce_scatter_pairs(llama70b, mesh_dp16_tp8) -> None:
    r = solve_layer(llama70b, mesh_dp16_tp8, req(target="megatron", sequence_parallel=True))
    assert tp_counts(r, "fwd") == Counter(all_gather=2, reduce_scatter=2)
    assert tp_counts(r, "bwd") == Counter(all_gather=2, reduce_scatter=2)
    assert r.strategy("attn_norm").tp == "S" and r.strategy("q_proj").tp == "col_sp"
    # Same bytes as the all-reduces (AR = RS + AG), and activations between TP regions ÷ t.
    no_sp = solve_layer(llama70b, mesh_dp16_tp8, req(target="megatron", sequence_parallel=False))
    assert r.activation_bytes < no_sp.activation_bytes


def test_solver_chooses_sp_for_megatron_when_free_to(llama70b, mesh_dp16_tp8) -> None:
    r = solve_layer(llama70b, mesh_dp16_tp8, req(target="megatron"))
    sp = {c.strategy.tp.endswith("sp") or c.strategy.tp == "S" for c in r.choices if c.strategy.tp != "F"}
    assert sp == {True}  # one SP flag per layer (tie), and SP is the cheaper one


# ---- GQA: tp=16 with 8 KV heads ---------------------------------------------------------------------
def test_tp16_across_hgx_domains_rejected_for_launch_targets(llama70b) -> None:
    mesh = LogicalMesh.from_degrees(build_cluster("h100-sxm", 1024), dp=8, tp=16)
    for target in ("megatron", "torchtitan"):
        with pytest.raises(ConfigError, match="spans NVLink domains"):
            solve_layer(llama70b, mesh, req(target=target))
    r = solve_layer(llama70b, mesh, req(target="any"))  # any: tp only as a sequence axis there
    assert r.strategy("attn_core").tp != "F"
    assert all(c.strategy.tp in ("S", "seq") for c in r.choices)


@pytest.fixture(scope="module")
def nvl72_tp16():
    # A 64-GPU NVLink domain that 16 divides: on NVL72 some 16-rank group would straddle two racks.
    return LogicalMesh.from_degrees(build_cluster("gb200", 128, nvlink_domain_size=64), dp=8, tp=16)


@pytest.mark.parametrize("target", ["megatron", "torchtitan"])
def test_tp16_head_sharding_not_allowed(llama70b, nvl72_tp16, target) -> None:
    with pytest.raises(ConfigError, match=r"tp=16 does not divide num_kv_heads=8.*valid: 1, 2, 4, 8"):
        solve_layer(llama70b, nvl72_tp16, req(target=target))


def test_tp16_any_heads_only_with_priced_kv_replication(llama70b, nvl72_tp16) -> None:
    lp = build_layer_problem(llama70b, nvl72_tp16, req(target="any"))
    names = [n.name for n in lp.nodes]
    qkv = lp.strategies[names.index("q_proj+k_proj+v_proj")]
    attn = lp.strategies[names.index("attn_core")]
    assert all(s.kv_replicated for s in attn if s.tp == "F") and any(s.tp == "F" for s in attn)
    col = next(s for s in qkv if s.tp == "col" and s.zero == 0)
    h, q, kv = llama70b.hidden_size, llama70b.q_dim, llama70b.kv_dim
    # Each rank holds q/16 of the query weights but a whole KV head (kv/8): 2× the naive kv/16.
    assert col.state_bytes == pytest.approx(16 * (h * q / 16 + 2 * h * kv / 8))
    f_attn = next(s for s in attn if s.tp == "F")
    naive = sum(x.bytes_per_token for op in lp.nodes[names.index("attn_core")].ops for x in op.saved) * 8192 / 16
    assert f_attn.activation_bytes > naive  # K, V saved ÷ 8, not ÷ 16
    r = solve_layer(llama70b, nvl72_tp16, req(target="any"))
    assert r.strategy("attn_core").tp != "F" or r.strategy("attn_core").kv_replicated


# ---- memory pressure → parameter sharding on the data axis -------------------------------------------
@pytest.mark.parametrize("target", ["any", "megatron"])
def test_memory_pressure_moves_to_zero3(llama70b, mesh_dp16_tp8, target) -> None:
    free = solve_layer(llama70b, mesh_dp16_tp8, req(target=target))
    assert all(c.strategy.zero in (None, 0, 1) for c in free.choices)
    limit = free.activation_bytes + 0.25 * free.state_bytes
    tight = solve_layer(llama70b, mesh_dp16_tp8, req(target=target, memory_limit_bytes=limit))
    assert tight.memory_bytes <= limit < free.memory_bytes
    assert tight.objective_s > free.objective_s  # cost goes up …
    assert tight.state_bytes < free.state_bytes  # … memory goes down
    zeros = [c.strategy.zero for c in tight.choices if c.strategy.zero is not None]
    assert 3 in zeros
    if target == "megatron":
        assert set(zeros) == {3}  # one ZeRO stage per layer
    with pytest.raises(InfeasibleError, match="does not fit"):
        solve_layer(llama70b, mesh_dp16_tp8, req(target=target, memory_limit_bytes=0.5 * free.activation_bytes))


# ---- targets never get strategies they cannot launch -------------------------------------------------
LAUNCHABLE_TP = {
    "megatron": {"R", "S", "col", "col_sp", "row", "row_sp", "F", "vocab", "vocab_sp", "rep", "seq"},
    "torchtitan": {"R", "S", "col", "col_sp", "row", "row_sp", "F", "vocab", "vocab_sp", "rep", "seq"},
}


@pytest.mark.parametrize("target", ["megatron", "torchtitan"])
@pytest.mark.parametrize("model,kind,degrees", [
    ("llama3-70b", "dense", dict(dp=16, tp=8)), ("llama3-70b", "dense", dict(dp=4, cp=4, tp=8)),
    ("llama3-70b", "head", dict(dp=16, tp=8)), ("llama3-70b", "embedding", dict(dp=16, tp=8)),
    ("mixtral-8x7b", "moe", dict(dp=32, ep=8, tp=4)), ("llama3-8b", "dense", dict(dp=128, tp=1)),
])
def test_target_rules(target, model, kind, degrees) -> None:
    spec = load_model(model)
    mesh = LogicalMesh.from_degrees(build_cluster("h100-sxm", 1024), **degrees)
    for limit in (None, 1.0 * GiB):
        try:
            r = solve_layer(spec, mesh, req(kind=kind, target=target, memory_limit_bytes=limit))
        except InfeasibleError:
            continue
        zeros = {c.strategy.zero for c in r.choices} - {None}
        assert len(zeros) == 1 and zeros <= {"megatron": {0, 1, 3}, "torchtitan": {0, 2, 3}}[target]
        assert all(c.strategy.tp in LAUNCHABLE_TP[target] and not c.strategy.kv_replicated for c in r.choices)
        eps = {c.strategy.ep for c in r.choices if c.node in ("dispatch", "combine") or "expert" in c.node}
        assert len(eps) <= 1
        if target == "megatron" and mesh.size(MeshAxis.TP) > 1:
            matmul_modes = {c.strategy.tp for c in r.choices if c.node in ("q_proj+k_proj+v_proj", "o_proj")}
            assert matmul_modes in ({"col", "row"}, {"col_sp", "row_sp"}) or kind != "dense"


# ---- layer-level exactness and the fallback ----------------------------------------------------------
def test_layer_ilp_matches_brute_force(llama70b, mesh_dp16_tp8) -> None:
    lp = build_layer_problem(llama70b, mesh_dp16_tp8, req(target="megatron"))
    p = lp.problem
    best = min(p.evaluate(c)[0] for c in itertools.product(*(range(c.size) for c in p.node_cost)) if p.feasible(c))
    sol = solve_ilp(p)
    assert sol.status == "optimal" and sol.objective == pytest.approx(best, rel=1e-7)
    pruned = prune_dominated(build_layer_problem(llama70b, mesh_dp16_tp8, req(target="any")).problem)
    assert solve_ilp(pruned.problem).objective == pytest.approx(
        solve_ilp(build_layer_problem(llama70b, mesh_dp16_tp8, req(target="any")).problem).objective, rel=1e-7)


def test_timeout_falls_back_to_uniform_megatron(llama70b, mesh_dp16_tp8, monkeypatch) -> None:
    optimal = solve_layer(llama70b, mesh_dp16_tp8, req(target="any"))
    monkeypatch.setattr(intra_op, "solve_ilp", lambda p, **kw: IlpSolution("timeout", None, None, None, 1.0, 0))
    r = solve_layer(llama70b, mesh_dp16_tp8, req(target="any"))
    assert r.status == "fallback"
    assert r.strategy("q_proj").tp == "col_sp" and r.strategy("down_proj").tp == "row_sp"
    assert len({c.strategy.zero for c in r.choices} - {None}) == 1
    assert r.objective_s >= optimal.objective_s * (1 - 1e-9)


# ---- cache -------------------------------------------------------------------------------------------
def test_cache_hits_and_misses(llama70b, mesh_dp16_tp8) -> None:
    cache = IntraOpCache()
    a = solve_layer(llama70b, mesh_dp16_tp8, req(), cache=cache)
    b = solve_layer(llama70b, mesh_dp16_tp8, req(), cache=cache)
    assert a is b and (cache.hits, cache.misses) == (1, 1)
    solve_layer(llama70b, mesh_dp16_tp8, req(micro_batch_size=2), cache=cache)
    solve_layer(llama70b, mesh_dp16_tp8, req(recompute="full"), cache=cache)
    other = LogicalMesh.from_degrees(build_cluster("h100-sxm", 1024), dp=32, tp=4)
    solve_layer(llama70b, other, req(), cache=cache)
    assert (cache.hits, cache.misses, len(cache)) == (1, 4, 4)
    assert cache.hit_rate == pytest.approx(0.2)
    for _ in range(2):  # a "does not fit" is cached too
        with pytest.raises(InfeasibleError):
            solve_layer(llama70b, mesh_dp16_tp8, req(memory_limit_bytes=1.0), cache=cache)
    assert (cache.hits, cache.misses) == (2, 5)


@pytest.mark.parametrize("degrees", [dict(dp=16, tp=8), dict(dp=4, cp=4, tp=8), dict(dp=64, tp=2)])
@pytest.mark.parametrize("recompute", ["none", "selective", "full"])
@pytest.mark.parametrize("sp", [True, False])
@pytest.mark.parametrize("kind", ["dense", "head"])
def test_megatron_pattern_agrees_with_uniform_layer_cost(llama70b, degrees, recompute, sp, kind) -> None:
    """Differential: the ILP's Megatron choice, costed per op, against ``cost_models``' closed uniform-layer
    models (``layer_cost``: TP collective counts, GEMM shapes, FlashAttention factors; ``memory``: saved
    activations, Korthikanti Table 2)."""
    from cost_models.layer_cost import layer_cost
    from cost_models.memory import activation_bytes_per_microbatch
    from cost_models.opgraph import layer_graph
    from cost_models.specs import JobSpec, ParallelConfig

    cluster = build_cluster("h100-sxm", 1024)
    mesh = LogicalMesh.from_degrees(cluster, **degrees)
    r = solve_layer(llama70b, mesh, req(kind=kind, target="megatron", sequence_parallel=sp, recompute=recompute))
    par = ParallelConfig(tp=degrees["tp"], cp=degrees.get("cp", 1), sequence_parallel=sp, recompute=recompute)
    graph, job = layer_graph(llama70b, kind, 8192), JobSpec(seq_len=8192)
    assert r.activation_bytes == pytest.approx(activation_bytes_per_microbatch(graph, llama70b, job, par), rel=1e-9)
    if kind == "head":
        return
    lc = layer_cost(graph, llama70b, cluster, job, par, degrees["dp"])
    # GEMMs and attention agree exactly; memory-bound kernels are costed per op here (within 5%).
    assert r.compute_s == pytest.approx(lc.forward_s + lc.backward_s + lc.recompute_s, rel=0.05)
    tp = sum(k.time_s * k.count * (2 if recompute == "full" and k.phase == "fwd" else 1)
             for _, k in r.collectives(MeshAxis.TP) if k.phase != "step" and not k.overlapped)
    assert tp * tp_exposed_fraction(degrees["tp"], cluster.efficiency) == pytest.approx(lc.tp_s, rel=1e-6)


def test_recompute_and_microbatch_scale_as_expected(llama70b, mesh_dp16_tp8) -> None:
    base = solve_layer(llama70b, mesh_dp16_tp8, req(target="megatron"))
    full = solve_layer(llama70b, mesh_dp16_tp8, req(target="megatron", recompute="full"))
    # One more forward: GEMMs 3 → 4 passes, attention 1 + 2.5 → 1 + 2.5 + 1 (FlashAttention-2 backward).
    assert base.compute_s * (1 + 1 / 3.5) <= full.compute_s <= base.compute_s * 4 / 3 * (1 + 1e-9)
    selective = solve_layer(llama70b, mesh_dp16_tp8, req(target="megatron", recompute="selective"))
    assert base.compute_s < selective.compute_s < full.compute_s
    assert full.activation_bytes < 0.2 * base.activation_bytes  # only the layer input is kept
    # Full recompute keeps 2·s·b·h bytes of layer input, ÷ t with SP (COST_MODEL.md §3).
    assert full.activation_bytes == pytest.approx(2 * 8192 * llama70b.hidden_size / 8)
    two = solve_layer(llama70b, mesh_dp16_tp8, req(target="megatron", micro_batch_size=2))
    assert two.activation_bytes == pytest.approx(2 * base.activation_bytes)
    assert np.isclose(two.state_bytes, base.state_bytes)


def test_moe_experts_shard_over_ep_with_four_all_to_alls() -> None:
    model = load_model("mixtral-8x7b")
    mesh = LogicalMesh.from_degrees(build_cluster("h100-sxm", 1024), dp=32, ep=8, tp=2)
    r = solve_layer(model, mesh, req(kind="moe", seq_len=4096, target="megatron"))
    experts = [c.strategy for c in r.choices if "expert" in c.node]
    assert experts and all(s.ep == "E" for s in experts)
    a2a = [(n, k.phase) for n, k in r.collectives(MeshAxis.EP) if k.kind == "all_to_all"]
    assert sorted(a2a) == sorted([("dispatch", "fwd"), ("dispatch", "bwd"), ("combine", "fwd"), ("combine", "bwd")])
    # Each rank holds e/ep experts' state (16 bytes per parameter at most, COST_MODEL.md §3).
    assert sum(s.state_bytes for s in experts) <= model.num_experts * model.expert_params * 16 / 8


def test_launch_settings_for_the_targets(llama70b, mesh_dp16_tp8) -> None:
    tt = solve_layer(llama70b, mesh_dp16_tp8, req(target="torchtitan", sequence_parallel=True))
    plan = tt.torchtitan_plan()
    assert plan["attention.wq"] == plan["feed_forward.w1"] == "ColwiseParallel(input_layouts=Shard(1))"
    assert plan["attention.wo"] == plan["feed_forward.w2"] == "RowwiseParallel(output_layouts=Shard(1))"
    assert plan["attention_norm"] == plan["ffn_norm"] == "SequenceParallel()"
    mg = solve_layer(llama70b, mesh_dp16_tp8, req(target="megatron")).megatron_settings()
    assert mg["sequence_parallel"] is True and mg["use_distributed_optimizer"] is True


def test_composite_weights(llama70b, mesh_dp16_tp8) -> None:
    base = solve_layer(llama70b, mesh_dp16_tp8, req(target="megatron"))
    compute_only = solve_layer(llama70b, mesh_dp16_tp8, req(target="megatron", comm_weight=0.0))
    assert compute_only.objective_s == pytest.approx(8 * compute_only.compute_s)
    assert compute_only.objective_s <= base.objective_s
    assert base.objective_s == pytest.approx(8 * base.time_per_microbatch_s + base.step_s)


def test_bad_request_values_name_themselves() -> None:
    with pytest.raises(ValueError, match=r"num_microbatches \(0\) must be >= 1"):
        IntraOpRequest("dense", 8192, num_microbatches=0)
