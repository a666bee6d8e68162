"""The intra-op pass on real layers: the Megatron pattern, GQA limits, memory pressure, targets, cache."""

from __future__ import annotations

import itertools
from collections import Counter

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
from search.strategies import SP_MODES
from benchmark_modules import load_benchmark

# The research strategy set no target launches (SP per op, every loss and K/V holding): benchmarks/ilp_gain.py's
UNION = load_benchmark("ilp_gain", "ilp_gain_bench").UNION

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
    """``target="union"``: the research set (``UNION``) on the megatron target."""
    if kw.get("target") == "union":
        kw = {**kw, "target": "megatron", "strategies": UNION}
    return IntraOpRequest(**{"kind": "dense", "seq_len": 8192, "num_microbatches": 8, **kw})


def tp_counts(r: IntraOpResult, phase: str) -> Counter:
    return Counter(k.kind for _, k in r.collectives(MeshAxis.TP, phase) for _ in range(int(k.count)))


# ---- sanity: llama3-70b on dp16 × tp8 is Megatron's pattern ------------------------------------------
@pytest.mark.parametrize("target", ["megatron", "torchtitan", "union"])
def test_llama70b_megatron_pattern(llama70b, mesh_dp16_tp8, target) -> None:
    r = solve_layer(llama70b, mesh_dp16_tp8, req(target=target))
    assert r.status == "optimal"
    for op in MEGATRON_COLUMN:
        assert r.strategy(op).tp in ("col", "col_sp"), op
    for op in MEGATRON_ROW:
        assert r.strategy(op).tp in ("row", "row_sp"), op
    assert r.strategy("attn_core").tp == "F"
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
    sp = {c.strategy.tp in SP_MODES for c in r.choices if c.strategy.tp != "F"}
    assert sp == {True}  # one SP flag per layer (tie), and SP is the cheaper one


# ---- tensor parallelism the model or the cluster cannot take ----------------------------------------
def test_tp16_across_hgx_domains_rejected(llama70b) -> None:
    mesh = LogicalMesh.from_degrees(build_cluster("h100-sxm", 1024), dp=8, tp=16)
    for target in ("megatron", "torchtitan", "union"):
        with pytest.raises(ConfigError, match="spans NVLink domains"):
            solve_layer(llama70b, mesh, req(target=target))


def test_tp16_head_sharding_not_allowed_on_torchtitan(llama70b) -> None:
    # A 64-GPU NVLink domain that 16 divides; torchtitan splits KV heads (wk/wv ColwiseParallel): 8 KV heads
    # cannot be split 16 ways. Its profile's kv_modes say so.
    mesh = LogicalMesh.from_degrees(build_cluster("gb200", 128, nvlink_domain_size=64), dp=8, tp=16)
    with pytest.raises(ConfigError, match=r"tp=16 does not divide .*KV heads \(8\).*valid: 1, 2, 4, 8"):
        solve_layer(llama70b, mesh, req(target="torchtitan"))


def test_tp16_kv_replication_megatron_gathers_union_chooses(llama70b) -> None:
    """tp 16 > 8 KV heads: Megatron splits QKV evenly and all-gathers its output (op_cost.kv_gather_width);
    fsdp2 can only replicate the K/V weights; the union set runs what the layout says (the search tries both)."""
    from cost_models.op_cost import kv_gather_width

    mesh = LogicalMesh.from_degrees(build_cluster("gb200", 128, nvlink_domain_size=64), dp=8, tp=16)
    meg = solve_layer(llama70b, mesh, req(target="megatron"))
    qkv = meg.strategy("k_proj")
    assert qkv.tp in ("col", "col_sp")
    gathers = [c for c in qkv.comms if c.kind == "all_gather" and c.payload_bytes > 2 * 8192 * 4096]
    width = kv_gather_width(intra_op._graph(llama70b, "dense", 8192, True), 16)
    assert width == 8192 + 2 * 1024 and gathers
    fs = solve_layer(llama70b, mesh, req(target="fsdp2", sequence_parallel=True, kv_replication="replicate"))
    assert fs.strategy("k_proj").tp == "col_sp_kvrep"
    with pytest.raises(ConfigError, match="no fsdp2 strategy"):  # the fsdp2 module cannot gather QKV
        solve_layer(llama70b, mesh, req(target="fsdp2", sequence_parallel=True))
    with pytest.raises(ConfigError, match="no megatron strategy"):
        solve_layer(llama70b, mesh, req(target="megatron", kv_replication="replicate"))
    for kv in ("gather", "replicate"):
        union = solve_layer(llama70b, mesh, req(target="union", kv_replication=kv))
        assert union.strategy("k_proj").tp.endswith("_kvrep") == (kv == "replicate")


# ---- memory pressure: sequence-parallel regions ----------------------------------------------------------
def test_memory_pressure_moves_union_to_sequence_parallel(llama70b, mesh_dp16_tp8) -> None:
    free = solve_layer(llama70b, mesh_dp16_tp8, req(target="union", sequence_parallel=False))
    sp = solve_layer(llama70b, mesh_dp16_tp8, req(target="megatron", sequence_parallel=True))
    assert sp.activation_bytes < free.activation_bytes
    limit = 0.5 * (sp.activation_bytes + free.activation_bytes)
    tight = solve_layer(llama70b, mesh_dp16_tp8, req(target="union", memory_limit_bytes=limit))
    assert tight.memory_bytes <= limit * (1 + 1e-9)
    with pytest.raises(InfeasibleError, match="does not fit"):
        solve_layer(llama70b, mesh_dp16_tp8, req(target="union", memory_limit_bytes=0.5 * sp.activation_bytes))


# ---- targets never get strategies they cannot launch -------------------------------------------------
@pytest.mark.parametrize("target", ["megatron", "torchtitan"])
@pytest.mark.parametrize("model,kind,degrees", [
    ("llama3-70b", "dense", dict(dp=16, tp=8)), ("llama3-70b", "dense", dict(dp=4, cp=4, tp=8)),
    ("llama3-70b", "head", dict(dp=16, tp=8)), ("llama3-70b", "embedding", dict(dp=16, tp=8)),
    ("mixtral-8x7b", "moe", dict(dp=32, ep=8, tp=4)), ("llama3-8b", "dense", dict(dp=128, tp=1)),
])
def test_target_rules(target, model, kind, degrees) -> None:
    spec = load_model(model)
    mesh = LogicalMesh.from_degrees(build_cluster("h100-sxm", 1024), **degrees)
    lp = build_layer_problem(spec, mesh, req(kind=kind, target=target))
    t = mesh.size(MeshAxis.TP)
    for node, ss in zip(lp.nodes, lp.strategies):
        modes = {s.tp for s in ss}
        if t > 1 and target == "torchtitan" and node.kind not in ("attention", "experts", "loss"):
            assert modes <= SP_MODES, node.name  # torchtitan's TP plan is sequence-parallel
        if node.kind == "loss" and target == "megatron":
            assert modes <= {"F", "R"} and (t == 1 or modes == {"F"})
        assert all(s.ep in (None, "E" if node.kind in ("dispatch", "experts", "combine") else "B") for s in ss)
    r = solve_layer(spec, mesh, req(kind=kind, target=target))
    if target == "megatron" and t > 1 and kind == "dense":
        matmul_modes = {c.strategy.tp for c in r.choices if c.node in ("q_proj+k_proj+v_proj", "o_proj")}
        assert matmul_modes in ({"col", "row"}, {"col_sp", "row_sp"})


# ---- layer-level exactness and the fallback ----------------------------------------------------------
def test_layer_ilp_matches_brute_force(llama70b, mesh_dp16_tp8) -> None:
    for target in ("megatron", "union"):
        lp = build_layer_problem(llama70b, mesh_dp16_tp8, req(target=target))
        p = lp.problem
        best = min(p.evaluate(c)[0] for c in itertools.product(*(range(c.size) for c in p.node_cost))
                   if p.feasible(c))
        sol = solve_ilp(p)
        assert sol.status == "optimal" and sol.objective == pytest.approx(best, rel=1e-7)
        assert solve_ilp(prune_dominated(p).problem).objective == pytest.approx(best, rel=1e-7)


def test_timeout_falls_back_to_uniform_megatron(llama70b, mesh_dp16_tp8, monkeypatch) -> None:
    optimal = solve_layer(llama70b, mesh_dp16_tp8, req(target="union"))
    monkeypatch.setattr(intra_op, "solve_ilp", lambda p, **kw: IlpSolution("timeout", None, None, None, 1.0, 0))
    r = solve_layer(llama70b, mesh_dp16_tp8, req(target="union"))
    assert r.status == "fallback"
    assert r.strategy("q_proj").tp == "col_sp" and r.strategy("down_proj").tp == "row_sp"
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


def test_moe_experts_shard_over_ep_with_four_all_to_alls() -> None:
    model = load_model("mixtral-8x7b")
    mesh = LogicalMesh.from_degrees(build_cluster("h100-sxm", 1024), dp=32, ep=8, tp=2)
    r = solve_layer(model, mesh, req(kind="moe", seq_len=4096, target="megatron"))
    experts = [c.strategy for c in r.choices if "expert" in c.node]
    assert experts and all(s.ep == "E" for s in experts)
    a2a = [(n, k.phase) for n, k in r.collectives(MeshAxis.EP) if k.kind == "all_to_all"]
    assert sorted(a2a) == sorted([("dispatch", "fwd"), ("dispatch", "bwd"), ("combine", "fwd"), ("combine", "bwd")])


def test_launch_settings_for_the_targets(llama70b, mesh_dp16_tp8) -> None:
    tt = solve_layer(llama70b, mesh_dp16_tp8, req(target="torchtitan", sequence_parallel=True))
    plan = tt.torchtitan_plan()
    assert plan["attention.wq"] == plan["feed_forward.w1"] == "ColwiseParallel(input_layouts=Shard(1))"
    assert plan["attention.wo"] == plan["feed_forward.w2"] == "RowwiseParallel(output_layouts=Shard(1))"
    assert plan["attention_norm"] == plan["ffn_norm"] == "SequenceParallel()"
    mg = solve_layer(llama70b, mesh_dp16_tp8, req(target="megatron")).megatron_settings()
    assert mg["sequence_parallel"] is True and mg["expert_parallel"] is False


def test_composite_weights(llama70b, mesh_dp16_tp8) -> None:
    base = solve_layer(llama70b, mesh_dp16_tp8, req(target="megatron"))
    compute_only = solve_layer(llama70b, mesh_dp16_tp8, req(target="megatron", comm_weight=0.0))
    assert compute_only.objective_s == pytest.approx(8 * compute_only.compute_s)
    assert compute_only.objective_s <= base.objective_s
    assert base.objective_s == pytest.approx(8 * base.time_per_microbatch_s)


def test_bad_request_values_name_themselves() -> None:
    with pytest.raises(ValueError, match=r"num_microbatches \(0\) must be >= 1"):
        IntraOpRequest("dense", 8192, num_microbatches=0)


def test_every_target_runs_one_pattern_per_layout() -> None:
    """The Scorer's bounds and activations take the ILP's answer to be the layout's uniform pattern (no per-op
    sequence parallelism, one K/V holding: the layout's); that holds only while no target's strategy set chooses
    SP per op. A target that did would need the removed SP-floor bound back (search/score.py)."""
    from cost_models.targets import PROFILES
    from search.strategies import strategy_set

    for name in PROFILES:
        assert strategy_set(name).sequence_parallel in ("flag", "forced"), name
    with pytest.raises(KeyError):
        strategy_set("any")  # search's "any" labels each layout with its own target; the ILP never sees it
