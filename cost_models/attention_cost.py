"""The attention core's kernel time factors and context parallelism's ring (COST_MODEL.md §2, §4): FlashAttention's
backward ≈ 2.5× its forward (Dao 2023, FlashAttention-2 §3.2: recomputes P); the fused kernel's saturation in the
keys each query sees (windows, ring-CP steps) and in its head dim; Megatron's unfused path (batched GEMMs +
softmax/dropout through HBM) where ``flash_attention`` is off; ring attention's K/V traffic and its per-step merges."""

from __future__ import annotations

from cost_models.collectives import group_collective_time_s
from cost_models.gemm import hbm_time_s, matmul_time_s
from cost_models.opgraph import LayerGraph, LayerKind, Op, mean_keys_per_query, tp_divisor
from cost_models.specs import (ATTENTION_REF_HEAD_DIM, ATTENTION_REF_KEYS, ClusterSpec, JobSpec, ModelSpec,
                               ParallelConfig)


ATTN_BWD_FACTOR = 2.5
# Unfused attention (Megatron-LM ≤ 2022 GPT: fused scale-mask-softmax, then attention dropout) per score element:
# forward softmax read 2 + write 2, dropout read 2 + write 2 + mask 1; backward dropout (read 2 + 1, write 2) and
# softmax (read probs 2, grad 2, write 2).
SCORE_BYTES = (9.0, 11.0)


def unfused_attention_s(op: Op, model: ModelSpec, cluster: ClusterSpec, job: JobSpec,
                       par: ParallelConfig) -> tuple[float, float]:
    """(forward s, backward s) of the unfused attention core: per local head, QKᵀ and AV as batched GEMMs over the
    full ``s × s`` scores (the causal mask is applied, not skipped), scores through HBM (``SCORE_BYTES``)."""
    heads = model.num_attention_heads / par.tp
    d = model.head_dim_resolved
    b, s_q, s_k = par.micro_batch_size, job.seq_len / par.cp, job.seq_len
    if model.mla is not None:
        d_qk = model.mla.qk_nope_head_dim + model.mla.qk_rope_head_dim
        d_v = model.mla.v_head_dim
    else:
        d_qk = d_v = d
    gemm = heads * b * (matmul_time_s(s_q, d_qk, s_k, cluster) + matmul_time_s(s_q, s_k, d_v, cluster))
    scores = heads * b * s_q * s_k
    return gemm + hbm_time_s(SCORE_BYTES[0] * scores, cluster), 2 * gemm + hbm_time_s(SCORE_BYTES[1] * scores,
                                                                                      cluster)


def cp_ring(graph: LayerGraph, cluster: ClusterSpec, job: JobSpec, par: ParallelConfig,
            stride: int, ring: int | None = None) -> tuple[float, float]:
    """(seconds, bytes) of ring attention's K/V traffic for one micro-batch: 3·(n−1) blocks of
    (s/c)·b·(w_k + w_v)/t · 2 bytes (forward K,V; backward K,V and dK,dV), neighbours at ``stride``; with
    t > num_kv_heads a rank holds one K/V head (``tp_divisor``). ``n`` = ``ring`` ranks (default c; a2a+p2p: c/a,
    whose blocks hold a× the tokens of 1/a of the heads: the same bytes)."""
    c = par.cp
    if c <= 1:
        return 0.0, 0.0
    tokens = par.micro_batch_size * job.seq_len / c
    k, v = graph.tensors["k"], graph.tensors["v"]
    block = tokens * (k.width / tp_divisor(par.tp, k.heads) + v.width / tp_divisor(par.tp, v.heads)) * 2.0
    n_blocks = 3 * ((ring or c) - 1)
    return n_blocks * group_collective_time_s("send_recv", block, 2, stride, cluster), n_blocks * block


# Ring attention as Megatron-Core runs it (Transformer Engine ``AttnFuncWithCPAndKVP2P``,
# transformer_engine/pytorch/attention/dot_product_attention/context_parallel.py): the sequence is cut into 2c chunks,
# rank i holding chunks i and 2c−1−i (causal load balance), and each of the c ring steps runs the flash kernel on the
# local queries against one received K/V block. Every step's kernel therefore sees on average s/(2c) keys per query,
# against s/2 for the unsplit causal kernel the ``attention`` efficiency is measured on; and each step's partial
# result is merged outside the kernel: forward ``flash_attn_fwd_out_correction`` (read the step's output, read and
# write the accumulated output), backward ``dq.add_(dq_)`` / ``dk.add_(dk_)`` / ``dv.add_(dv_)`` into the buffers
# that travel the ring. HBM bytes per element per step: the step kernel's own write of its partial (2) and the merge
# (read 2 + read/write the accumulator 4); the unsplit kernel writes each element once (2).
CP_STEP_BYTES = 8.0
# Keys per query at which the fused causal attention kernel reaches half its long-sequence throughput: cuDNN forward
# on H100, causal, head dim 128, sequences 512-16k (keys per query s/2): 315, 410, 484, 518, 529, 539 TFLOP/s
# (Shah et al. 2024, FlashAttention-3, Fig. 5) follow x/(x + 180) within 5% from 1k up; FlashAttention-2 alike.
ATTN_HALF_KEYS = 180.0


def cp_kernel_slowdown(job: JobSpec, par: ParallelConfig, cluster: ClusterSpec, steps: int | None = None) -> float:
    """Time factor of the flash kernel under ring CP: each step's kernel sees ``s/(2n)`` keys per query instead of
    the unsplit causal kernel's ``s/2``, on the measured saturation ``x/(x + ATTN_HALF_KEYS)``; ``n`` = ``steps``
    (``knob_effects.ring_steps``; default cp)."""
    n = steps or par.cp
    if n <= 1:
        return 1.0
    half = ATTN_HALF_KEYS

    def sat(x: float) -> float:
        return x / (x + half)

    return sat(job.seq_len / 2) / sat(job.seq_len / (2 * n))


def kernel_head_dim(model: ModelSpec) -> float:
    """Head dim the fused kernel's per-score work scales with: the mean of its QKᵀ and PV contraction widths
    (FLOPs per score ∝ d_qk + d_v; MLA: (192 + 128)/2 = 160 on DeepSeek-V3), else the model's head dim."""
    if model.mla is not None:
        return (model.mla.qk_nope_head_dim + model.mla.qk_rope_head_dim + model.mla.v_head_dim) / 2
    return float(model.head_dim_resolved)


def head_dim_factor(model: ModelSpec, cluster: ClusterSpec) -> float:
    """Time factor of the fused attention kernel at the model's head dim against ``ATTENTION_REF_HEAD_DIM`` (where
    the generation's ``attention`` share is measured), at equal FLOPs.

    Per score the kernel pays its softmax (exponential, row max, rescale: SFU / ALU work) once and its MMAs in
    proportion to d, so its throughput goes as d/(d + d½), d½ the head dim at which both take equal time; the
    generation's measured d-64/d-128 ratio r = ``attention_d64`` sets d½ = 128·(1 − r)/(2r − 1) (cuDNN SDPA,
    benchmarks/gpu_facts.py ATTENTION_HEAD_DIM_BENCH: Hopper 0.80 → d½ 44; Blackwell 0.74 → 70). Head dims >= 128
    keep the reference share: there the same benchmarks measure no gain (Blackwell MLA 192/128 and d 256 within ±10%
    of d 128; FlashAttention-3 Fig. 5, H100 cuDNN d 256 ≈ d 128), so nothing is extrapolated upwards."""
    r = cluster.efficiency.attention_d64
    d = kernel_head_dim(model)
    if r is None or d >= ATTENTION_REF_HEAD_DIM:
        return 1.0
    ref = float(ATTENTION_REF_HEAD_DIM)
    half = ref * (1.0 - r) / (2.0 * r - 1.0)
    return (ref / (ref + half)) / (d / (d + half))


def attention_kernel_factor(model: ModelSpec, job: JobSpec, par: ParallelConfig, cluster: ClusterSpec,
                            steps: int, kind: LayerKind = "dense") -> float:
    """Time factor of the fused attention kernel against the one the generation's ``attention`` share describes.

    With ``attention_half_keys`` set, the kernel's throughput follows its generation's measured saturation in the
    keys each query sees, ``x/(x + attention_half_keys)``, and ``attention`` is its share at
    ``ATTENTION_REF_KEYS`` (an 8192-token causal sequence, where ``ATTENTION_KERNEL_BENCH`` is measured): a kernel
    over ``x = keys_per_query / n`` keys (``n`` ring-CP steps, each on one K/V chunk) runs
    ``sat(ATTENTION_REF_KEYS) / sat(x)`` times as long. Without it (the generation's fitted share holds at every
    length), only ring CP's shorter per-step kernels are slower: ``cp_kernel_slowdown``. Either way times the
    head-dim factor (``head_dim_factor``)."""
    half = cluster.efficiency.attention_half_keys
    head = head_dim_factor(model, cluster)
    if half is None:
        return head * (cp_kernel_slowdown(job, par, cluster, steps) if steps > 1 else 1.0)
    keys = mean_keys_per_query(model, kind, job.seq_len) / max(steps, 1)  # layers of ``kind``, each its window
    return head * (ATTENTION_REF_KEYS / (ATTENTION_REF_KEYS + half)) / (keys / (keys + half))


def cp_merge_bytes(op: Op, graph: LayerGraph, job: JobSpec, par: ParallelConfig,
                   steps: int | None = None) -> tuple[float, float]:
    """HBM bytes (forward, backward) of ring CP's per-step merges on one rank for one micro-batch: the output
    forward, dQ and dK/dV backward, ``CP_STEP_BYTES`` per element per step less the unsplit kernel's one write,
    over ``n`` = ``steps`` ring steps (default cp; a2a+p2p: cp/a steps on a× the tokens of 1/a of the heads)."""
    c = par.cp
    if c <= 1:
        return 0.0, 0.0
    tokens = par.micro_batch_size * job.seq_len / c
    per = (CP_STEP_BYTES * (steps or c) - 2.0) * tokens / par.tp
    out = graph.tensors[op.output].width
    q, k, v = (graph.tensors[x].width for x in op.inputs)
    return per * out, per * (q + k + v)


def ring_exposed_s(ring_s: float, attention_s: float) -> float:
    """CP traffic that overlaps the attention core as a whole (``attention_s``: the share it can hide behind): what
    shows. A ring's blocks are priced step by step: ``ring_steps_exposed_s``."""
    return max(0.0, ring_s - attention_s)


def ring_steps_exposed_s(ring_s: float, attention_f_s: float, attention_b_s: float, steps: int) -> float:
    """What shows of ring attention's K/V traffic (``cp_ring``: ``3·(n−1)`` equal blocks, ``ring_s`` in all) beside
    its ``n`` = ``steps`` step kernels, step by step as Transformer Engine's ``AttnFuncWithCPAndKVP2P`` overlaps them
    (transformer_engine/pytorch/attention/dot_product_attention/context_parallel.py @ d0067d0). Forward (l.
    1698-1716): step i's kernel runs while the K/V block of step i+1 travels, so the n−1 blocks hide behind the first
    n−1 of the n kernels and the last kernel hides nothing. Backward (l. 2459-2497, waits at l. 2718): each step's
    kernel runs beside one transfer: the next K/V block (step 0), the next K/V with the dK/dV accumulated so far
    (steps 1..n−2: two blocks), the last dK/dV (step n−1). Causal load balance (2n chunks, rank i holding i and
    2n−1−i) gives every step the same work: each kernel is 1/n of its pass's attention core. Never less than the
    whole-core overlap ``ring_exposed_s`` prices; more where a block outlasts its step's kernel (short chunks,
    wide K/V: MHA or MLA heads)."""
    n = steps
    if n <= 1 or ring_s <= 0.0:
        return 0.0
    block = ring_s / (3 * (n - 1))
    f, g = attention_f_s / n, attention_b_s / n
    forward = (n - 1) * max(0.0, block - f)
    backward = 2 * max(0.0, block - g) + (n - 2) * max(0.0, 2 * block - g)
    return forward + backward
