"""The physics behind torchtitan's compile knob (issue 10): eager element-wise bytes counted from the ops torch
really dispatches, per-op SAC recompute as torchtitan's policy runs it, the 2024-12 runs' uncompiled loss, and the
HBM bandwidth of the GPUs those runs used."""

from __future__ import annotations

from dataclasses import replace

import pytest

from autoplan.catalog import build_cluster, load_model
from cost_models.estimate import head_cost
from cost_models.op_cost import _compute
from cost_models.opgraph import layer_graph
from cost_models.specs import JobSpec, ParallelConfig
from cost_models.targets import runtime_for
from cost_models.targets.common import Software

from benchmark_modules import load_benchmark


def _eager_traffic():  # type: ignore[no-untyped-def]
    return load_benchmark("eager_traffic", "eager_traffic")


def test_eager_byte_tables_are_what_torch_dispatches() -> None:
    """op_traffic's EAGER_* / TORCH_LOSS_BYTES equal the bytes a TorchDispatchMode counts over the eager forward and
    autograd backward of torchtitan's RMSNorm, rotary (the installed ComplexRoPE), SwiGLU and fp32 cross-entropy
    (rotary: + the frequency cache's reads at this toy size)."""
    et = _eager_traffic()
    counted, priced = et.counted(), et.priced()
    for piece, (f, b) in counted.items():
        assert priced[piece][0] == pytest.approx(f, rel=0.05), piece
        assert priced[piece][1] == pytest.approx(b, rel=0.07), piece
    # eager is several times the fused kernels (op_traffic.NORM_BYTES = (4, 6)) for the norm
    assert counted["norm"][0] > 8 * 4 and counted["norm"][1] > 10 * 6


def _case(recompute: str = "selective"):  # type: ignore[no-untyped-def]
    model = load_model("llama3-8b")
    cluster = build_cluster("h100-sxm-96g", 8)
    job = JobSpec(global_batch_size=16, seq_len=8192, precision="bf16")
    par = ParallelConfig(tp=1, pp=1, cp=1, micro_batch_size=2, zero_stage=3, recompute=recompute)
    return model, cluster, job, par


def test_op_sac_recompute_reruns_every_other_gemm_and_the_memory_bound_forward() -> None:
    """torchtitan's per-op SAC saves the SDPA output and every other mm: its recompute does not depend on the
    attention kernel, grows with eager element-wise kernels, and is more than half a GEMM forward's worth of the
    layer's matmuls (wk, wo, w3 of 7: 36% of the FLOPs) but less than the whole forward."""
    model, cluster, job, par = _case()
    graph = layer_graph(model, "dense", job.seq_len)
    on = runtime_for("torchtitan", job, cluster, par, Software(compile=True))
    off = runtime_for("torchtitan", job, cluster, par, Software(compile=False))
    cc_on, cc_off = _compute(graph, model, cluster, job, par, on), _compute(graph, model, cluster, job, par, off)
    slow_attn = cluster.model_copy(update={"efficiency": cluster.efficiency.model_copy(update={"attention": 0.1})})
    cc_slow = _compute(graph, model, slow_attn, job, par, on)
    assert cc_on.recompute_s("selective") == pytest.approx(cc_slow.recompute_s("selective"))
    assert cc_off.recompute_s("selective") - cc_on.recompute_s("selective") == pytest.approx(cc_off.mem_f - cc_on.mem_f)
    assert 0.3 * cc_on.gemm_f < cc_on.recompute_s("selective") - cc_on.mem_f < 0.45 * cc_on.gemm_f
    megatron = _compute(graph, model, cluster, job, par, runtime_for("megatron", job, cluster, par))
    assert megatron.recompute_s("selective") == megatron.attn_f  # Megatron re-runs the attention core only


def test_2024_12_torchtitan_loss_is_eager_with_or_without_compile() -> None:
    """The 2024-12 runs compiled the blocks only (loss compile off since e8977b0): the head costs the same with and
    without compile; torchtitan 0.3.0 compiles the loss with the model (compile.components)."""
    model, cluster, job, par = _case()
    head = layer_graph(model, "head", job.seq_len)
    fp = job.model_copy(update={"precision": "bf16"})
    costs = {c: head_cost(head, cluster, fp, par, runtime_for("torchtitan-2024-12", fp, cluster, par,
                                                                 Software(compile=c))) for c in (True, False)}
    assert costs[True] == pytest.approx(costs[False])
    rt30 = runtime_for("torchtitan", fp, cluster, par, Software(compile=True))
    assert rt30.fused_loss and head_cost(head, cluster, fp, par, rt30) != pytest.approx(costs[True])
    assert not replace(rt30, fused_loss=False).fused_loss


def test_torchtitan_benchmark_gpus_are_hbm2e_at_2_4_tb_s() -> None:
    """torchtitan's benchmark GPUs: "96GB HBM2e with 2.4 TB/sec peak memory bandwidth" (its Hardware section)."""
    assert build_cluster("h100-sxm-96g", 8).gpu.hbm_tbytes_per_s == pytest.approx(2.4)
    assert build_cluster("h100-sxm", 8).gpu.hbm_tbytes_per_s == pytest.approx(3.35)


def test_torchao_float8_casts_and_rowwise_forward_gemm() -> None:
    """torchao Float8Linear (torchtitan) casts as torchao's roofline counts them (roofline_utils.py at ao#1793):
    tensorwise input 4 B per element fused under compile (6 eager), its weight 5 B per element each micro-batch in the
    forward; a sibling linear reading the same input shares the compiled cast. Rowwise's forward GEMM runs the
    CUTLASS row-wise kernel at ROWWISE_FWD_GEMM_EFFICIENCY of cuBLAS tensorwise; Megatron's TE recipes never do."""
    from cost_models.gemm import hbm_time_s
    from cost_models.knob_effects import ROWWISE_FWD_GEMM_EFFICIENCY
    from cost_models.op_cost import op_compute
    from cost_models.op_traffic import local_widths, op_traffic_bytes

    model, cluster, job, par = _case()
    job = job.model_copy(update={"precision": "fp8"})
    graph = layer_graph(model, "dense", job.seq_len)
    tokens = par.micro_batch_size * job.seq_len
    gate, up = graph.op("gate_proj"), graph.op("up_proj")
    k, n = local_widths(gate, graph, 1)

    def rt(recipe: str, compiled: bool = True, target: str = "torchtitan-2024-12"):  # type: ignore[no-untyped-def]
        return runtime_for(target, job, cluster, par, Software(compile=compiled, fp8_recipe=recipe))

    tw = rt("tensorwise")
    assert op_traffic_bytes(gate, graph, model, job, par, tw)[0] == pytest.approx(4.0 * k * tokens + 5.0 * k * n)
    assert op_traffic_bytes(up, graph, model, job, par, tw)[0] == pytest.approx(5.0 * k * n)
    eager = rt("tensorwise", compiled=False)
    assert op_traffic_bytes(up, graph, model, job, par, eager)[0] == pytest.approx(6.0 * k * tokens + 5.0 * k * n)
    rw_gemm = (op_compute(gate, graph, model, cluster, job, par, rt("rowwise")).forward_s
               - hbm_time_s(op_traffic_bytes(gate, graph, model, job, par, rt("rowwise"))[0], cluster))
    gemm = op_compute(gate, graph, model, cluster, job, par, tw).gemm_f
    assert rw_gemm == pytest.approx(gemm / ROWWISE_FWD_GEMM_EFFICIENCY)
    te = runtime_for("megatron", job, cluster, par, Software(fp8_recipe="tensorwise"))
    assert op_compute(gate, graph, model, cluster, job, par, te).gemm_fwd_extra == 0.0


def test_torchao_mxfp8_casts_follow_torchaos_roofline() -> None:
    """torchtitan's MXFP8 linears (torchao MXLinear) cast as torchao's roofline counts them (roofline_utils.py at ao
    d8bb51f63, the mxfp8_cublas branch): a dim0 and a dim1 block cast of each operand, 3 B per element each (the
    first fused with the producer under compile: 4 B, 6 eager), the weight 3 B forward and 3 B backward every
    micro-batch — not Transformer Engine's cast (Megatron's mxfp8 keeps TE's, with no per-micro-batch weight cast).
    The GEMM runs at TE's measured MXFP8/per-tensor time ratio either way."""
    from cost_models.knob_effects import fp8_gemm_time_ratio
    from cost_models.op_traffic import local_widths, op_traffic_bytes
    from cost_models.te_fp8 import MXFP8_GEMM_TIME_RATIO

    model, _, job, par = _case()
    cluster = build_cluster("b200", 8)
    job = job.model_copy(update={"precision": "fp8"})
    graph = layer_graph(model, "dense", job.seq_len)
    tokens = par.micro_batch_size * job.seq_len
    gate, up, down = graph.op("gate_proj"), graph.op("up_proj"), graph.op("down_proj")
    k, n = local_widths(gate, graph, 1)

    def rt(compiled: bool = True, target: str = "torchtitan"):  # type: ignore[no-untyped-def]
        return runtime_for(target, job, cluster, par, Software(compile=compiled, fp8_recipe="mxfp8"))

    mx = rt()
    assert op_traffic_bytes(gate, graph, model, job, par, mx)[0] == pytest.approx(4.0 * k * tokens + 3.0 * k * n)
    assert op_traffic_bytes(up, graph, model, job, par, mx)[0] == pytest.approx(3.0 * k * n)  # shares gate's cast
    assert op_traffic_bytes(up, graph, model, job, par, rt(compiled=False))[0] == \
        pytest.approx(6.0 * k * tokens + 3.0 * k * n)
    kd, nd = local_widths(down, graph, 1)
    bf16 = job.model_copy(update={"precision": "bf16"})
    bwd_bf16 = op_traffic_bytes(down, graph, model, bf16, par, runtime_for("torchtitan", bf16, cluster, par,
                                                                           Software(compile=True)))[1]
    assert op_traffic_bytes(down, graph, model, job, par, mx)[1] - bwd_bf16 == \
        pytest.approx(4.0 * nd * tokens + 3.0 * kd * nd)
    assert fp8_gemm_time_ratio(mx, job) == MXFP8_GEMM_TIME_RATIO
    te = runtime_for("megatron", job, cluster, par, Software(fp8_recipe="mxfp8"))
    te_fwd = op_traffic_bytes(up, graph, model, job, par, te)[0]
    assert te_fwd < 3.0 * k * n  # TE: no per-micro-batch weight cast on the activation path
