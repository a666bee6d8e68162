"""What one rank of a Gated DeltaNet mixer (``ModelSpec.gdn``; megatron-core 0.16.1 ``GatedDeltaNet``,
megatron/core/ssm/gated_delta_net.py) computes and moves: the causal conv1d + chunked gated delta rule's FLOPs
(``gdn_core_flops``) and HBM bytes (``gdn_traffic_bytes``), priced by ``op_cost.op_compute`` as the Mamba-2 scan is
(``cost_models.mamba``): memory-bound by its bytes, or by its tensor-core work at the rate Triton's chunked-scan kernels
sustain (``Efficiency.ssd_tflops``, fitted on mamba_ssm's kernels; flash-linear-attention's chunk kernels are Triton
kernels of the same shape, batched C×C and C×d tiles on tensor cores; no public measurement of their rate was found),
whichever is longer.

Tensor parallelism splits the key and value heads (gated_delta_net.py:146-200: in_proj column-parallel, conv1d,
dt_bias, A_log per local head; out_proj row-parallel); megatron-core 0.16.1 has no context parallelism for it
(transformer_config.py:979-983 asserts context_parallel_size == 1; gated_delta_net.py:37 leaves its CP module
commented out): the Megatron target refuses cp > 1 (``cost_models.targets.megatron``)."""

from __future__ import annotations

from cost_models.specs import ModelSpec

BF16, FP32 = 2.0, 4.0

def gdn_core_flops(model: ModelSpec, t: int = 1) -> tuple[float, float]:
    """FLOPs per token (forward, backward) of one rank's share (value heads ``Hv/t``) of the GDN core: the depthwise
    causal conv1d (``2 · conv_dim · taps``, causal_conv1d_fn) and the chunked gated delta rule as
    flash-linear-attention computes it (fla/ops/gated_delta_rule/chunk.py ``chunk_gated_delta_rule_fwd``: Yang, Kautz,
    Hatamizadeh, arXiv:2412.06464 §3.3, the WY / UT-transform chunkwise form of DeltaNet, Yang et al. arXiv:2406.06484
    §3.2), per value head with key dim ``dk``, value dim ``dv`` (q and k repeated to the value heads) and chunk ``C``
    (``GatedDeltaNetSpec.chunk_size``, 64), kernel by kernel per token:

    - ``chunk_scaled_dot_kkt_fwd``  A = β·K·Kᵀ over the chunk square:            2·C·dk
    - ``solve_tril``                (I + A)⁻¹, lower-triangular C×C per chunk:     C²/3
    - ``recompute_w_u_fwd``         W = A·(β·K·eᵍ), U = A·(β·V):                   2·C·dk + 2·C·dv
    - ``chunk_gated_delta_rule_fwd_h``  V' = U − W·S, S ← eᵍ·S + Kᵀ·V' (per chunk, per token 1/C of C rows): 4·dk·dv
    - ``chunk_fwd_o``               O = Q·S + (Q·Kᵀ ⊙ mask)·V' (the chunk square in full): 2·dk·dv + 2·C·dk + 2·C·dv

    forward ``6·C·dk + 4·C·dv + 6·dk·dv + C²/3``; backward twice each forward matmul (its two input gradients) plus
    the recomputed W, U and states the backward rebuilds (``chunk_gated_delta_rule_bwd``: recompute_w_u_fwd and
    chunk_gated_delta_rule_fwd_h again): ``2·fwd + 2·C·dk + 2·C·dv + 4·dk·dv``; the conv's backward twice its
    forward. The masked halves of the chunk squares are counted: the kernels compute them."""
    g = model.gdn
    assert g is not None
    hv, c, dk, dv = g.num_value_heads / t, g.chunk_size, g.key_head_dim, g.value_head_dim
    fwd = 6 * c * dk + 4 * c * dv + 6 * dk * dv + c * c / 3.0
    bwd = 2 * fwd + 2 * c * dk + 2 * c * dv + 4 * dk * dv
    conv = 2.0 * g.conv_dim / t * g.conv_kernel
    return hv * fwd + conv, hv * bwd + 2 * conv


def gdn_model_flops(model: ModelSpec) -> float:
    """Forward model FLOPs per token of the GDN core as Megatron-LM counts them for its MFU (megatron/training/
    training.py:494-515 @ core_v0.16.1: the conv1d ``2 · taps · conv_dim`` and the gated delta rule ``2 · 4 · Hv ·
    dv²``, "KK^T, VK^T, S(a(I-bKK^T)), and SQ"), as the Mamba-2 scan's MFU count is Megatron's: the reported model
    FLOPs; its time is priced from ``gdn_core_flops`` and ``gdn_traffic_bytes``."""
    g = model.gdn
    assert g is not None
    return 2.0 * (g.conv_kernel * g.conv_dim + 4 * g.num_value_heads * g.value_head_dim ** 2)


def gdn_traffic_bytes(model: ModelSpec, t: int = 1) -> tuple[float, float]:
    """HBM bytes per token (forward, backward) of one rank's GDN core at TP ``t`` (``Hv/t`` value heads), kernel by
    kernel as Megatron-Core runs it (gated_delta_net.py:318-391) and flash-linear-attention's chunk path
    (fla/ops/gated_delta_rule/chunk.py ``chunk_gated_delta_rule_fwd``), each tensor read once and written once per
    kernel that takes it, bf16 unless said: the qkv transpose copy and ``causal_conv1d_fn`` (conv_dim in and out
    each); the q/k L2 norms; ``repeat_interleave`` of q and k to the value heads; g (fp32, softplus / exp glue) and
    beta; ``chunk_local_cumsum`` (fp32 g); ``chunk_scaled_dot_kkt_fwd`` (k, beta, g -> A fp32, C per head);
    ``solve_tril`` (A fp32 -> bf16); ``recompute_w_u_fwd`` (A, k, v -> w, u); ``chunk_gated_delta_rule_fwd_h``
    (k, w, u -> states, ``dk·dv/C`` per head and token, and v'); ``chunk_fwd_o`` (q, k, v', states -> o). The backward
    (``chunk_gated_delta_rule_bwd``) re-runs the w/u and state kernels and reads every forward input and each output
    gradient once and writes each input gradient once: taken as the forward's bytes twice plus the recomputed
    kernels' once (the conv's and L2 norms' backward: their forward bytes twice)."""
    g = model.gdn
    assert g is not None
    hv, c, dk, dv = g.num_value_heads / t, g.chunk_size, g.key_head_dim, g.value_head_dim
    kd, conv = g.key_dim / t, g.conv_dim / t  # (value_dim / t is hv·dv: v below)
    qk_rep, v, st = hv * dk, hv * dv, hv * dk * dv / c
    glue = BF16 * 2 * conv * 2 + BF16 * 2 * 2 * kd + BF16 * (2 * kd + 2 * qk_rep)  # copy + conv; l2 norms; repeat
    gates = (BF16 + FP32) * hv + BF16 * 2 * hv + FP32 * 2 * hv  # g (alpha in, fp32 out), beta, chunk cumsum
    kkt = BF16 * (qk_rep + hv) + FP32 * hv + FP32 * hv * c
    tril = FP32 * hv * c + BF16 * hv * c
    w_u = BF16 * (hv * c + qk_rep + v + hv) + FP32 * hv + BF16 * (qk_rep + v)
    h = BF16 * (2 * qk_rep + v) + FP32 * hv + BF16 * (st + v)
    o = BF16 * (2 * qk_rep + v + st) + FP32 * hv + BF16 * v
    fwd = glue + gates + kkt + tril + w_u + h + o
    bwd = 2 * fwd + w_u + h
    return fwd, bwd
