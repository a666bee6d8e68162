"""Sliding-window attention and DeepSeek-V3's multi-token prediction in the cost model (issue 11): the numbers are
recomputed here from the model's fields and the cost model's own pieces (layer_cost, head_cost, matmul_time_s)."""

from __future__ import annotations

import pytest

from autoplan.catalog import build_cluster, load_model
from cost_models.estimate import estimate, head_cost
from cost_models.layer_cost import layer_cost
from cost_models.memory import activation_bytes_per_microbatch, graphs_for, stage_params
from cost_models.mtp import mtp_projection_saved_bytes, mtp_projection_time_s, mtp_stage_params
from cost_models.opgraph import keys_per_query, layer_graph
from cost_models.specs import JobSpec, ParallelConfig
from cost_models.targets import Software, runtime_for


def _no_window(m):  # type: ignore[no-untyped-def]
    return m.model_copy(update={"arch": m.arch.model_copy(update={"sliding_window": None})})


def _no_mtp(m):  # type: ignore[no-untyped-def]
    return m.model_copy(update={"arch": m.arch.model_copy(update={"mtp_layers": 0})})


@pytest.mark.parametrize("seq", [2048, 4096, 8192, 32768])
def test_window_attention_flops(seq: int) -> None:
    """Mistral 7B attends to W = 4096 keys at most (Jiang et al. 2023 §2): per query min(i, W) keys, mean
    W − W²/(2s) past the window, s/2 (the plain causal count) up to it."""
    m = load_model("mistral-7b")
    w, a, d = m.arch.sliding_window, m.num_attention_heads, m.head_dim_resolved
    assert w == 4096
    keys = sum(min(i, w) for i in range(1, seq + 1)) / seq  # the discrete count, query i sees min(i, W) keys
    core = layer_graph(m, "dense", seq).op("attn_core").flops_per_token
    assert abs(core / (2 * a * 2 * d) - keys) <= 0.5  # the continuous form is within half a key of the count
    full = layer_graph(_no_window(m), "dense", seq).op("attn_core").flops_per_token
    assert full == 2 * a * 2 * d * seq / 2
    if seq <= w:
        assert core == full
    else:
        assert core == 2 * a * 2 * d * (w - w * w / (2 * seq)) < full
    assert keys_per_query(seq, w, causal=False) == seq  # a kernel that does not skip masked blocks


def test_window_shortens_the_priced_attention() -> None:
    m = load_model("mistral-7b")
    cluster, job, par = build_cluster("h100-sxm", 8), JobSpec(global_batch_size=8, seq_len=32768), ParallelConfig(tp=8)
    windowed = layer_cost(layer_graph(m, "dense", 32768), m, cluster, job, par, 1)
    full = layer_cost(layer_graph(_no_window(m), "dense", 32768), _no_window(m), cluster, job, par, 1)
    # flash attention is priced by its FLOPs: 3840 keys per query instead of 16384
    assert windowed.attention_s == pytest.approx(full.attention_s * (4096 - 4096**2 / 65536) / 16384)
    assert windowed.total_s < full.total_s


def test_mtp_parameters_on_the_last_stage() -> None:
    """Each MTP module: one layer like the last (MoE), eh_proj 2h→h column-parallel, three norms (Megatron's
    MultiTokenPredictionLayer); all of them on the last pipeline stage, with the vocabulary embedding Megatron builds
    there for them (gpt_model.py:149-157; DeepSeek-V3 does not tie it to the output layer)."""
    m = load_model("deepseek-v3")
    n, h, last = m.arch.mtp_layers, m.hidden_size, m.num_layers - 1
    assert n == 1
    assert sum(mtp_stage_params(m, 1, 1)[:2]) == m.mtp_params  # unsharded: the spec's MTP parameter count
    tp, ep = 2, 64
    par = ParallelConfig(tp=tp, pp=16, ep=ep)
    ex, norms = m.layer_expert_params(last), m.norm_params_per_layer
    with_mtp = stage_params(m, par, [last], first=False, last=True)
    without = stage_params(_no_mtp(m), par, [last], first=False, last=True)
    assert with_mtp.dense - without.dense == pytest.approx((m.layer_params(last) - ex - norms) / tp + norms
                                                           + 2 * h * h / tp + 3 * h + m.vocab_size * h / tp)
    assert with_mtp.expert - without.expert == pytest.approx(ex / ep)
    middle = stage_params(m, par, [last], first=False, last=False)
    assert middle == stage_params(_no_mtp(m), par, [last], first=False, last=False)


def test_mtp_time_and_memory_recomputed() -> None:
    """One stage (pp 1, so it is the last): the compute, TP time, activations and MFU the MTP module adds are a
    MoE layer's and a head's, priced by layer_cost / head_cost, plus eh_proj's GEMMs and its TP collectives."""
    m = load_model("deepseek-v3")
    cluster, job = build_cluster("h100-sxm", 8), JobSpec(global_batch_size=16, seq_len=4096)
    par = ParallelConfig(tp=8, ep=8)
    a = estimate(m, cluster, job, par, check=False)
    b = estimate(_no_mtp(m), cluster, job, par, check=False)
    mb = a.num_microbatches
    graphs = graphs_for(m, job.seq_len)
    lc = layer_cost(graphs["moe"], m, cluster, job, par, 1, runtime_for("megatron", job, cluster, par, Software()))
    head = head_cost(graphs["head"], cluster, job, par)
    h, t = m.hidden_size, par.tp
    proj_gemm, proj_tp = mtp_projection_time_s(m, cluster, job, par)
    from cost_models.gemm import matmul_time_s
    assert proj_gemm == 3 * matmul_time_s(job.seq_len, 2 * h, h // t, cluster)
    assert a.time.compute_s - b.time.compute_s == pytest.approx(mb * (lc.forward_s + lc.backward_s + head + proj_gemm))
    assert a.time.exposed_comm_s["tp"] - b.time.exposed_comm_s["tp"] == pytest.approx(mb * (lc.tp_s + proj_tp))
    assert proj_tp > 0
    act = (activation_bytes_per_microbatch(graphs["moe"], m, job, par)
           + activation_bytes_per_microbatch(graphs["head"], m, job, par))
    saved = mtp_projection_saved_bytes(m, job, par)
    assert saved == 2 * 4 * h * job.seq_len / t  # enorm, hnorm inputs (h each), eh_proj input (2h); SP ÷ t
    assert (a.memory_gib["activations"] - b.memory_gib["activations"]) * 2**30 == pytest.approx(act + saved)
    assert a.mfu > b.mfu  # Megatron's FLOPs count includes the MTP layer, projection and logits
