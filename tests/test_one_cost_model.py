"""One cost model: every fast path and every per-op price derives from ``cost_models`` (issue 13).

The intra-op strategies price each op by calling ``cost_models`` on the op's sharded shapes; summed over the
uniform Megatron pattern they must *be* ``layer_cost`` and ``activation_bytes_per_microbatch`` (to 1e-9), on
random layouts of dense, GQA, MoE and MLA models. ``Scorer`` (the stage DP's prefix sums) is held to
``estimate`` in tests/test_planner.py (``test_fast_scorer_equals_estimate``)."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from autoplan.catalog import build_cluster, load_model
from cost_models.collectives import RankStrides
from cost_models.layer_cost import layer_cost
from cost_models.memory import activation_bytes_per_microbatch, graphs_for
from cost_models.specs import JobSpec, ParallelConfig
from search.intra_op import IntraOpRequest, build_layer_problem, uniform_choice
from search.mesh import LogicalMesh, MeshAxis

from benchmark_modules import load_benchmark

UNION = load_benchmark("ilp_gain", "ilp_gain_bench").UNION  # the ILP's research set (no target launches it)
# qwen3-235b-a22b: 4 KV heads, so tp 8 replicates them (Megatron's QKV gather, tp_comm.kv_gather_cost)
MODELS = {name: load_model(name) for name in ("llama3-8b", "llama3-70b", "mixtral-8x7b", "deepseek-v3",
                                              "qwen3-235b-a22b")}


@st.composite
def layouts(draw: st.DrawFn) -> tuple:
    name = draw(st.sampled_from(sorted(MODELS)))
    model = MODELS[name]
    g = model.num_kv_heads
    tp = draw(st.sampled_from([t for t in (1, 2, 4, 8) if g % t == 0 or t % g == 0]))
    cp = draw(st.sampled_from([1, 2, 4]))
    ep = draw(st.sampled_from([1, 2, 4, 8])) if model.is_moe else 1
    dp = ep * draw(st.sampled_from([1, 2, 4]))
    sp = True if model.is_moe else draw(st.booleans())
    target = draw(st.sampled_from(["megatron", "union"]))  # union: the research set of benchmarks/ilp_gain.py
    kv = draw(st.sampled_from(["gather", "replicate"])) if target == "union" and tp > g else "gather"
    return (name, tp, cp, ep, dp, draw(st.sampled_from([1, 2])), draw(st.sampled_from(["none", "selective", "full"])),
            sp, target, draw(st.sampled_from(["h100-sxm", "a100-80g"])), draw(st.sampled_from([4096, 8192])), kv)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(layouts())
def test_uniform_strategies_sum_to_layer_cost(case: tuple) -> None:
    name, tp, cp, ep, dp, mbs, rc, sp, target, gpu, seq, kv = case
    model = MODELS[name]
    cluster = build_cluster(gpu, 1024)
    mesh = LogicalMesh.from_degrees(cluster, dp=dp, tp=tp, cp=cp, ep=ep)
    par = ParallelConfig(tp=tp, cp=cp, ep=ep, micro_batch_size=mbs, recompute=rc, sequence_parallel=sp,
                         kv_replication=kv)
    job = JobSpec(seq_len=seq)
    for kind in ("dense", "moe") if model.is_moe else ("dense",):
        req = IntraOpRequest(kind=kind, seq_len=seq, micro_batch_size=mbs, recompute=rc,
                             strategies=UNION if target == "union" else None,
                             sequence_parallel=sp if tp > 1 else None, kv_replication=kv)
        lp = build_layer_problem(model, mesh, req)
        choice = uniform_choice(lp, sp)
        assert choice is not None
        chosen = [ss[i] for ss, i in zip(lp.strategies, choice)]
        graph = graphs_for(model, seq)[kind]
        lc = layer_cost(graph, model, cluster, job, par, dp)
        assert sum(s.compute_s + s.exposed_s for s in chosen) == pytest.approx(lc.total_s, rel=1e-9)
        assert sum(s.compute_s for s in chosen) == pytest.approx(lc.forward_s + lc.backward_s + lc.recompute_s,
                                                                rel=1e-9)
        assert sum(s.activation_bytes for s in chosen) == pytest.approx(
            activation_bytes_per_microbatch(graph, model, job, par), rel=1e-9)
        objective, _ = lp.problem.evaluate(choice)  # no resharding on the uniform pattern's edges
        assert objective == pytest.approx(lc.total_s * req.num_microbatches, rel=1e-9)


@pytest.mark.parametrize("name, modules", [
    ("deepseek-v3", ("mla_up_proj", "moe_act", "layernorm")), ("deepseek-v3", ("moe", "mla_up_proj")),
    ("deepseek-v3", ("core_attn", "shared_experts")), ("mixtral-8x7b", ("moe_act", "layernorm")),
    ("llama3-70b", ("mlp",)), ("llama3-8b", ("core_attn", "layernorm"))])
@pytest.mark.parametrize("tp, ep", [(1, 8), (4, 2)])
def test_uniform_strategies_price_megatrons_recompute_modules_as_layer_cost(name: str, modules: tuple, tp: int,
                                                                           ep: int) -> None:
    """The intra-op strategies under ``--recompute-modules`` (the search's pin): each op's re-run forward
    (``op_cost.op_recompute_s``), what the modules drop (``memory.op_activation_bytes`` on the op's graph) and the
    ``moe`` module's re-run all-to-alls sum over the uniform pattern to ``layer_cost`` and
    ``activation_bytes_per_microbatch`` with the modules, which differ from the default ``core_attn``'s."""
    model = MODELS[name]
    ep = ep if model.is_moe else 1
    cluster, job, dp = build_cluster("h100-sxm", 1024), JobSpec(seq_len=4096), 2 * ep
    mesh = LogicalMesh.from_degrees(cluster, dp=dp, tp=tp, cp=1, ep=ep)
    for kind in ("dense", "moe") if model.is_moe else ("dense",):
        graph = graphs_for(model, 4096)[kind]
        lcs = []
        for mods in (modules, None):
            par = ParallelConfig(tp=tp, ep=ep, recompute="selective", sequence_parallel=True, recompute_modules=mods)
            req = IntraOpRequest(kind=kind, seq_len=4096, recompute="selective",
                                 sequence_parallel=True if tp > 1 else None, recompute_modules=mods)
            lp = build_layer_problem(model, mesh, req)
            choice = uniform_choice(lp, True)
            assert choice is not None
            chosen = [ss[i] for ss, i in zip(lp.strategies, choice)]
            lc = layer_cost(graph, model, cluster, job, par, dp)
            assert sum(s.compute_s + s.exposed_s for s in chosen) == pytest.approx(lc.total_s, rel=1e-9)
            assert sum(s.activation_bytes for s in chosen) == pytest.approx(
                activation_bytes_per_microbatch(graph, model, job, par), rel=1e-9)
            lcs.append((lc.recompute_s, activation_bytes_per_microbatch(graph, model, job, par)))
        if name == "llama3-8b":  # TE fuses a dense GQA layer's norms into the next linear: layernorm adds nothing
            assert lcs[0] == pytest.approx(lcs[1], rel=1e-12)  # (cost_models.recompute.separate_norm)
        elif kind == "moe" or name == "llama3-70b":  # the other module sets act on these layers
            assert lcs[0] != pytest.approx(lcs[1], rel=1e-6)


def test_mesh_strides_are_the_cost_models_megatron_strides() -> None:
    """One rank order: EP groups are contiguous (Megatron's expert RankGenerator with expert-TP 1,
    megatron/core/parallel_state.py:798), so EP 8 × TP 8 on 128 H100s stays on NVLink in both."""
    cluster = build_cluster("h100-sxm", 128)
    mesh = LogicalMesh.from_degrees(cluster, dp=16, tp=8, ep=8)
    assert mesh.strides == RankStrides.megatron(8, 1, 16, 8)
    assert mesh.stride(MeshAxis.EP) == RankStrides.megatron(8, 1, 16, 8).ep == 1
    assert mesh.link(MeshAxis.EP).link == "nvlink"


def test_kv_head_replication_is_priced() -> None:
    """tp 8 > 4 KV heads (qwen3-235b): Megatron-Core keeps one KV head per rank (attention.py:289-300) and
    all-gathers the evenly split QKV output (attention.py:1398-1416): the attention core saves q/8 but k, v / 4,
    the layer pays an all-gather + reduce-scatter of [tokens, q + 2kv], and estimate accepts the layout."""
    from cost_models.estimate import estimate
    from cost_models.tp_comm import kv_gather_cost
    from cost_models.memory import op_activation_bytes

    model = MODELS["qwen3-235b-a22b"]
    cluster = build_cluster("h100-sxm", 1024)
    job = JobSpec(seq_len=4096, global_batch_size=1024)
    graph = graphs_for(model, 4096)["moe"]
    core = graph.op("attn_core")
    q, k, v = (graph.tensors[x].width for x in ("q_rot", "k", "v"))
    for tp, kv_div in ((4, 4), (8, 4)):
        par = ParallelConfig(tp=tp, ep=8, sequence_parallel=True)
        assert op_activation_bytes(core, job, par) == pytest.approx(2.0 * 4096 * (q / tp + (k + v) / kv_div))
        seconds, nbytes = kv_gather_cost(graph, cluster, job, par, 1)
        if tp == 4:
            assert seconds == nbytes == 0.0
        else:  # all-gather forward + reduce-scatter backward of the bf16 [4096, q + k + v] QKV output
            assert nbytes == pytest.approx(2 * 2.0 * 4096 * (q + k + v) * 7 / 8)
            assert seconds > 0
    lc8 = layer_cost(graph, model, cluster, job, ParallelConfig(tp=8, ep=8), 16)
    assert lc8.tp_bytes > 0
    pred = estimate(model, cluster, job, ParallelConfig(tp=8, pp=8, ep=8))
    assert pred.step_time_s > 0
