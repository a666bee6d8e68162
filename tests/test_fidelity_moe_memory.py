"""Issue #12: memory per target with a headroom, and MoE at scale (node-limited routing, DeepEP fp8 dispatch,
all-to-all overlap, DualPipe), checked against closed forms recomputed here and DeepSeek-V3's published run."""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import pytest
from pytest import approx

from autoplan.catalog import build_cluster, load_model
from cost_models.estimate import estimate
from cost_models.collectives import RankStrides
from cost_models.a2a_overlap import OverlapNodes
from cost_models.ep_comm import (FP8_DISPATCH_BYTES, a2a_overlap_compute_split, a2a_overlap_exposed_s, moe_all_to_all,
                                 moe_all_to_all_parts)
from cost_models.layer_cost import layer_cost
from cost_models.memory import DEFAULT_RUNTIME, activation_bytes_per_microbatch, graphs_for
from cost_models.targets import DEEPSEEK, runtime_for
from cost_models.pipeline import bubble_fraction
from cost_models.specs import JobSpec, ParallelConfig

from benchmark_modules import load_benchmark

ROOT = Path(__file__).resolve().parent.parent


def _fidelity():  # type: ignore[no-untyped-def]
    return load_benchmark("fidelity", "fidelity_moe")


# --- memory per target ---------------------------------------------------------------------------------------
_JOB, _H100 = JobSpec(global_batch_size=64), build_cluster("h100-sxm", 64)
MEGATRON = runtime_for("megatron", _JOB, _H100, ParallelConfig(tp=8))
FSDP2 = runtime_for("torchtitan", _JOB, _H100, ParallelConfig(tp=8, zero_stage=3))


def test_state_bytes_per_framework() -> None:
    # Megatron-Core distributed optimizer: 6 + 12/d bytes per parameter; FSDP2: 16/d.
    assert sum(MEGATRON.state_bytes(1.0, 1, 8)) == approx(6 + 12 / 8)
    assert sum(FSDP2.state_bytes(1.0, 3, 8)) == approx(16 / 8)
    assert sum(DEEPSEEK.state_bytes(1.0, 1, 2)) == approx(6 + 8 / 2)
    # no target: Megatron-Core's memory facts; every framework's facts come from its resolved target profile
    assert runtime_for(None, _JOB, _H100, ParallelConfig(tp=8)) == MEGATRON
    assert DEFAULT_RUNTIME.state_bytes(1.0, 1, 8) == MEGATRON.state_bytes(1.0, 1, 8)
    assert runtime_for("fsdp2", _JOB, _H100).state_bytes(1.0, 3, 8) == FSDP2.state_bytes(1.0, 3, 8)


def test_loss_bytes_torchtitan_twice_megatron() -> None:
    m = load_model("llama3-8b")
    job = JobSpec(global_batch_size=8, seq_len=8192)
    par = ParallelConfig(tp=1, micro_batch_size=1)
    head = graphs_for(m, job.seq_len)["head"]
    mt = activation_bytes_per_microbatch(head, m, job, par, MEGATRON)
    tt = activation_bytes_per_microbatch(head, m, job, par, FSDP2)
    logits = m.vocab_size * job.seq_len
    assert tt - mt == approx((12 - 6) * logits)  # fp32 log-probs and their fp32 gradient


def test_reported_peak_is_allocated_reserved_device() -> None:
    m, c = load_model("llama3-70b"), build_cluster("h100-sxm", 64)
    pred = estimate(m, c, JobSpec(global_batch_size=64, seq_len=4096), ParallelConfig(tp=8, pp=4))
    assert pred.peak_allocated_gib < pred.peak_reserved_gib < pred.peak_memory_gib
    assert pred.memory_limit_gib == approx(80 * 0.95) and pred.memory_headroom_gib == approx(4.0)
    assert pred.fits == (pred.peak_memory_gib <= pred.memory_limit_gib)


def test_headroom_changes_fits() -> None:
    m = load_model("llama3-70b")
    job, par = JobSpec(global_batch_size=64, seq_len=4096), ParallelConfig(tp=8, pp=4)
    peak = estimate(m, build_cluster("h100-sxm", 64), job, par).peak_memory_gib
    tight = build_cluster("h100-sxm", 64, memory_headroom=80 - peak + 0.5)  # GiB
    loose = build_cluster("h100-sxm", 64, memory_headroom=0.0)
    assert not estimate(m, tight, job, par).fits
    assert estimate(m, loose, job, par).fits
    assert build_cluster("h100-sxm", 8, memory_headroom=0.1).memory_limit_gib == approx(72.0)


def test_cli_memory_headroom() -> None:
    base = [sys.executable, "-m", "autoplan", "estimate", "--model", "llama3-8b", "--gpus", "8", "--tp", "1",
            "--pp", "1", "--global-batch-size", "8"]
    out = subprocess.run(base + ["--memory-headroom", "10%"], capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0 and "72.0 GiB" in out.stdout and "allocated" in out.stdout
    out = subprocess.run(base + ["--memory-headroom", "6GiB"], capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0 and "74.0 GiB" in out.stdout
    bad = subprocess.run(base + ["--memory-headroom", "lots"], capture_output=True, text=True, cwd=ROOT)
    assert bad.returncode == 2 and "Traceback" not in bad.stderr and "'lots'" in bad.stderr


def test_headroom_that_leaves_no_room_is_refused() -> None:
    """``--memory-headroom 79.9`` on an 80 GiB GPU left 0.1 GiB and the search said "fits in 0 GiB": a headroom
    that leaves no more than the CUDA context and NCCL buffers every plan holds (memory.runtime_overhead_bytes) is
    refused, in GiB or as a fraction, naming the largest valid values; one just inside runs and shows its limit."""
    from autoplan.errors import UserInputError
    from cost_models.memory import GIB, runtime_overhead_bytes

    floor = runtime_overhead_bytes() / GIB
    base = [sys.executable, "-m", "autoplan", "estimate", "--model", "llama3-8b", "--gpus", "8", "--tp", "1",
            "--pp", "1", "--global-batch-size", "8"]
    bad = subprocess.run(base + ["--memory-headroom", "79.9"], capture_output=True, text=True, cwd=ROOT)
    assert bad.returncode == 2 and bad.stderr.strip() == (
        f"Error: memory headroom 79.9 leaves 0.10 GiB of h100-sxm's 80 GiB, no more than the {floor:g} GiB of CUDA "
        f"context and NCCL buffers every plan holds: give less than {80 - floor:g} GiB or a fraction of at most "
        f"{int((80 - floor) / 80 * 1e4) / 1e4:g} (default 0.05)"), bad.stderr
    for h in (80 - floor, 1 - floor / 80 + 1e-6):  # exactly the floor left (GiB), just under it (fraction)
        with pytest.raises(UserInputError, match="no more than the"):
            build_cluster("h100-sxm", 8, memory_headroom=h)
    for h in (80, 120):  # all the HBM or more: the same rule, its limit is 0 (one check, not two with gaps)
        with pytest.raises(UserInputError, match=f"memory headroom {h} leaves 0.00 GiB of h100-sxm's 80 GiB"):
            build_cluster("h100-sxm", 8, memory_headroom=h)
    with pytest.raises(UserInputError, match="memory headroom -1 must be at least 0"):
        build_cluster("h100-sxm", 8, memory_headroom=-1)
    inside = 80 - floor - 0.1
    assert build_cluster("h100-sxm", 8, memory_headroom=inside).memory_limit_gib == approx(floor + 0.1)
    ok = subprocess.run(base + ["--memory-headroom", f"{inside:g}"], capture_output=True, text=True, cwd=ROOT)
    assert ok.returncode == 0 and f"/ {floor + 0.1:.1f} GiB" in ok.stdout, ok.stderr


# --- MoE all-to-all --------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def dsv3():  # type: ignore[no-untyped-def]
    return load_model("deepseek-v3")


def _h800(dispatcher: str = "alltoall", overlap: bool = False):  # type: ignore[no-untyped-def]
    c = build_cluster("h800", 2048)
    return c.model_copy(update={"efficiency": c.efficiency.model_copy(
        update={"moe_dispatcher": dispatcher, "moe_a2a_overlap": overlap})})


def test_node_limited_routing_halves_nic_bytes(dsv3) -> None:  # type: ignore[no-untyped-def]
    """EP 64 over 8 nodes, 8 groups, ≤ 4 per token: E[remote nodes] = 4·7/8 = 3.5 per token against 8·7/8 = 7
    remote copies for the per-copy all-to-all; NIC-bound, DeepEP's bf16 dispatch takes half the time."""
    job = JobSpec(global_batch_size=8, seq_len=4096, precision="bf16")
    c_a, c_d = _h800("alltoall"), _h800("deepep")
    tokens = 4096.0
    t_a, b_a = moe_all_to_all(dsv3, c_a, job, tokens, 64)
    t_d, b_d = moe_all_to_all(dsv3, c_d, job, tokens, 64)
    groups_hit = 8 * (1 - math.comb(7, 4) / math.comb(8, 4))
    assert groups_hit == approx(4.0)
    nic = c_d.inter_node_gbps / 8 * 1e9 * c_d.efficiency.nic_bus
    lat = 7 * c_d.gpu.link_latency_us * 1e-6 + 7 * c_d.gpu.nic_latency_us * 1e-6
    per = tokens * dsv3.hidden_size * c_d.efficiency.moe_imbalance * 2.0
    assert t_d == approx(4 * (lat + per * 3.5 / nic))
    assert t_a == approx(4 * (lat + per * 7.0 / nic))
    assert b_d > b_a  # but more bytes in all: DeepEP forwards every copy over NVLink inside the node


def test_fp8_dispatch(dsv3) -> None:  # type: ignore[no-untyped-def]
    c = _h800("deepep")
    bf16 = moe_all_to_all(dsv3, c, JobSpec(seq_len=4096, precision="bf16"), 4096.0, 64)[0]
    fp8 = moe_all_to_all(dsv3, c, JobSpec(seq_len=4096, precision="fp8"), 4096.0, 64)[0]
    lat = 4 * (7 * c.gpu.link_latency_us + 7 * c.gpu.nic_latency_us) * 1e-6
    # Two of the four all-to-alls (forward dispatch, backward of combine) carry fp8 + a scale per 128 elements.
    assert (fp8 - lat) / (bf16 - lat) == approx((2 * FP8_DISPATCH_BYTES + 2 * 2.0) / 8.0)


def test_a2a_overlap_hides_behind_compute(dsv3) -> None:  # type: ignore[no-untyped-def]
    job = JobSpec(global_batch_size=15360, seq_len=4096, precision="fp8")
    par = ParallelConfig(tp=1, pp=16, ep=64)
    g = graphs_for(dsv3, job.seq_len)["moe"]
    plain = layer_cost(g, dsv3, _h800("alltoall"), job, par, 128)
    over = layer_cost(g, dsv3, _h800("alltoall", overlap=True), job, par, 128)
    # NCCL's all-to-all over eight nodes holds its 16 p2p channels' SMs beside compute (gpus.yaml h800
    # nccl_p2p_channels_net; moe.nccl_alltoall_ctas) while it runs: the compute beside its A seconds goes at 116/132,
    # C seconds of it end f·min(A, C/(1 − f)) later (layer_cost.a2a_sm_slowdown)
    f, compute, a2a = 16 / 132, plain.forward_s + plain.backward_s, plain.ep_s
    slow = 1 + f * min(a2a, compute / (1 - f)) / compute
    assert 1 < slow <= 132 / 116
    assert over.forward_s == approx(plain.forward_s * slow)
    # Megatron-Core's overlap as its schedule runs (ep_comm.a2a_overlap_exposed_s): at least what the whole
    # layer's compute cannot cover shows, and exactly what the two-stream layer step leaves
    assert over.ep_s >= max(0.0, plain.ep_s - (over.forward_s + over.backward_s)) - 1e-12
    parts = moe_all_to_all_parts(dsv3, _h800("alltoall"), job, 4096.0, 64, RankStrides.megatron(1, 1, 128).ep)
    nodes = a2a_overlap_compute_split(g, dsv3, _h800("alltoall"), job, par, None)
    nodes = OverlapNodes(*(x * slow for x in (nodes.attn_f, nodes.attn_b, nodes.mlp_f, nodes.mlp_b, nodes.comb_f,
                                              nodes.comb_b)))
    assert over.ep_s == approx(a2a_overlap_exposed_s([x[0] for x in parts], nodes))
    assert over.ep_s < plain.ep_s
    deep_plain = layer_cost(g, dsv3, _h800("deepep"), job, par, 128)
    deep = layer_cost(g, dsv3, _h800("deepep", overlap=True), job, par, 128)
    f, a2a = 20 / 132, deep_plain.ep_s  # 20 of 132 SMs run DeepEP while its all-to-alls run
    assert deep.forward_s == approx(plain.forward_s * (1 + f * min(a2a, compute / (1 - f)) / compute))


def test_a2a_sm_slowdown_only_while_the_all_to_all_runs() -> None:
    """Compute beside an all-to-all holding f of the SMs: none without it, f·A later while A < C/(1 − f), and
    1/(1 − f) (the whole compute on 1 − f of the SMs) once the all-to-all outlasts it."""
    from cost_models.layer_cost import a2a_sm_slowdown

    assert a2a_sm_slowdown(0.25, 1.0, 0.0) == 1.0
    assert a2a_sm_slowdown(0.0, 1.0, 5.0) == 1.0
    assert a2a_sm_slowdown(0.25, 1.0, 0.4) == approx(1.1)
    assert a2a_sm_slowdown(0.25, 1.0, 10.0) == approx(1 / 0.75)
    assert a2a_sm_slowdown(0.25, 1.0, 4 / 3) == approx(1 / 0.75)


def test_dualpipe_bubble_and_two_stage_copies(dsv3) -> None:  # type: ignore[no-untyped-def]
    p, m = 16, 120
    assert bubble_fraction(p, m, "dualpipe") == approx((p - 2) / 3 / (m + (p - 2) / 3))
    job = JobSpec(global_batch_size=15360, seq_len=4096, precision="fp8")
    c = _h800("deepep")
    one = estimate(dsv3, c, job, ParallelConfig(tp=1, pp=16, ep=64), target="deepseek")
    dual = estimate(dsv3, c, job, ParallelConfig(tp=1, pp=16, ep=64, schedule="dualpipe"), target="deepseek")
    assert dual.memory_gib["weights"] > 1.8 * one.memory_gib["weights"]  # each rank holds stage i and p−1−i


def test_deepseek_v3_published_layout() -> None:
    """2048 H800, tp 1 pp 16 ep 64, fp8: fits in 80 GB under the default headroom and is within 15% of the step
    time its report's GPU hours imply — from the physics above, no per-run factor."""
    fid = _fidelity()
    meas = fid.deepseek_v3_step_s()
    assert meas == approx(19.9, abs=0.1)
    pred = fid.deepseek_v3_prediction()
    assert pred.fits and pred.peak_memory_gib <= 80 * 0.95
    assert abs(pred.step_time_s / meas - 1) <= 0.15
    assert "DeepSeek-V3" in fid.render_deepseek()
