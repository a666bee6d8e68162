"""COST_MODEL.md §8 worked numbers, recomputed from the model (never copied into the code).

Each test states its tolerance. The figures in §8 are rounded, so tolerances are a few percent unless the
number is an exact closed form.
"""

from __future__ import annotations

import pytest

from autoplan.catalog import build_cluster, load_model
from cost_models.collectives import bytes_sent_per_rank, collective_time_s, group_collective_time_s
from cost_models.estimate import estimate
from cost_models.layer_cost import layer_cost
from cost_models.memory import GIB, activation_bytes_per_microbatch, zero_state_bytes
from cost_models.opgraph import layer_graph
from cost_models.pipeline import bubble_fraction
from cost_models.specs import JobSpec, ModelSpec, ParallelConfig
from cost_models.validate import stage_layers


def approx(x: float, rel: float) -> object:
    return pytest.approx(x, rel=rel)


@pytest.fixture(scope="module")
def llama405() -> ModelSpec:
    return load_model("llama3-405b")


# --- Llama 3 405B, s=8192, b=1, TP8 PP16 DP128, m=16, SP, ZeRO-1 ------------------------------------------
@pytest.fixture(scope="module")
def run405(llama405: ModelSpec):  # type: ignore[no-untyped-def]
    cluster = build_cluster("h100-sxm", 16384)
    job = JobSpec(global_batch_size=16 * 128, seq_len=8192)
    par = ParallelConfig(tp=8, pp=16, micro_batch_size=1, sequence_parallel=True, zero_stage=1)
    return cluster, job, par


def test_405b_tp_traffic_per_gpu(llama405: ModelSpec, run405) -> None:  # type: ignore[no-untyped-def]
    cluster, job, par = run405
    lc = layer_cost(layer_graph(llama405, "dense", job.seq_len), llama405, cluster, job, par, dp=128)
    layers_per_stage = llama405.num_layers / par.pp  # 7.875 on average
    m = 16
    assert lc.tp_bytes * layers_per_stage * m / GIB == approx(220.5, 0.005)


def test_405b_dp_and_pp_traffic(llama405: ModelSpec) -> None:
    n_local = llama405.num_params / (8 * 16)
    rs = bytes_sent_per_rank("reduce_scatter", 2 * n_local, 128) / GIB
    assert rs == approx(5.86, 0.01)
    assert bytes_sent_per_rank("all_gather", 2 * n_local, 128) / GIB == approx(5.86, 0.01)
    # PP: per micro-batch a 2·s·b·h/t activation forward and its gradient backward.
    per_mb = 2 * bytes_sent_per_rank("send_recv", 2 * 8192 * 16384 / 8, 2)
    assert per_mb * 16 / GIB == approx(1.0, 0.01)


def test_405b_bubble_and_stage_split(llama405: ModelSpec, run405) -> None:  # type: ignore[no-untyped-def]
    cluster, job, par = run405
    assert bubble_fraction(16, 16) == approx(0.484, 0.002)
    assert stage_layers(llama405, par) == [7] + [8] * 14 + [7]  # 126 layers on 16 stages is legal
    pred = estimate(llama405, cluster, job, par)
    assert sum(pred.layers_per_stage) == 126
    # Bubble of the full estimate is at least the balanced closed form's share of its pipeline time.
    assert pred.time.bubble_s > 0.4 * pred.step_time_s


def test_405b_resident_state(llama405: ModelSpec) -> None:
    n_local = llama405.num_params / (8 * 16)
    state = sum(zero_state_bytes(n_local, 1, 128)) / GIB
    assert state == approx(12.0, 0.02)


def test_405b_activations_per_layer(llama405: ModelSpec, run405) -> None:  # type: ignore[no-untyped-def]
    _, job, par = run405
    # Korthikanti Table 2 for the GPT layer, TP with SP: s·b·h/t·34 (flash: no 5as/h term) = 544 MiB.
    s, b, h, t = 8192, 1, 16384, 8
    gpt_formula = s * b * h / t * 34 / 2**20
    assert gpt_formula == approx(544, 0.001)
    # The op graph derives Llama's own constant (SwiGLU f = 3.25h, GQA 8 KV heads, no dropout): 31.75.
    derived = activation_bytes_per_microbatch(layer_graph(llama405, "dense", s), llama405, job, par) / 2**20
    assert derived == approx(544, 0.08)
    assert derived == approx(s * b * h / t * 31.75 / 2**20, 1e-9)


def test_405b_long_context_cp_ring(llama405: ModelSpec) -> None:
    cluster = build_cluster("h100-sxm", 16384)
    job = JobSpec(global_batch_size=32 * 8, seq_len=131072)
    par = ParallelConfig(tp=8, cp=16, pp=16)
    lc = layer_cost(layer_graph(llama405, "dense", job.seq_len), llama405, cluster, job, par, dp=8)
    assert lc.cp_bytes * (126 / 16) * 32 / GIB == approx(44.3, 0.005)


# --- Llama 3 70B on 1024 GPUs: bubble -------------------------------------------------------------------
def test_70b_bubbles() -> None:
    assert bubble_fraction(8, 32) == approx(0.179, 0.005)
    assert bubble_fraction(4, 16, "interleaved", 2) == approx(0.086, 0.005)


def test_70b_estimate_bubble_matches_closed_form() -> None:
    model, cluster = load_model("llama3-70b"), build_cluster("h100-sxm", 1024)
    pred = estimate(model, cluster, JobSpec(global_batch_size=512, seq_len=8192), ParallelConfig(tp=8, pp=8))
    assert pred.num_microbatches == 32
    pipeline = pred.step_time_s - pred.time.exposed_comm_s["dp"] - pred.time.optimizer_s
    pp_fill = pred.time.exposed_comm_s["pp"]
    share = (pred.time.bubble_s - pp_fill) / (pipeline - pp_fill)
    # The head makes the last stage the slowest (Alpa eq. 2 with t_max > the others), so the bubble's share
    # sits just under the balanced closed form 7/39 = 0.179.
    assert 0.9 * 7 / 39 < share <= 7 / 39


# --- Resident state and ZeRO ----------------------------------------------------------------------------
def test_7b_ddp_resident_state() -> None:
    p, g, o = zero_state_bytes(7e9, 0, 1)
    assert (p, g, o) == (14e9, 14e9, 84e9)  # 14 + 14 + 28 + 28 + 28 GB
    assert p + g + o == 112e9


@pytest.mark.parametrize("r, expected", [(8, (96, 33, 22.5, 12)), (4, (96, 42, 33, 24))])
def test_zero_stages(r: int, expected: tuple[float, ...]) -> None:
    params = 6 * GIB  # P = 12 GiB of bf16 weights
    got = tuple(sum(zero_state_bytes(params, z, r)) / GIB for z in range(4))
    assert got == pytest.approx(expected)


# --- DDP all-reduce --------------------------------------------------------------------------------------
def test_ddp_allreduce_times() -> None:
    sent = bytes_sent_per_rank("all_reduce", 14e9, 8)
    assert sent / 1e9 == approx(24.5, 0.001)
    assert collective_time_s("all_reduce", 14e9, 8, 450e9, 0.0) * 1e3 == approx(54, 0.01)
    sent70 = bytes_sent_per_rank("all_reduce", 140e9, 64)
    assert sent70 / 1e9 == approx(277, 0.01)
    flat = collective_time_s("all_reduce", 140e9, 64, 40e9, 0.0)
    assert flat == approx(6.9, 0.01)


def test_hierarchical_allreduce_beats_flat_ring_over_ib() -> None:
    """NCCL's hierarchical all-reduce moves only S/8 across the NIC, so 64 GPUs over 8 nodes beat a flat
    IB ring (COST_MODEL.md §1: 'do not assume the whole payload crosses IB')."""
    cluster = build_cluster("h100-sxm", 64)
    hier = group_collective_time_s("all_reduce", 140e9, 64, 1, cluster)
    flat_nic = collective_time_s("all_reduce", 140e9, 64, cluster.inter_node_gbps / 8 * 1e9, 0.0)
    assert hier < flat_nic / 3


# --- TP on Llama-7B ----------------------------------------------------------------------------------------
def test_llama7b_tp_traffic_and_time() -> None:
    model = load_model("llama2-7b")
    s, b, h = 2048, 1, 4096
    payload = 2 * s * b * h  # bf16
    per_layer = 4 * 2 * payload  # 4 all-reduces, ≈ 2·S on the wire each for large n
    assert per_layer / 1e6 == approx(134, 0.01)
    assert per_layer / 450e9 * 1e3 == approx(0.30, 0.01)
    cluster = build_cluster("h100-sxm", 8)
    lc = layer_cost(layer_graph(model, "dense", s), model, cluster, JobSpec(global_batch_size=1, seq_len=s),
                    ParallelConfig(tp=8, micro_batch_size=1), dp=1)
    assert lc.tp_bytes == approx(per_layer * 7 / 8, 1e-9)  # exact ring: 2(n−1)/n
    # TP scaling efficiency falls with t (§8 gives ≈ 0.96 / 0.92 / 0.85; that needs an unstated compute
    # time, so only the ordering is asserted here).
    effs = []
    for t in (2, 4, 8):
        c = layer_cost(layer_graph(model, "dense", s), model, cluster, JobSpec(global_batch_size=1, seq_len=s),
                       ParallelConfig(tp=t), dp=1)
        effs.append((c.forward_s + c.backward_s) / c.total_s)
    assert effs[0] > effs[1] > effs[2]


# --- PP bubbles --------------------------------------------------------------------------------------------
def test_pp_bubble_rules() -> None:
    m_needed = next(m for m in range(1, 1000) if bubble_fraction(8, m) <= 0.10)
    assert m_needed == 63
    ideal = lambda p, m, v=1: (p - 1) / (v * m)  # noqa: E731 — bubble as a share of ideal
    assert ideal(8, 16) == approx(0.44, 0.01)
    assert ideal(8, 16, 4) == approx(0.11, 0.01)
    f = bubble_fraction(8, 16, "interleaved", 4)
    assert f / (1 - f) == approx(ideal(8, 16, 4), 1e-9)
