"""The output head and the MoE router gate run bf16 under an fp8 recipe (opgraph.Op.quantized), and DualPipe
ranks run their two mirror stages (cost_models.pipeline.dualpipe_rank_share)."""

from __future__ import annotations

from autoplan.catalog import build_cluster, load_model
from cost_models.estimate import estimate, head_cost
from cost_models.gemm import matmul_time_s
from cost_models.op_cost import op_compute
from cost_models.memory import graphs_for, op_activation_bytes
from cost_models.pipeline import dualpipe_rank_share
from cost_models.specs import JobSpec, ParallelConfig


def test_output_head_is_priced_in_bf16_under_fp8() -> None:
    model, cluster = load_model("llama3-8b"), build_cluster("h100-sxm", 8)
    par = ParallelConfig(tp=2, micro_batch_size=1)
    head = graphs_for(model, 8192)["head"]
    fp8 = JobSpec(global_batch_size=32, seq_len=8192, precision="fp8")
    bf16 = fp8.model_copy(update={"precision": "bf16"})
    assert not head.op("lm_head").quantized
    # same GEMM and same (cast-free) memory traffic as the bf16 job: fp8 buys the head nothing
    assert head_cost(head, cluster, fp8, par) == head_cost(head, cluster, bf16, par)
    # its saved input is the bf16 activation, not TE's 1-byte fp8 copy
    op = head.op("lm_head")
    assert op_activation_bytes(op, fp8, par) == op_activation_bytes(op, bf16, par)
    # while a decoder GEMM under fp8 is faster (the test would fail if every op were unquantized)
    dense = graphs_for(model, 8192)["dense"]
    q = dense.op("q_proj")
    assert q.quantized
    assert op_compute(q, dense, model, cluster, fp8, par).gemm_f < op_compute(q, dense, model, cluster, bf16, par).gemm_f


def test_router_gate_is_bf16() -> None:
    model, cluster = load_model("mixtral-8x7b"), build_cluster("h100-sxm", 8)
    moe = graphs_for(model, 4096)["moe"]
    router = moe.op("router")
    assert not router.quantized
    par = ParallelConfig(tp=1, micro_batch_size=1)
    fp8 = JobSpec(global_batch_size=8, seq_len=4096, precision="fp8")
    expected = matmul_time_s(4096, router.weight_in, router.weight_out, cluster, "bf16")
    assert op_compute(router, moe, model, cluster, fp8, par).gemm_f == expected


def test_dualpipe_rank_runs_its_mirror_stage() -> None:
    assert [dualpipe_rank_share(s, 4) for s in range(4)] == [(0, 3), (1, 2), (2, 1), (3, 0)]
    # pp 2, 16 + 16 layers: 1F1B binds on the last stage (layers + head); under DualPipe both ranks run
    # layers + head/2 (the pairing, not a schedule fill, sets the compute: exact, and fails without the pairing)
    model, cluster = load_model("llama3-8b"), build_cluster("h100-sxm", 16)
    job = JobSpec(global_batch_size=64, seq_len=8192, precision="bf16")
    one = estimate(model, cluster, job, ParallelConfig(tp=2, pp=2, micro_batch_size=1), check=False)
    dual = estimate(model, cluster, job, ParallelConfig(tp=2, pp=2, micro_batch_size=1, schedule="dualpipe"),
                    check=False)
    assert one.layers_per_stage == dual.layers_per_stage == [16, 16]
    head = head_cost(graphs_for(model, 8192)["head"], cluster, job, ParallelConfig(tp=2, pp=2, micro_batch_size=1))
    m = one.num_microbatches
    assert abs(dual.time.compute_s / m - (one.time.compute_s / m - head / 2)) < 1e-9 * one.time.compute_s
