"""TE userbuffers (Megatron --tp-comm-overlap) priced per collective against its own GEMM (cost_models.te_userbuffers),
recomputed here from the collectives' and GEMMs' own times."""

from __future__ import annotations

import pytest

from autoplan.catalog import build_cluster, load_model
from cost_models.collectives import group_collective_time_s
from cost_models.gemm import matmul_time_s
from cost_models.layer_cost import layer_cost
from cost_models.tp_comm import tp_boundaries
from cost_models.opgraph import layer_graph
from cost_models.specs import JobSpec, ParallelConfig
from cost_models.targets import Software, runtime_for
from cost_models.te_userbuffers import UB_PIPELINE_SPLITS, ub_exposed_s


@pytest.mark.parametrize("t", [2, 4, 8])
def test_each_method_hides_what_its_gemm_covers(t: int) -> None:
    g = 1.0
    # ring exchange: t chunks, the first one local: t-1 transfers under t-1 GEMM chunks
    assert ub_exposed_s("ring_exchange", g * (t - 1) / t, g, t) == 0.0
    assert ub_exposed_s("ring_exchange", 2 * g, g, t) == pytest.approx(2 * g - g * (t - 1) / t)
    # bulk: one collective under one whole GEMM
    assert ub_exposed_s("bulk", 0.9 * g, g, t) == 0.0
    assert ub_exposed_s("bulk", 1.5 * g, g, t) == pytest.approx(0.5 * g)
    # pipeline: the last of the 4 chunks' reduce-scatters has nothing left to hide behind
    assert ub_exposed_s("pipeline", 0.5 * g, g, t) == pytest.approx(0.5 * g / UB_PIPELINE_SPLITS)
    assert ub_exposed_s("pipeline", 2 * g, g, t) == pytest.approx(2 * g / 4 + 3 * (2 * g - g) / 4)
    assert ub_exposed_s("pipeline", 0.0, g, t) == 0.0


def _setup(precision: str, t: int = 8):  # type: ignore[no-untyped-def]
    model = load_model("llama3-70b")
    cluster = build_cluster("h100-sxm", 8)
    job = JobSpec(seq_len=8192, precision=precision)
    par = ParallelConfig(tp=t, sequence_parallel=True)
    return model, cluster, job, par, layer_graph(model, "dense", job.seq_len)


def _recomputed_exposed_s(precision: str, t: int) -> float:
    """The layer's userbuffers exposure from first principles: per TP boundary its collectives' times and its GEMM's
    forward time (dgrad and wgrad take as long), through TE's default methods."""
    model, cluster, job, par, graph = _setup(precision, t)
    rt = runtime_for("megatron", job, cluster, par, Software())
    assert rt.tp_comm_overlap
    tokens = job.seq_len
    total = 0.0
    for tensor, role in tp_boundaries(graph):
        elems = tokens * graph.tensors[tensor].width
        ops = [op for op in graph.ops if op.kind == "matmul"
               and (op.inputs[0] == tensor if role == "column" else op.output == tensor)]
        gemm = 0.0
        for op in ops:  # Megatron's column ops split their output over t, row ops their input
            k, n = (op.weight_in, op.weight_out // t) if role == "column" else (op.weight_in // t, op.weight_out)
            gemm += matmul_time_s(tokens, k, n, cluster, precision)
        ag = group_collective_time_s("all_gather", rt.tp_gather_bytes * elems, t, 1, cluster)
        rs = group_collective_time_s("reduce_scatter", 2.0 * elems, t, 1, cluster)
        if role == "column":  # fprop AG (ring exchange), dgrad + bulk AG of the input, wgrad + bulk RS
            total += ub_exposed_s("ring_exchange", ag, gemm, t) + ub_exposed_s("bulk", ag, gemm, t) \
                + ub_exposed_s("bulk", rs, gemm, t)
        else:  # fprop + pipelined RS, dgrad + ring-exchange AG of the output gradient
            grad_ag = group_collective_time_s("all_gather", (rt.tp_grad_gather_bytes or rt.tp_gather_bytes) * elems,
                                              t, 1, cluster)
            total += ub_exposed_s("pipeline", rs, gemm, t) + ub_exposed_s("ring_exchange", grad_ag, gemm, t)
    return total


@pytest.mark.parametrize("t", [2, 4, 8])
def test_layer_tp_exposure_is_the_sum_over_its_collectives(t: int) -> None:
    model, cluster, job, par, graph = _setup("bf16", t)
    rt = runtime_for("megatron", job, cluster, par, Software())
    exposed = layer_cost(graph, model, cluster, job, par, 1, rt).tp_s
    assert exposed == pytest.approx(_recomputed_exposed_s("bf16", t), rel=1e-9)
    off = runtime_for("megatron", job, cluster, par, Software(tp_comm_overlap=False))
    assert 0.0 < exposed < 0.25 * layer_cost(graph, model, cluster, job, par, 1, off).tp_s


def test_shorter_fp8_gemms_hide_less() -> None:
    """The physics a free fraction could not say: fp8 GEMMs are ~1.6x shorter, so the same layer hides a smaller
    share of its TP traffic (the trade LOGO's fit made between fp8_gemm_speedup and tp_overlap)."""
    shares = {}
    for precision in ("bf16", "fp8"):
        model, cluster, job, par, graph = _setup(precision)
        on = runtime_for("megatron", job, cluster, par, Software())
        off = runtime_for("megatron", job, cluster, par, Software(tp_comm_overlap=False))
        shares[precision] = (layer_cost(graph, model, cluster, job, par, 1, on).tp_s
                             / layer_cost(graph, model, cluster, job, par, 1, off).tp_s)
    assert shares["fp8"] > shares["bf16"]


def test_a_stack_without_tp_overlap_exposes_everything() -> None:
    """tp_overlap 0 (calibrate.SOFTWARE_SETTINGS: a stack without TP overlap; gpus.yaml's unmeasured priors):
    every TP collective stays on the critical path, userbuffers or not."""
    model, cluster, job, par, graph = _setup("bf16")
    none = cluster.model_copy(update={"efficiency": cluster.efficiency.model_copy(update={"tp_overlap": 0.0})})
    on = runtime_for("megatron", job, none, par, Software())
    off = runtime_for("megatron", job, none, par, Software(tp_comm_overlap=False))
    assert layer_cost(graph, model, none, job, par, 1, on).tp_s == layer_cost(graph, model, none, job, par, 1, off).tp_s


def test_mtp_projection_runs_without_userbuffers() -> None:
    """eh_proj has no tp_comm_buffer_name: its forward gathers wait in full, its backward's reduce-scatter and the
    input's re-gather hide behind one GEMM each (TE's async non-userbuffer path), whatever the layers do."""
    from cost_models.mtp import mtp_projection_time_s

    m = load_model("deepseek-v3")
    cluster, job = build_cluster("h100-sxm", 8), JobSpec(global_batch_size=16, seq_len=4096)
    par = ParallelConfig(tp=8, ep=8, sequence_parallel=True)
    h, t, tokens = m.hidden_size, 8, job.seq_len
    one = matmul_time_s(tokens, 2 * h, h // t, cluster)
    ag, rs = (group_collective_time_s(k, 2.0 * tokens * 2 * h, t, 1, cluster) for k in ("all_gather", "reduce_scatter"))
    out = group_collective_time_s("all_gather", 2.0 * tokens * h, t, 1, cluster)
    gemm, exposed = mtp_projection_time_s(m, cluster, job, par)
    assert gemm == pytest.approx(3 * one)
    assert exposed == pytest.approx(ag + out + max(0.0, rs - one) + max(0.0, ag - one))
    none = cluster.model_copy(update={"efficiency": cluster.efficiency.model_copy(update={"tp_overlap": 0.0})})
    assert mtp_projection_time_s(m, none, job, par)[1] == pytest.approx(2 * ag + out + rs)


def test_one_decision_for_every_tp_overlap_site() -> None:
    """knob_effects.tp_overlap_mode is what layer_cost, mtp and the intra-op search read: each case of the
    decision, and the fraction the share-priced sites use follows it."""
    from cost_models.knob_effects import tp_overlap_mode
    from cost_models.tp_comm import tp_exposed_fraction

    model, cluster, job, par, graph = _setup("bf16")
    eff = cluster.efficiency
    none = eff.model_copy(update={"tp_overlap": 0.0})
    ub = runtime_for("megatron", job, cluster, par, Software())
    off = runtime_for("megatron", job, cluster, par, Software(tp_comm_overlap=False))
    assert ub.tp_comm_overlap and not off.tp_overlapped
    assert tp_overlap_mode(eff, ub, 8) == "userbuffers"
    assert tp_overlap_mode(eff, ub, 8, per_collective=False) == "share"  # no model to price each GEMM
    assert tp_overlap_mode(eff, ub, 8, sequence_parallel=False) == "share"
    assert tp_overlap_mode(eff, None, 8) == "share"  # the intra-op search: no runtime
    for exposed in ((eff, ub, 1), (none, ub, 8), (none, None, 8), (eff, off, 8)):
        assert tp_overlap_mode(*exposed) == "exposed"
        assert tp_exposed_fraction(exposed[2], exposed[0], exposed[1]) == (0.0 if exposed[2] == 1 else 1.0)
    assert tp_exposed_fraction(8, eff) == pytest.approx(max(1 - eff.tp_overlap, 1 / 16))


def test_knobs_priced_without_effect_are_told() -> None:
    """A plan that runs --tp-comm-overlap on a generation whose tp_overlap is 0 (Blackwell's unmeasured prior) says
    so with the prediction (JSON ``notes`` and the table); on Hopper (fitted overlap) it does not. The runtime's own
    notes (zero_stage=2 runs as Megatron-FSDP) reach the prediction too."""
    from autoplan.report import render_prediction
    from cost_models.estimate import estimate

    model = load_model("llama3-70b")
    job = JobSpec(global_batch_size=64, seq_len=4096)
    par = ParallelConfig(tp=8, pp=4, sequence_parallel=True)
    told = {}
    for gpu in ("b200", "h100-sxm"):
        pred = estimate(model, build_cluster(gpu, 64), job, par, target="megatron")
        told[gpu] = [n for n in pred.notes if n.startswith("tp_comm_overlap")]
        assert all(f"  note             {n}" in render_prediction(pred) for n in pred.notes)
    assert len(told["b200"]) == 1 and "exposed" in told["b200"][0] and told["h100-sxm"] == []
    off = estimate(model, build_cluster("b200", 64), job, par, target="megatron",
                   software=Software(tp_comm_overlap=False))
    assert not any(n.startswith("tp_comm_overlap") for n in off.notes)
    fsdp = estimate(model, build_cluster("h100-sxm", 64), job, ParallelConfig(tp=8, zero_stage=2, sequence_parallel=True),
                    target="megatron")
    assert any("Megatron-FSDP" in n for n in fsdp.notes)
