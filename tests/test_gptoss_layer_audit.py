"""Issue 12, refuted leads recorded (s18): where in a GPT-OSS-120B layer is the Megatron-Bridge miss?

Every GPT-OSS-120B Bridge row is predicted 20-50% fast; the Qwen3 rows of the same releases and GPUs are priced
within a few %. A code-level audit of what a GPT-OSS layer launches under megatron-core 0.15-0.19 + TE 2.9-2.12 found
nothing large left unpriced (each item is priced, or small, as its source says):

- learnable-softmax (sink) backward: TE hands cuDNN ``set_dsink_token`` (fused_attn_f16_arbitrary_seqlen.cu:849-854
  @ TE v2.10); cuDNN-frontend builds dSink from the ``dO * O -> softmax_sum`` chain every SDPA backward runs anyway
  (sub_sink, exp, mul, one reduction over b x h x s_q: scaled_dot_product_flash_attention.h:1527-1547 @
  NVIDIA/cudnn-frontend 3929da2): no pass over the scores, ~8 MB per layer-micro-batch;
- the 128-token window: cuDNN skips the masked tiles (benchmarks/gpu_facts.py SWA128_D64_BENCH, time linear in s), and
  the model prices that kernel slower than measured (``swa128_crosscheck``);
- the expert biases: fc1's rides the GEMM (bias epilogue forward; bf16 dbias in the wgrad GEMM, MXFP8 in
  ``bgrad_quantize``: grouped_linear.py:313-347 @ TE v2.10); fc2's is Megatron's eager ``_apply_bias``
  (op_traffic.MCORE_EXPERT_BIAS_BYTES, recounted by hand: 28 / 12 B forward with fp32 / bf16 probs);
- the clamp and quick-GeGLU, YaRN's unfused RoPE (24 B forward per q/k element, recounted), the router (bias, top-k
  then softmax over [tokens, 128]), Bridge's unfused bias-dropout-add (dropout p 0 returns its input) and the 201k
  vocabulary's head + TE cross-entropy at pp 1: priced, or under 0.1 ms per layer-micro-batch;
- ``weighted_bias_quick_geglu_impl`` builds its offset with ``torch.tensor(..., device=cuda)``
  (fusions/fused_bias_geglu.py:434, core_v0.15.0-0.19.0), a blocking H2D copy that synchronizes the stream
  (ATen Copy.cu ``memcpy_and_sync``; pytorch/pytorch#120996): a second host sync per MoE layer forward (and per
  ``moe_act`` recompute). Not priced: the model's whole forward host issue of a GPT-OSS layer (0.4 x (2.48 + 2 x
  0.352) = 1.27 ms at ep 64) is under the device work after that sync (the activation, fc2, its bias and the combine:
  >= 1.9 ms on GB300), so the host wait it would add (``ep_comm.host_bound_s``) is zero.

The data locate the miss (these tests): it is per token, not per step; it is not the attention core (doubling the
sequence at equal tokens per micro-batch moves it by a small fraction of the attention work it adds); and no cost
class the model prices for both models explains GPT-OSS and Qwen3 together, so a per-class factor would be a
per-model fit. What remains is GPT-OSS-specific and halves under the MXFP8 fused grouped MLP; it needs a profile.
s26: the glue's kernels, timed on an H200 under torch.profiler, move its bytes at 1/1.82 of the streaming rate
(``Efficiency.mcore_glue_time_ratio``, benchmarks/gptoss_glue_compare.py): priced since, the miss is ~1 ms smaller."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from benchmark_modules import heldout_rows
from cost_models.estimate import estimate
from cost_models.op_cost import op_compute
from cost_models.opgraph import layer_graph
from cost_models.quant_layout import op_job
from cost_models.targets import runtime_for

FILES = ("more_runs_gptoss.json", "more_runs.json", "more_runs_bridge2.json")
# Blackwell rows of one release window, both models: GPT-OSS BF16 (all four GPUs) and MXFP8, Qwen3 on HybridEP (the
# accurate ones). Left out: 26.06.01 (cudnn-frontend#256's dbias regression) and 26.02's B200/B300 ep-64 GPT-OSS rows
# (their all-to-all crosses InfiniBand: another miss).
RELEASES = ("26.02.01", "26.04", "26.04.01", "26.06", "26.08", "2602", "2604", "2606")
BLACKWELL = ("gb200", "gb300", "b200", "b300")


def _row(case: dict[str, Any], rules: dict[str, Any], heldout: Any, fidelity: Any) -> dict[str, Any]:
    """A row's measured and predicted step, layer-micro-batches, tokens per micro-batch and the MoE layer's priced
    time per class (ms, one micro-batch, forward + backward): expert GEMMs, other GEMMs, attention core,
    memory-bound kernels."""
    run = heldout.resolve_run(fidelity.to_run(case, rules))
    cluster, par, job = run.cluster_with(), run.parallel, run.job
    pred = estimate(run.model, cluster, job, par, target=run.target, software=run.knobs, check=False)
    rt = runtime_for(run.target, job, cluster, par, run.knobs)
    graph = layer_graph(run.model, "moe", job.seq_len)
    cls = {"experts": 0.0, "gemm": 0.0, "attention": 0.0, "memory": 0.0}
    for op in graph.ops:
        op_j, op_rt = op_job(op, graph, job, rt)
        c = op_compute(op, graph, run.model, cluster, op_j, par, op_rt)
        if op.kind == "experts":
            cls["experts"] += 3e3 * c.gemm_f
        elif op.kind in ("matmul", "router"):
            cls["gemm"] += 3e3 * c.gemm_f
        cls["attention"] += 1e3 * (c.attn_f + c.attn_b)
        cls["memory"] += 1e3 * (c.mem_f + c.mem_b)
    lm = pred.num_microbatches * max(pred.layers_per_stage)
    return {"measured": run.measured_step_time_s, "predicted": pred.step_time_s, "lm": lm,
            "excess_ms": (run.measured_step_time_s - pred.step_time_s) / lm * 1e3,
            "tokens": par.micro_batch_size * job.seq_len, "gpt_oss": "GPT_OSS" in case["id"],
            "dispatcher": rt.moe_dispatcher if rt is not None else None, **cls}


def _kept(case: dict[str, Any]) -> bool:
    """GPT-OSS-120B and Qwen3 (forced balance) of ``RELEASES`` on Blackwell, and GPT-OSS of 25.11 / 26.02 on GB200 /
    GB300 (the attention / per-step pairs below)."""
    cid, gpu = case["id"], case["cluster"]["gpu"]
    oss = "GPT_OSS_120B" in cid
    if not (oss or "Qwen3" in cid) or "natural" in cid:
        return False
    release = cid.split("_")[0][2:]
    return (oss and release in ("25.11", "26.02") and gpu in BLACKWELL[:2]) or (
        release in RELEASES and gpu in BLACKWELL)


@pytest.fixture(scope="module")
def rows() -> dict[str, dict[str, Any]]:
    return heldout_rows(FILES, _kept, _row)


def test_the_gpt_oss_miss_is_per_token_not_per_step(rows) -> None:  # type: ignore[no-untyped-def]
    # GB300, same recipe (TE graphs, alltoall, ep 64, no recompute), 16384 tokens per micro-batch: 25.11 runs gbs 1280
    # at seq 8192 (10 micro-batches), 26.02 at seq 4096 (5). Twice the tokens per step, twice the missing seconds.
    a, b = rows["mb25.11_GPT_OSS_120B_gb300_64gpu_BF16"], rows["mb26.02_GPT_OSS_120B_gb300_64gpu_BF16"]
    assert a["tokens"] == b["tokens"] and a["lm"] == 2 * b["lm"]
    ratio = (a["measured"] - a["predicted"]) / (b["measured"] - b["predicted"])
    assert 1.7 < ratio < 2.3


def test_the_attention_core_is_not_the_missing_term(rows) -> None:  # type: ignore[no-untyped-def]
    # Same pair: seq 8192 doubles the full-attention layers' keys per query at equal tokens. If the attention core
    # ran k x its price, the excess per layer-micro-batch would move by (k - 1) x the attention the model adds.
    a, b = rows["mb25.11_GPT_OSS_120B_gb300_64gpu_BF16"], rows["mb26.02_GPT_OSS_120B_gb300_64gpu_BF16"]
    added = a["attention"] - b["attention"]
    assert added > 1.0  # ms: the model prices the longer sequence's attention
    k_minus_1 = (a["excess_ms"] - b["excess_ms"]) / added
    assert abs(k_minus_1) < 0.25  # so the kernel runs within ~25% of its price...
    assert b["excess_ms"] > 2.5 * added  # ...while the miss would need it > 3.5x its price (s26: the glue's measured
    # kernel rate, Efficiency.mcore_glue_time_ratio, took ~1 ms of it; before, > 4x)
    # GB200 (recompute recipe): 25.11 runs mbs 1 x 8192, 26.02 mbs 4 x 4096. Per token, the longer sequence misses
    # less, though its attention per token doubles.
    c, d = rows["mb25.11_GPT_OSS_120B_gb200_64gpu_BF16"], rows["mb26.02_GPT_OSS_120B_gb200_64gpu_BF16"]
    assert c["attention"] / c["tokens"] > 1.4 * d["attention"] / d["tokens"]
    assert c["excess_ms"] / c["tokens"] < d["excess_ms"] / d["tokens"]


def _sel(rows: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    return [r for cid, r in rows.items() if cid.split("_")[0][2:] in RELEASES
            and (r["gpt_oss"] or r["dispatcher"] == "hybridep")]


def test_no_cost_class_of_both_models_explains_the_gpt_oss_miss(rows) -> None:  # type: ignore[no-untyped-def]
    sel = _sel(rows)
    oss = [r for r in sel if r["gpt_oss"]]
    qwen = [r for r in sel if not r["gpt_oss"]]
    assert len(oss) >= 14 and len(qwen) >= 20
    # every GPT-OSS row misses by > 1.9 ms per layer-micro-batch (> 2.5 before s26's measured glue kernel rate, > 2.0
    # before s33's B200 HBM rate of 7.672 TB/s)
    assert min(r["excess_ms"] for r in oss) > 1.9
    assert np.sqrt(np.mean([r["excess_ms"] ** 2 for r in qwen])) < 1.5  # the Qwen3 rows are priced right
    y = np.array([r["excess_ms"] for r in sel])
    for cls in ("experts", "gemm", "attention", "memory", "tokens"):
        x = np.array([[r[cls]] for r in sel], dtype=float)
        fit = x @ np.linalg.lstsq(x, y, rcond=None)[0]
        rms_oss = float(np.sqrt(np.mean([(yy - f) ** 2 for yy, f, r in zip(y, fit, sel) if r["gpt_oss"]])))
        # one scale on a class both models run leaves the GPT-OSS rows off by more than half their own mean miss
        assert rms_oss > 0.4 * float(np.mean([r["excess_ms"] for r in oss])), cls


def test_the_mxfp8_fused_grouped_mlp_rows_miss_about_half(rows) -> None:  # type: ignore[no-untyped-def]
    # 26.06 / 26.08 (MXFP8, TE's fused grouped MLP) against 26.02.01-26.04.01 (BF16, eager expert glue), per GPU: the
    # missing work sits where the fused MLP / MXFP8 change the layer (expert GEMMs and their glue), not in the
    # attention or the dispatch, which the two recipes share.
    def mean(gpu: str, releases: tuple[str, ...]) -> float:
        xs = [r["excess_ms"] for cid, r in rows.items() if r["gpt_oss"] and f"_{gpu}_" in cid
              and cid.split("_")[0][2:] in releases]
        assert xs, gpu
        return float(np.mean(xs))

    for gpu in ("gb200", "gb300"):
        ratio = mean(gpu, ("26.06", "26.08")) / mean(gpu, ("26.02.01", "26.04", "26.04.01"))
        assert 0.3 < ratio < 0.65, gpu
