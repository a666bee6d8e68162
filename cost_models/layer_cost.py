"""Time of one layer for one micro-batch on one rank: compute from the operator graph, and the
critical-path collectives of TP, CP and EP (COST_MODEL.md §2, §4).

Sharding of each matmul under TP (Shoeybi et al. 2019, Megatron-LM §3): an op whose output has head/FFN/
vocab width is column-parallel (``n ÷ t``), one whose input has it is row-parallel (``k ÷ t``); ops on
hidden-width tensors only (MLA down-projections, the router) are replicated. Routed experts run with
expert-TP 1: tokens, not weights, are split across TP ranks (sequence parallel), and each rank runs
``e/ep`` experts on ``tokens·k·ep/e`` tokens each, times the load imbalance ρ.
Backward = 2× forward for GEMMs (dgrad + wgrad); FlashAttention's backward ≈ 2.5× its forward
(Dao 2023, FlashAttention-2 §3.2: recomputes P); with ``flash_attention`` off the core is Megatron's unfused
path (batched GEMMs + softmax/dropout through HBM). Non-GEMM kernels (norms, rotary, activations, residual
adds, the loss, fp8 casts) are memory-bound: their HBM bytes (derived per op below) over the achieved
streaming bandwidth (Williams et al. 2009 roofline; Korthikanti et al. 2022 §4 for which tensors each op
touches).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Literal

from cost_models.a2a_overlap import OverlapNodes, exposed_s as overlap_exposed_s
from cost_models.collectives import (CollectiveKind, RankStrides, bytes_sent_per_rank, group_collective_time_s,
                                     place_group)
from cost_models.gemm import attention_time_s, hbm_time_s, matmul_time_s
from cost_models.knob_effects import (TORCHAO_ACT_CAST_BYTES, cp_comm, eager_elementwise, fp8_cast_bytes,
                                     fp8_forward_gemm_efficiency, fp8_gemm_time_ratio, fp8_rescale_bytes,
                                     non_tn_fp8_gemm, ring_steps, torchao_cast_after_gather, torchao_casts,
                                     tp_overlap_mode, wgrad_in_bf16)
from cost_models.mamba import layout_copy_bytes, ssd_traffic_bytes
from cost_models.moe import (dispatcher_sm_fraction, dispatcher_syncs_host, moe_a2a_overlapped, moe_dispatcher,
                             moe_layer_host_issued, moe_load_imbalance, permutation_passes)
from cost_models.opgraph import (DECODER_KINDS, LayerGraph, LayerKind, Op, gemm_precision, mean_keys_per_query,
                                 tp_divisor)
from cost_models.recompute import ep_forward_repeats, modules_in_effect
from cost_models.specs import (ATTENTION_REF_KEYS, ClusterSpec, Efficiency, JobSpec, ModelSpec,
                               ParallelConfig)
from cost_models.targets.common import Runtime
from cost_models.te_fp8 import TE_RECIPES, te_gathered_cast_bytes
from cost_models.te_userbuffers import UbMethod, ub_exposed_s

ATTN_BWD_FACTOR = 2.5
_COLUMN_KINDS = {"q", "kv", "ffn", "expert_ffn", "vocab", "ssm"}  # split by TP (heads / columns)


@dataclass(frozen=True)
class LayerCost:
    """Seconds per micro-batch on one rank; ``*_bytes`` are bytes each rank sends."""

    forward_s: float
    backward_s: float
    recompute_s: float
    attention_s: float  # the attention core, fwd + bwd (what CP's ring can hide behind)
    tp_s: float
    ep_s: float
    cp_s: float
    tp_bytes: float
    ep_bytes: float
    cp_bytes: float
    cp_window: float = 1.0  # share of the attention core CP traffic can hide behind (knob_effects.cp_comm)
    cp_unhidden_s: float = 0.0  # part of cp_s nothing hides (a2a+p2p's all-to-alls; knob_effects.cp_comm)
    host_s: float = 0.0  # host-bound wait beyond the device's work (host_bound_s)
    # where the dispatcher syncs the host each layer (host_wait_s): the share of the device work in the forward, and
    # the forward device work left to run beside the host's issue of the experts once the sync has released it
    forward_share: float = 0.5
    sync_window_s: float = 0.0

    @property
    def cp_exposed_s(self) -> float:
        """Ring attention overlaps each K/V block transfer with the previous block's compute (an all-gather only
        with the local block; Ulysses' all-to-alls with nothing; a2a+p2p: its ring as a ring, its all-to-alls
        with nothing)."""
        return self.cp_unhidden_s + ring_exposed_s(self.cp_s - self.cp_unhidden_s, self.attention_s * self.cp_window)

    @property
    def total_s(self) -> float:
        return (self.forward_s + self.backward_s + self.recompute_s + self.tp_s + self.ep_s + self.cp_exposed_s
                + self.host_s)


def _matmul_split(op: Op, graph: LayerGraph, t: int) -> tuple[int, int]:
    out_kind = graph.tensors[op.output].dim_kind
    in_kind = graph.tensors[op.inputs[0]].dim_kind
    k, n = op.weight_in, op.weight_out
    if out_kind in _COLUMN_KINDS:
        return k, -(-n // t)
    if in_kind in _COLUMN_KINDS:
        return -(-k // t), n
    return k, n


# Bytes each memory-bound kernel moves per element (bf16 = 2 bytes; read + write), forward / backward.
RESIDUAL_BYTES = (6.0, 6.0)  # y = x + f(x): read 2, write 1; backward accumulates the branch gradient the same way
ROTARY_BYTES = (4.0, 4.0)  # read + write q and k; backward applies the inverse rotation
NORM_BYTES = (4.0, 6.0)  # read x, write y; backward reads x and dy, writes dx (Table 2's norms)
PERMUTE_BYTES = (4.0, 4.0)  # MoE dispatch/combine: gather/scatter of each routed token copy
# Megatron's vocab-parallel cross-entropy runs op by op in fp32 (megatron/core/tensor_parallel/cross_entropy.py):
# cast (read 2, write 4), max, subtract, exp, sum, divide (≈ 28 more), backward softmax − one-hot and the bf16
# gradient (≈ 14): bytes per vocabulary entry per token.
LOSS_BYTES = (34.0, 14.0)
# Transformer Engine's fused cross-entropy (``Runtime.cross_entropy_fusion == "te"``; TE v2.9
# pytorch/triton/cross_entropy.py): one kernel reads the bf16 logits twice (online max / sum, then the softmax) and
# writes the gradient over them (2 + 2 + 2); the backward scales that gradient in place (read 2, write 2).
TE_LOSS_BYTES = (6.0, 4.0)
# Vocab-parallel cross-entropy all-reduces three fp32 numbers per token across TP: the max logit, the sum of
# exponentials and the target logit (megatron/core/tensor_parallel/cross_entropy.py).
LOSS_PARALLEL_BYTES_PER_TOKEN = 3 * 4.0
# Unfused attention (Megatron-LM ≤ 2022 GPT: fused scale-mask-softmax, then attention dropout) per score element:
# forward softmax read 2 + write 2, dropout read 2 + write 2 + mask 1; backward dropout (read 2 + 1, write 2) and
# softmax (read probs 2, grad 2, write 2).
SCORE_BYTES = (9.0, 11.0)
# Eager PyTorch (no torch.compile), per element, forward / backward: what each ATen kernel of the op's eager
# autograd reads and writes (counted with a TorchDispatchMode over the ops: benchmarks/eager_traffic.py;
# tests/test_knob_physics.py recounts them). torchtitan's code as the published 2024-12 runs ran it (commit 9dec370):
# - RMSNorm (torchtitan/models/norms.py ``RMSNorm``: ``x.float()``, ``pow(2).mean(-1)``, ``rsqrt``, ``mul``,
#   ``type_as``, ``* weight``): 36 forward; its autograd 92 (fp32 mul/sum/div/pow/add backward kernels).
EAGER_NORM_BYTES = (36.0, 92.0)
# - rotary (models/llama/model.py ``apply_rotary_emb``, = 0.3.0 ``ComplexRoPE.apply_rotary_emb``): ``float()``
#   (2 + 4), complex multiply (4 + 4), ``type_as`` (4 + 2); the backward the same three in reverse.
EAGER_ROTARY_BYTES = (20.0, 20.0)
# - SwiGLU ``F.silu(w1(x)) * w3(x)``: silu writes its output (2 + 2) and the mul reads it back (2 + 2 + 2): 4 bytes
#   per FFN element more than one fused kernel forward; backward two muls and silu_backward (6 + 6 + 6) against
#   the fused 10: 8 more. Residual adds are one kernel either way (RESIDUAL_BYTES).
EAGER_GATED_ACT_EXTRA = (4.0, 8.0)
# Megatron-Core 0.16.1's grouped experts (TEGroupedMLP, megatron/core/transformer/moe/experts.py) run two eager pieces
# around a clamped, bias-carrying expert MLP (GPT-OSS: ``activation_func_clamp_value``, ``add_bias_linear``), where the
# runtime says so (``Runtime.mcore_expert_glue``); bytes counted by benchmarks/eager_traffic.py over the installed code
# (tests/test_gpt_oss_glue.py recounts them):
# - the clamp: under ``bias_activation_fusion`` (Bridge's GPT-OSS provider) ``weighted_bias_quick_geglu_impl``
#   (fusions/fused_bias_geglu.py:410-433) chunks the fc1 output, clamps both halves and concatenates them in eager
#   PyTorch before its fused quick-GeGLU, whose autograd saves the clamped copy (next to the fc1 output the clamps
#   keep: memory.op_activation_bytes, unless ``moe_act`` recomputes it); backward: the clamps' masks and ``where``,
#   and the concatenation of the two halves' gradients. Per fc1-output element (2 x moe_ffn wide):
MCORE_EXPERT_CLAMP_BYTES = (8.0, 13.5)
# - fc2's bias: fc2 is built with ``skip_bias_add=True`` (experts.py:560-576), so Transformer Engine returns the
#   per-expert biases and ``TEGroupedMLP._apply_bias`` (experts.py:609-626) adds ``bias * prob`` expert by expert
#   (split, multiply, add, concatenate: experts.py:758) and autograd reduces the bias and prob gradients; fc1's bias
#   rides the GEMM epilogue (``skip_bias_add=False``, TE GroupedLinear: cuBLAS bias epilogue, its gradient fused with
#   the wgrad GEMM or the MXFP8 quantize, grouped_linear.py:296-333 @ v2.9), not priced. Per fc2-output element
#   (hidden wide), by the dtype of the routing probs: bf16 from the alltoall dispatcher (the router's dtype), fp32
#   from DeepEP / HybridEP, which upcast them (token_dispatcher.py:1028-1034, 1173-1179).
MCORE_EXPERT_BIAS_BYTES = {"bf16": (12.0, 16.0), "fp32": (28.0, 40.0)}
# - the loss ``cross_entropy(pred.flatten(0, 1).float(), labels)`` (torchtitan train.py; not compiled in the 2024-12
#   runs, e8977b0 "turning off compile on loss function"): ``float()`` (2 + 4), ``_log_softmax`` (4 + 4), nll
#   gather; backward nll zero-fill (4), ``_log_softmax_backward_data`` (4 + 4 + 4), to bf16 (4 + 2), per logit.
TORCH_LOSS_BYTES = (14.0, 22.0)
# fp8 (Transformer Engine): each GEMM input and output gradient is cast by the recipe's quantizer; what it costs, and
# what the norm of a LayerNormLinear fuses, per recipe and GPU: te_fp8.te_cast_bytes.


@dataclass(frozen=True)
class OpCompute:
    """Seconds per micro-batch on one rank."""

    gemm_f: float  # GEMMs, forward (backward = 2×)
    attn_f: float  # attention core, forward
    attn_b: float  # attention core, backward
    mem_f: float  # memory-bound kernels, forward
    mem_b: float  # memory-bound kernels, backward
    wgrad_hp: float = 0.0  # extra backward time of weight-gradient GEMMs kept in bf16 (fp8 rowwise_with_gw_hp)
    op_sac_f: float | None = None  # forward work torchtitan's per-op SAC re-runs in the backward (None: not op-SAC)
    gemm_fwd_extra: float = 0.0  # forward GEMMs slower than the model's fp8 GEMM (torchao rowwise: CUTLASS kernel)
    # per op of the graph: the forward time a selective-recompute module re-running it adds (``cost_models.recompute``;
    # the attention core: its kernel, ``attn_f``, as plain ``selective`` has always priced it)
    op_rerun_f: tuple[float, ...] = ()

    @property
    def forward_s(self) -> float:
        return self.gemm_f + self.gemm_fwd_extra + self.attn_f + self.mem_f

    @property
    def backward_s(self) -> float:
        """GEMMs 2× forward (dgrad + wgrad); the attention core and memory-bound kernels as priced."""
        return 2 * self.gemm_f + self.attn_b + self.mem_b + self.wgrad_hp

    def recompute_s(self, recompute: str, graph: LayerGraph | None = None,
                    modules: frozenset[str] | None = None) -> float:
        """Selective recompute repeats the attention core's forward (Megatron), or under torchtitan's per-op SAC
        what it did not save (``op_sac_f``), or with Megatron's ``modules`` (``cost_models.recompute``) the forward
        of every op they re-run; full recompute the whole forward."""
        if recompute == "selective" and self.op_sac_f is not None:
            return self.op_sac_f
        if recompute == "selective" and modules is not None and graph is not None and self.op_rerun_f:
            from cost_models.recompute import reruns

            return sum(f for op, f in zip(graph.ops, self.op_rerun_f) if reruns(op, graph, modules))
        return {"none": 0.0, "selective": self.attn_f, "full": self.forward_s}[recompute]


def _local_widths(op: Op, graph: LayerGraph, t: int) -> tuple[int, int]:
    return _matmul_split(op, graph, t) if op.kind == "matmul" else (op.weight_in, op.weight_out)


def memory_traffic_bytes(graph: LayerGraph, model: ModelSpec | None, job: JobSpec,
                         par: ParallelConfig, rt: Runtime | None = None,
                         eager: bool = False, non_tn_gemm: bool = False) -> tuple[float, float]:
    """HBM bytes of the layer's memory-bound kernels (forward, backward) for one micro-batch on one rank:
    the sum of ``op_traffic_bytes`` over its ops."""
    fwd = bwd = 0.0
    for op in graph.ops:
        f, b = op_traffic_bytes(op, graph, model, job, par, rt, eager, non_tn_gemm)
        fwd, bwd = fwd + f, bwd + b
    return fwd, bwd


def op_traffic_bytes(op: Op, graph: LayerGraph, model: ModelSpec | None, job: JobSpec,
                     par: ParallelConfig, rt: Runtime | None = None,
                     eager: bool = False, non_tn_gemm: bool = False, permute_passes: int = 1) -> tuple[float, float]:
    """HBM bytes (forward, backward) of one op's memory-bound kernels for one micro-batch on one rank. ``eager``:
    norms, rotary and the gated activation run op by op (``EAGER_*``); the loss is torch's op-by-op cross-entropy
    (``TORCH_LOSS_BYTES``) when the runtime's loss is not fused (``Runtime.fused_loss``). ``non_tn_gemm``: the GPU's
    fp8 GEMM takes any layout (``knob_effects.non_tn_fp8_gemm``: no fp8 transposes). ``permute_passes``: the
    dispatcher's passes over the routed copies per dispatch / combine (``moe.permutation_passes``).

    Hidden-width tensors are split across TP only with sequence parallelism (otherwise every TP rank repeats
    the norms and residual adds); head/FFN/vocab-width tensors are split by TP. ``par`` is how *this op* is
    sharded (the search prices per-op shardings with it; a uniform layer passes the layer's config)."""
    t = par.tp
    sp = par.sequence_parallel and t > 1
    tokens = par.micro_batch_size * job.seq_len / par.cp

    def per_rank(tensor: str) -> float:
        ten = graph.tensors[tensor]
        if ten.dim_kind in _COLUMN_KINDS:
            return ten.width / tp_divisor(t, ten.heads)
        return ten.width / (t if sp else 1)

    fwd = bwd = 0.0
    tf = op.tokens_factor
    if op.kind == "norm":
        w = per_rank(op.inputs[0])
        nb = EAGER_NORM_BYTES if eager else NORM_BYTES
        fwd, bwd = nb[0] * w, nb[1] * w
    elif op.kind == "elementwise" and op.name == "rotary":
        if model is not None and (model.learned_position_embeddings or model.arch.no_position_encoding):
            return 0.0, 0.0  # absolute positions are added once at the embedding, or none at all: no rotary kernel
        w = sum(per_rank(x) for x in op.inputs)
        rb = EAGER_ROTARY_BYTES if eager else ROTARY_BYTES
        fwd, bwd = rb[0] * w, rb[1] * w
    elif op.kind == "elementwise" and len(op.inputs) == 2 and graph.tensors[op.output].dim_kind == "hidden":
        w = per_rank(op.output)  # residual / shared-expert add
        fwd, bwd = RESIDUAL_BYTES[0] * w, RESIDUAL_BYTES[1] * w
    elif op.kind == "elementwise":  # activation: read inputs, write output; backward reads inputs + dy
        ins = sum(per_rank(x) for x in op.inputs)
        out = per_rank(op.output)
        if op.name.startswith("expert_"):  # expert TP = 1: tokens (not features) split over TP
            ins, out = ins * t / (t if sp else 1), out * t / (t if sp else 1)
        fwd = 2.0 * (ins + out) * tf
        bwd = 2.0 * (2 * ins + out) * tf
        if eager and len(op.inputs) == 2:  # silu(gate) * up: the silu output goes through HBM
            fwd, bwd = fwd + EAGER_GATED_ACT_EXTRA[0] * out * tf, bwd + EAGER_GATED_ACT_EXTRA[1] * out * tf
        if op.name.startswith("expert_") and op.clamped and _mcore_glue(rt, model):
            fwd, bwd = fwd + MCORE_EXPERT_CLAMP_BYTES[0] * ins * tf, bwd + MCORE_EXPERT_CLAMP_BYTES[1] * ins * tf
    elif op.kind == "ssm" and model is not None and model.mamba is not None:
        fwd, bwd = ssd_traffic_bytes(model.mamba, t, par.cp)
        cf, cb = layout_copy_bytes(model.mamba, t, par.cp, par.micro_batch_size)
        fwd, bwd = fwd + cf, bwd + cb
    elif op.kind in ("dispatch", "combine") and model is not None:
        w = model.expert_input_size / (t if sp else 1) * model.moe_top_k * permute_passes
        fwd, bwd = PERMUTE_BYTES[0] * w, PERMUTE_BYTES[1] * w
    elif op.kind == "loss":
        w = per_rank(op.inputs[0])
        if rt is not None and not rt.fused_loss:  # torch's cross_entropy on fp32 logits, op by op
            fwd, bwd = TORCH_LOSS_BYTES[0] * w, TORCH_LOSS_BYTES[1] * w
        elif rt is not None and rt.cross_entropy_fusion == "te":
            fwd, bwd = TE_LOSS_BYTES[0] * w, TE_LOSS_BYTES[1] * w
        else:
            fwd, bwd = LOSS_BYTES[0] / 2 * w, LOSS_BYTES[1] / 2 * w  # per element, not per byte
    if op.kind == "experts" and graph.tensors[op.output].dim_kind == "hidden" and _mcore_glue(rt, model) \
            and model.linear_bias:  # fc2's bias added per expert outside the GEMM (MCORE_EXPERT_BIAS_BYTES)
        probs = "fp32" if rt.moe_dispatcher in ("deepep", "hybridep") else "bf16"
        w = per_rank(op.output) * tf
        fwd, bwd = fwd + MCORE_EXPERT_BIAS_BYTES[probs][0] * w, bwd + MCORE_EXPERT_BIAS_BYTES[probs][1] * w
    if gemm_precision(op, job.precision) in ("fp8", "nvfp4") and op.kind in ("matmul", "experts"):
        k, n = _local_widths(op, graph, t)
        scale = tf / (t if sp else 1) if op.kind == "experts" else 1.0  # routed copies on this rank
        prod = next((o for o in graph.ops if o.output == op.inputs[0]), None)
        ao = torchao_casts(rt, job) if op.kind == "matmul" else None
        if ao is not None:  # torchao Float8Linear: every linear casts its input (siblings' casts of one tensor
            # are one kernel under torch.compile), its output gradient, and its weight each micro-batch; a column
            # input / row output gradient that a bf16 SP all-gather produced is cast unfused
            act, w_fwd, w_bwd = ao
            unfused = TORCHAO_ACT_CAST_BYTES[rt.fp8_recipe][0]
            first = next(o for o in graph.ops if o.kind == "matmul" and o.inputs[0] == op.inputs[0]) is op
            gathered_in = graph.tensors[op.output].dim_kind in _COLUMN_KINDS and torchao_cast_after_gather(rt, job, sp)
            gathered_dy = graph.tensors[op.inputs[0]].dim_kind in _COLUMN_KINDS \
                and torchao_cast_after_gather(rt, job, sp, backward=True)
            fwd += (unfused if gathered_in else act) * k * (1.0 if first or not rt.compile else 0.0) \
                + w_fwd * k * n / tokens
            bwd += (unfused if gathered_dy else act) * n + w_bwd * k * n / tokens
        else:  # Transformer Engine: one module per input (fused q/k/v, gate/up) casts it once; LayerNormLinear's
            # norm takes part in the cast as the recipe allows (te_fp8.te_cast_bytes)
            cast = fp8_cast_bytes(rt, non_tn_gemm)
            recipe = rt.fp8_recipe if rt is not None and rt.fp8_recipe in TE_RECIPES else None
            first = next(o for o in graph.ops if o.kind == op.kind and o.inputs[0] == op.inputs[0]) is op
            norm_fed = prod is not None and prod.kind == "norm"
            column = op.kind == "matmul" and graph.tensors[op.output].dim_kind in _COLUMN_KINDS
            row = op.kind == "matmul" and graph.tensors[op.inputs[0]].dim_kind in _COLUMN_KINDS
            if first:  # SP: a column-parallel input is cast on the local shard, then gathered
                fwd += (te_gathered_cast_bytes(recipe, non_tn_gemm, t, norm_fed) if sp and column
                        else cast.norm_input if norm_fed else cast.input) * k * scale
            # SP: a row-parallel output gradient is cast on the local shard, then gathered
            bwd += (te_gathered_cast_bytes(recipe, non_tn_gemm, t) if sp and row else cast.grad_output) * n * scale
        if op.kind == "matmul":  # torchao rowwise: the slow-accum backward GEMMs' separate rescale pass
            dgrad_rescale, wgrad_rescale = fp8_rescale_bytes(rt, job)
            bwd += dgrad_rescale * k + wgrad_rescale * k * n / tokens
    return fwd * tokens, bwd * tokens


def _mcore_glue(rt: Runtime | None, model: ModelSpec | None) -> bool:
    """Whether Megatron-Core's eager expert glue (``MCORE_EXPERT_*``) runs: the runtime says so and the model has
    routed experts."""
    return rt is not None and rt.mcore_expert_glue and model is not None and model.num_experts > 0


def _unfused_attention(op: Op, model: ModelSpec, cluster: ClusterSpec, job: JobSpec,
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


def op_compute(op: Op, graph: LayerGraph, model: ModelSpec, cluster: ClusterSpec, job: JobSpec,
               par: ParallelConfig, rt: Runtime | None = None) -> OpCompute:
    """Compute time of one op for one micro-batch on one rank, sharded as ``par`` says (the uniform layer
    passes its config; the intra-op search passes each op's own sharding)."""
    t = par.tp
    eff = cluster.efficiency
    tokens = par.micro_batch_size * job.seq_len / par.cp
    gemm = attn_f = attn_b = wgrad_hp = fwd_extra = 0.0
    if op.kind in ("matmul", "router"):
        k, n = _local_widths(op, graph, 1 if op.name in ("k_proj", "v_proj") and kv_replicated(graph, par) else t)
        rows = tokens
        if op.name.endswith("_latent_proj") and par.sequence_parallel and t > 1:
            rows = tokens / t  # replicated weights on the sequence-parallel shard (moe_layer.py:265-270, 343-345)
        gemm = matmul_time_s(rows, k, n, cluster, gemm_precision(op, job.precision))
        if op.kind == "matmul" and op.quantized:
            gemm *= fp8_gemm_time_ratio(rt, job)  # block-scaled MXFP8 kernel vs per-tensor fp8
        if op.kind == "matmul" and op.quantized and wgrad_in_bf16(rt, job):
            wgrad_hp = matmul_time_s(tokens, k, n, cluster, "bf16") - gemm
        if op.kind == "matmul" and op.quantized:
            fwd_extra = gemm * (1.0 / fp8_forward_gemm_efficiency(rt, job) - 1.0)
    elif op.kind == "experts":
        local_experts = model.num_experts // par.ep
        routed = tokens / (t if par.sequence_parallel else 1) * op.tokens_factor * par.ep
        per_expert = routed / model.num_experts * moe_load_imbalance(model, job, par, cluster, rt)
        gemm = local_experts * matmul_time_s(per_expert, op.weight_in, op.weight_out, cluster, job.precision) \
            * fp8_gemm_time_ratio(rt, job)
    elif op.kind == "attention":
        if eff.flash_attention:
            steps = ring_steps(par, rt)
            slow = attention_kernel_factor(model, job, par, cluster, steps, graph.kind)
            attn_f = attention_time_s(op.flops_per_token * tokens / t, cluster) * slow
            attn_b = ATTN_BWD_FACTOR * attn_f
        else:
            attn_f, attn_b = _unfused_attention(op, model, cluster, job, par)
    passes = permutation_passes(cluster, model.num_experts // par.ep, rt) \
        if op.kind in ("dispatch", "combine") else 1
    mem_f, mem_b = op_traffic_bytes(op, graph, model, job, par, rt, eager_elementwise(eff, rt),
                                    non_tn_fp8_gemm(cluster), passes)
    if op.kind == "attention" and par.cp > 1 and ring_steps(par, rt) > 1:
        merge_f, merge_b = cp_merge_bytes(op, graph, job, par, ring_steps(par, rt))
        mem_f, mem_b = mem_f + merge_f, mem_b + merge_b
    extra = gemm * eff.memory_bound_fraction
    return OpCompute(gemm, attn_f, attn_b, hbm_time_s(mem_f, cluster) + extra, hbm_time_s(mem_b, cluster) + extra,
                     wgrad_hp, gemm_fwd_extra=fwd_extra)


def _compute(graph: LayerGraph, model: ModelSpec, cluster: ClusterSpec, job: JobSpec, par: ParallelConfig,
             rt: Runtime | None = None) -> OpCompute:
    """Compute time of one layer for one micro-batch on one rank: the sum of ``op_compute`` over its ops."""
    parts = [op_compute(op, graph, model, cluster, job, par, rt) for op in graph.ops]
    total = OpCompute(*(sum(getattr(p, f) for p in parts)
                        for f in ("gemm_f", "attn_f", "attn_b", "mem_f", "mem_b", "wgrad_hp")),
                      gemm_fwd_extra=sum(p.gemm_fwd_extra for p in parts),
                      op_rerun_f=tuple(p.attn_f if op.kind == "attention" else p.forward_s
                                       for op, p in zip(graph.ops, parts)))
    if rt is None or rt.selective != "op_sac" or graph.kind not in DECODER_KINDS:
        return total
    # torchtitan's per-op SAC (parallelize_llama.py ``_save_list``, ``_custom_policy``: every other mm and the SDPA
    # output are saved, every other op is recomputed): the backward re-runs every memory-bound forward kernel (norms,
    # rotary, activation, residual adds, casts: eager or fused as the runtime runs them) and every other GEMM's
    # forward; the attention core is not re-run.
    from cost_models.memory import op_sac_saved  # memory imports this module's callers

    kept = op_sac_saved(graph)
    redo = sum(p.mem_f + (p.gemm_f + p.gemm_fwd_extra if op.kind in ("matmul", "experts", "router")
                          and (op.name, op.output) not in kept else 0.0) for op, p in zip(graph.ops, parts))
    return replace(total, op_sac_f=redo)


def tp_exposed_fraction(t: int, eff: Efficiency, rt: Runtime | None = None) -> float:
    """Share of TP traffic left on the critical path where no per-collective model prices it
    (``knob_effects.tp_overlap_mode`` ``share``: torchtitan's async TP; the intra-op search's per-op pricing, which
    sees no runtime): ``tp_overlap`` of it hides behind the GEMMs it feeds, pipelined over t chunks (one per peer):
    the reduce-scatter of the last chunk has nothing left to hide behind, so at least 1/(2t) stays exposed.
    ``exposed``: all of it. Megatron's userbuffers: ``_userbuffers_boundary``."""
    if t <= 1:
        return 0.0
    if tp_overlap_mode(eff, rt, t, per_collective=False) == "exposed":
        return 1.0
    return max(1.0 - eff.tp_overlap, 1.0 / (2 * t))


TpRole = Literal["column", "row"]


def tp_boundaries(graph: LayerGraph) -> list[tuple[str, TpRole]]:
    """Where Megatron's f/g operators sit: the input of each column-parallel linear (siblings reading one
    tensor share it: ``linear_qkv``, ``linear_fc1``) and the output of each row-parallel one (§4)."""
    out: list[tuple[str, TpRole]] = []
    for op in graph.ops:
        if op.kind != "matmul":
            continue
        if graph.tensors[op.output].dim_kind in _COLUMN_KINDS:
            entry: tuple[str, TpRole] = (op.inputs[0], "column")
        elif graph.tensors[op.inputs[0]].dim_kind in _COLUMN_KINDS:
            entry = (op.output, "row")
        else:
            continue  # hidden → hidden (MLA down-projections): replicated weights, no collective
        if entry not in out:
            out.append(entry)
    return out


def tp_collectives(role: TpRole, sequence_parallel: bool,
                   recompute: str) -> tuple[tuple[CollectiveKind, Literal["fwd", "bwd"], float], ...]:
    """(collective, pass, calls per micro-batch) of one TP boundary on its full ``[tokens, width]`` bf16 tensor
    (Shoeybi et al. 2019 §3: column ``f`` = identity forward / all-reduce backward, row ``g`` = all-reduce
    forward; with SP, Korthikanti et al. 2022 §4.2.2: all-gather ↔ reduce-scatter). Full recompute repeats
    the forward's."""
    fwd = 2.0 if recompute == "full" else 1.0
    if role == "column":
        if sequence_parallel:
            return ("all_gather", "fwd", fwd), ("reduce_scatter", "bwd", 1.0)
        return (("all_reduce", "bwd", 1.0),)
    if sequence_parallel:
        return ("reduce_scatter", "fwd", fwd), ("all_gather", "bwd", 1.0)
    return (("all_reduce", "fwd", fwd),)


def _userbuffers_boundary(role: TpRole, elems: float, gemm_s: float, gather: float, grad_gather: float, t: int,
                          stride: int, cluster: ClusterSpec, fwd_calls: int) -> tuple[float, float]:
    """(exposed seconds, bytes each rank sends) of one TP boundary under TE userbuffers (``te_userbuffers``), its
    GEMM's forward time ``gemm_s`` (dgrad and wgrad take as long). Column: all-gather of the input (ring exchange
    under the forward GEMM), and in the backward the input's all-gather for the weight gradient (bulk, under dgrad)
    and the input gradient's reduce-scatter (bulk, under wgrad). Row: the output's reduce-scatter (pipelined over
    the forward GEMM), the output gradient's all-gather (ring exchange under dgrad)."""
    if role == "column":
        plan: tuple[tuple[CollectiveKind, float, UbMethod, int], ...] = (
            ("all_gather", gather, "ring_exchange", fwd_calls), ("all_gather", gather, "bulk", 1),
            ("reduce_scatter", 2.0, "bulk", 1))
    else:
        plan = (("reduce_scatter", 2.0, "pipeline", fwd_calls), ("all_gather", grad_gather, "ring_exchange", 1))
    seconds = nbytes = 0.0
    for kind, width_bytes, method, calls in plan:
        payload = width_bytes * elems
        comm = group_collective_time_s(kind, payload, t, stride, cluster)
        seconds += calls * ub_exposed_s(method, comm, gemm_s, t)
        nbytes += calls * bytes_sent_per_rank(kind, payload, t)
    return seconds, nbytes


def tp_boundary_costs(graph: LayerGraph, cluster: ClusterSpec, job: JobSpec, par: ParallelConfig, stride: int,
                      sequence_parallel: bool, rt: Runtime | None = None,
                      model: ModelSpec | None = None) -> list[tuple[float, float]]:
    """(exposed seconds, bytes each rank sends) of every TP boundary of the layer for one micro-batch, with or
    without sequence parallelism: ``tp_collectives`` on the full ``[tokens, width]`` bf16 tensor (all-gathers at
    ``rt.tp_gather_bytes``, the backward's output-gradient ones at ``rt.tp_grad_gather_bytes``: fp8 under
    torchtitan's Float8 tensorwise TP and TE's fp8 linears), × the share TP-comm overlap leaves exposed
    (``tp_exposed_fraction``); under Megatron's userbuffers (``model`` given) each collective against its own GEMM."""
    t = par.tp
    fraction = tp_exposed_fraction(t, cluster.efficiency, rt)
    tokens = par.micro_batch_size * job.seq_len / par.cp
    out = []
    gather = rt.tp_gather_bytes if rt is not None else 2.0  # fp8 all-gathers: torchtitan's Float8 TP, TE's fp8
    grad_gather = gather if rt is None or rt.tp_grad_gather_bytes is None else rt.tp_grad_gather_bytes
    # Megatron --tp-comm-overlap: each collective against its own GEMM (te_userbuffers; the GEMMs need the model)
    userbuffers = tp_overlap_mode(cluster.efficiency, rt, t, sequence_parallel,
                                  per_collective=model is not None) == "userbuffers"
    for tensor, role in tp_boundaries(graph):
        elems = tokens * graph.tensors[tensor].width
        if userbuffers:
            ops = [op for op in graph.ops if op.kind == "matmul"
                   and (op.inputs[0] == tensor if role == "column" else op.output == tensor)]
            gemm = sum(p.gemm_f + p.gemm_fwd_extra for p in (op_compute(op, graph, model, cluster, job, par, rt)
                                                            for op in ops))
            out.append(_userbuffers_boundary(role, elems, gemm, gather, grad_gather, t, stride, cluster,
                                             2 if par.recompute == "full" else 1))
            continue
        seconds = nbytes = 0.0
        for kind, _, calls in tp_collectives(role, sequence_parallel, par.recompute):
            ag = grad_gather if role == "row" else gather  # a row boundary all-gathers in the backward
            payload = (ag if kind == "all_gather" else 2.0) * elems
            # async TP cannot fuse an all-gather whose consumer is torchao's cast (knob_effects)
            whole = kind == "all_gather" and torchao_cast_after_gather(rt, job, sequence_parallel, role == "row")
            seconds += calls * group_collective_time_s(kind, payload, t, stride, cluster) * (1.0 if whole else fraction)
            nbytes += calls * bytes_sent_per_rank(kind, payload, t)
        out.append((seconds, nbytes))
    return out


def kv_gather_width(graph: LayerGraph, t: int) -> int:
    """Width of the QKV output Megatron gathers across TP when ``t`` exceeds the KV heads (GQA), else 0.

    Megatron-Core 0.16.1 splits ``linear_qkv`` evenly over ``t`` ranks even when a rank's share is less than one KV
    group; it then all-gathers the whole ``[s, b, (a + 2g)·d]`` output over TP and keeps its own group's slice
    (``megatron/core/transformer/attention.py:1398-1416``, ``get_query_key_value_tensors``), whose backward is a
    reduce-scatter (``megatron/core/tensor_parallel/mappings.py:380-397``, ``_AllGatherFromTensorParallelRegion``).
    The weights stay sharded ``t`` ways; each rank then holds one K/V head (attention.py:289-300)."""
    k = graph.tensors.get("k")
    if k is None or not k.heads or t <= k.heads:
        return 0
    return graph.tensors["q"].width + k.width + graph.tensors["v"].width


def kv_gather_collectives(recompute: str) -> tuple[tuple[CollectiveKind, Literal["fwd", "bwd"], float], ...]:
    """(collective, pass, calls per micro-batch) of Megatron's QKV gather (``kv_gather_width``): all-gather forward
    (again under full recompute), reduce-scatter backward."""
    return ("all_gather", "fwd", 2.0 if recompute == "full" else 1.0), ("reduce_scatter", "bwd", 1.0)


def kv_replicated(graph: LayerGraph, par: ParallelConfig) -> bool:
    """K/V projections whole on every TP rank: t > num_kv_heads with ``kv_replication='replicate'`` (a DTensor
    ``Replicate`` module; each rank keeps the KV heads of its query heads). Their GEMMs run unsplit, their saved
    input is the one Q shares, and the weight gradient of each rank covers only its query heads: it is
    all-reduced over TP in backward (``kv_replica_grad_collectives``)."""
    return bool(kv_gather_width(graph, par.tp)) and par.kv_replication == "replicate"


def kv_replica_grad_collectives(graph: LayerGraph) -> tuple[CollectiveKind, Literal["fwd", "bwd"], float, float]:
    """(collective, pass, calls per micro-batch, bf16 payload bytes) of the replicated K/V weights' gradient
    reduction: DTensor turns the Partial gradient of a Replicate parameter into Replicate with one all-reduce."""
    params = sum(op.params for op in graph.ops if op.name in ("k_proj", "v_proj"))
    return "all_reduce", "bwd", 1.0, 2.0 * params


def kv_gather_cost(graph: LayerGraph, cluster: ClusterSpec, job: JobSpec, par: ParallelConfig,
                   stride: int) -> tuple[float, float]:
    """(exposed seconds, bytes each rank sends) for one micro-batch of Megatron's QKV gather (0 when t ≤ g), or
    with ``kv_replication='replicate'`` of the replicated K/V weights' gradient all-reduce. Both are plain
    collectives on the compute stream (``_gather_along_last_dim``, a DTensor redistribute), not the linear layers'
    userbuffer-overlapped ones: fully exposed (no ``tp_exposed_fraction``)."""
    width = kv_gather_width(graph, par.tp)
    if not width:
        return 0.0, 0.0
    if par.kv_replication == "replicate":
        kind, _, calls, payload = kv_replica_grad_collectives(graph)
        return (calls * group_collective_time_s(kind, payload, par.tp, stride, cluster),
                calls * bytes_sent_per_rank(kind, payload, par.tp))
    payload = 2.0 * par.micro_batch_size * job.seq_len / par.cp * width
    seconds = nbytes = 0.0
    for kind, _, calls in kv_gather_collectives(par.recompute):
        seconds += calls * group_collective_time_s(kind, payload, par.tp, stride, cluster)
        nbytes += calls * bytes_sent_per_rank(kind, payload, par.tp)
    return seconds, nbytes


def layer_compute(graph: LayerGraph, model: ModelSpec, cluster: ClusterSpec, job: JobSpec, par: ParallelConfig,
                  rt: Runtime | None = None) -> OpCompute:
    """``layer_cost``'s compute part (the sum of ``op_compute``). It reads neither ``par.recompute`` nor
    ``par.schedule``: callers pricing one layer under several recompute settings compute it once and pass it."""
    return _compute(graph, model, cluster, job, par, rt)


def layer_compute_key(par: ParallelConfig, rt: Runtime | None) -> tuple:
    """All ``layer_compute`` reads of ``par`` and ``rt`` (``op_compute``, ``op_traffic_bytes``, the ``knob_effects``
    helpers they call, the op-SAC branch): for one graph, model, cluster and job, equal keys give equal answers
    (callers cache on it; keep it in step with those functions)."""
    knobs = None if rt is None else (rt.compile, rt.fp8_recipe, rt.fp8_impl, rt.fused_elementwise, rt.fused_loss,
                                     rt.selective, ring_steps(par, rt), rt.moe_force_balance, rt.moe_capacity_factor,
                                     rt.mcore_expert_glue, rt.moe_dispatcher, rt.target)
    return par.tp, par.cp, par.ep, par.micro_batch_size, par.sequence_parallel, par.kv_replication, knobs


def layer_cost(graph: LayerGraph, model: ModelSpec, cluster: ClusterSpec, job: JobSpec,
               par: ParallelConfig, dp: int, rt: Runtime | None = None, compute: OpCompute | None = None) -> LayerCost:
    """Cost of one layer of ``graph.kind`` for one micro-batch on one rank, as runtime ``rt`` runs it (its knobs:
    ``knob_effects``; None: the efficiency's own settings, as the intra-op ILP prices ops). ``compute``:
    ``layer_compute`` of the same arguments, when the caller has it."""
    t, c, e = par.tp, par.cp, par.ep
    strides = RankStrides.megatron(t, c, dp)
    cc = compute if compute is not None else _compute(graph, model, cluster, job, par, rt)
    modules = modules_in_effect(par, rt)
    forward, backward, recompute = cc.forward_s, cc.backward_s, cc.recompute_s(par.recompute, graph, modules)
    tokens = par.micro_batch_size * job.seq_len / c
    tp_s = tp_bytes = ep_s = ep_bytes = cp_s = cp_bytes = 0.0
    is_block = graph.kind in DECODER_KINDS
    if t > 1 and is_block:
        for seconds, nbytes in tp_boundary_costs(graph, cluster, job, par, strides.tp, par.sequence_parallel, rt,
                                                 model):
            tp_s, tp_bytes = tp_s + seconds, tp_bytes + nbytes
        seconds, nbytes = kv_gather_cost(graph, cluster, job, par, strides.tp)
        tp_s, tp_bytes = tp_s + seconds, tp_bytes + nbytes
    if graph.kind == "moe" and e > 1:
        local_tokens = tokens / (t if par.sequence_parallel else 1)
        dispatcher = moe_dispatcher(cluster, rt)
        parts = moe_all_to_all_parts(model, cluster, job, local_tokens, e, strides.ep,
                                     rho=moe_load_imbalance(model, job, par, cluster, rt), dispatcher=dispatcher)
        ep_s, ep_bytes = sum(p[0] for p in parts), sum(p[1] for p in parts)
        again = ep_forward_repeats(graph, modules)  # the ``moe`` recompute module re-runs dispatch and combine
        ep_s, ep_bytes = ep_s * (1 + again), ep_bytes * (1 + again)
        if par.schedule == "dualpipe" or moe_a2a_overlapped(cluster, rt):
            # Dispatch/combine of one micro-batch run under another's compute (DualPipe pairs a forward and a
            # backward chunk; Megatron-Core's 1F1B A2A overlap merges them). DeepEP's / HybridEP's kernels run on
            # SMs taken from compute (20 of 132 on H800, DeepSeek-V3 report §3.2.2; moe.dispatcher_sm_fraction): the
            # layer's compute slows by that share.
            slow = 1.0 / (1.0 - dispatcher_sm_fraction(dispatcher, cluster))
            forward, backward = forward * slow, backward * slow
            if par.schedule == "dualpipe":  # only what the layer's compute cannot cover stays exposed
                ep_s = max(0.0, ep_s - (forward + backward))
            else:
                nodes = a2a_overlap_compute_split(graph, model, cluster, job, par, rt)
                nodes = OverlapNodes(*(x * slow for x in (nodes.attn_f, nodes.attn_b, nodes.mlp_f, nodes.mlp_b,
                                                          nodes.comb_f, nodes.comb_b)))
                # the ``moe`` module's re-run dispatch/combine sit in the backward's recompute, outside the steps
                ep_s = (a2a_overlap_exposed_s([p[0] for p in parts], nodes)
                        + again * sum(p[0] for p in parts))
    window, unhidden = 1.0, 0.0
    if c > 1 and is_block:
        cp_s, cp_bytes, window, unhidden = cp_comm(graph, cluster, job, par, strides.cp, rt, model.mamba)
    out = LayerCost(forward, backward, recompute, cc.attn_f + cc.attn_b, tp_s, ep_s, cp_s, tp_bytes,
                    ep_bytes, cp_bytes, window, unhidden)
    if graph.kind == "moe":
        # forward device work: compute, the forward's exposed all-to-alls (all of dispatch and combine without the
        # overlap), half of the TP/CP collectives; after the sync the host issues the experts beside the device
        # running them (and, for ``alltoall``, the dispatch all-to-all issued after its sync point)
        ep_fwd = 0.0 if e <= 1 or par.schedule == "dualpipe" or moe_a2a_overlapped(cluster, rt) \
            else (parts[0][0] + parts[1][0])
        expert_f = sum(op_compute(op, graph, model, cluster, job, par, rt).forward_s for op in graph.ops
                       if op.kind == "experts")
        win = expert_f + (parts[0][0] if e > 1 and moe_dispatcher(cluster, rt) == "alltoall" else 0.0)
        share = (forward + ep_fwd + (tp_s + cp_s) / 2) / out.total_s if out.total_s > 0 else 0.5
        out = replace(out, forward_share=share, sync_window_s=win)
    host = host_wait_s(graph, model, cluster, par, rt, out.total_s, out.forward_share, out.sync_window_s)
    return replace(out, host_s=host) if host else out


def host_wait_s(graph: LayerGraph, model: ModelSpec, cluster: ClusterSpec, par: ParallelConfig,
                rt: Runtime | None, device_s: float, forward_share: float = 0.5, window_s: float = 0.0) -> float:
    """The host-bound wait a layer of ``graph``'s kind adds to ``device_s`` of device work (one micro-batch,
    forward + backward): ``host_bound_s`` on MoE layers whose experts the host issues, else 0. ``forward_share`` /
    ``window_s``: ``LayerCost.forward_share`` / ``sync_window_s`` of the layer. The one rule ``layer_cost`` and the
    search's ILP-solved layer times (search.score.layer_pieces) both apply."""
    if graph.kind != "moe" or cluster.efficiency.moe_host_s_per_expert <= 0 or not moe_layer_host_issued(rt):
        return 0.0
    synced = dispatcher_syncs_host(rt) and not (par.ep > 1 and moe_a2a_overlapped(cluster, rt))
    return host_bound_s(device_s, model, cluster, par, forward_share if synced else None, window_s)


# Of the kernels TE's GroupedLinear issues per local expert for fc1 and fc2 (layer-micro-batch), the forward's:
# quantize + fprop GEMM per linear = 4 of 10 (the backward: grad quantize, dgrad, wgrad per linear; host_bound_s).
HOST_FORWARD_SHARE = 4 / 10


def host_bound_s(device_s: float, model: ModelSpec, cluster: ClusterSpec, par: ParallelConfig,
                 forward_share: float | None = None, window_s: float = 0.0) -> float:
    """Wait of one MoE layer (one micro-batch, forward + backward) on its host: the device finishes ``device_s`` of
    work, the host needs ``moe_host_s_per_expert`` × local experts to issue it (TE's GroupedLinear loops over the
    rank's experts in Python, transformer_engine/pytorch/module/grouped_linear.py).

    Without a per-layer sync (drop-and-pad dispatch: ``moe.dispatcher_syncs_host``; or under the A2A overlap, whose
    combined step syncs on the attention forward issued before the backward's expert work,
    ``cost_models.a2a_overlap``) the host runs ahead: the layer takes max(device, host), i.e. device + this.
    With it (``forward_share`` given: dropless, ``moe.DISPATCHER_HOST_SYNC``), the forward's dispatch blocks the host
    until the device has run the layer up to its experts, so the device queue is empty when the host starts issuing
    them: the forward's expert issue (``HOST_FORWARD_SHARE`` of the host work) overlaps only the device work after
    the sync (``window_s``: the experts, and the dispatch all-to-all where it is issued after the sync), the rest of
    the forward runs on the device alone; the backward has no sync, its issue overlaps its device work. So the wait
    is max(0, host_f − window) + max(0, host_b − device_b), ``device_b = (1 − forward_share)·device_s``.

    Priced only where the host issues the experts (``moe.moe_layer_host_issued``: no CUDA graph holds them). Per
    local expert, forward + backward of fc1 and fc2, the host issues TE 2.12's per-expert quantize, fprop, grad
    quantize, dgrad and wgrad (10 kernels: split_quantize and the multi-stream grouped GEMM loop over experts in
    C++, the scale swizzles are one multi-tensor call, pytorch/csrc/extensions/gemm.cpp:502-565) and its Python
    per-expert work (weight workspace, quantizer usage, main_grad / dummy wgrad, grouped_linear.py:106-500 at
    5671fd36) plus Megatron's per-parameter grad hook; the per-layer part (router, permute, dispatch, combine) is
    not counted here."""
    host = cluster.efficiency.moe_host_s_per_expert * (model.num_experts // par.ep)
    if forward_share is None:
        return max(0.0, host - device_s)
    host_f = HOST_FORWARD_SHARE * host
    return max(0.0, host_f - window_s) + max(0.0, host - host_f - (1.0 - forward_share) * device_s)


EP_ALL_TO_ALLS = 4  # per MoE layer per micro-batch: dispatch and combine, forward and backward (§4)


def ep_all_to_all(model: ModelSpec, cluster: ClusterSpec, job: JobSpec, par: ParallelConfig,
                  stride: int, rt: Runtime | None = None) -> tuple[float, float]:
    """(seconds, bf16 payload bytes) of one dispatch or combine all-to-all over the ``par.ep`` ranks at
    ``stride``: the mean of ``moe_all_to_all``'s four (tokens split over TP with SP), × imbalance ρ (§4)."""
    tokens = par.micro_batch_size * job.seq_len / par.cp
    local_tokens = tokens / (par.tp if par.sequence_parallel else 1)
    rho = moe_load_imbalance(model, job, par, cluster, rt)
    payload = local_tokens * model.moe_top_k * model.hidden_size * 2.0 * rho
    total_s, _ = moe_all_to_all(model, cluster, job, local_tokens, par.ep, stride, rho=rho,
                                dispatcher=moe_dispatcher(cluster, rt))
    return total_s / EP_ALL_TO_ALLS, payload


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


def attention_kernel_factor(model: ModelSpec, job: JobSpec, par: ParallelConfig, cluster: ClusterSpec,
                            steps: int, kind: LayerKind = "dense") -> float:
    """Time factor of the fused attention kernel against the one the generation's ``attention`` share describes.

    With ``attention_half_keys`` set, the kernel's throughput follows its generation's measured saturation in the
    keys each query sees, ``x/(x + attention_half_keys)``, and ``attention`` is its share at
    ``ATTENTION_REF_KEYS`` (an 8192-token causal sequence, where ``ATTENTION_KERNEL_BENCH`` is measured): a kernel
    over ``x = keys_per_query / n`` keys (``n`` ring-CP steps, each on one K/V chunk) runs
    ``sat(ATTENTION_REF_KEYS) / sat(x)`` times as long. Without it (the generation's fitted share holds at every
    length), only ring CP's shorter per-step kernels are slower: ``cp_kernel_slowdown``."""
    half = cluster.efficiency.attention_half_keys
    if half is None:
        return cp_kernel_slowdown(job, par, cluster, steps) if steps > 1 else 1.0
    keys = mean_keys_per_query(model, kind, job.seq_len) / max(steps, 1)  # layers of ``kind``, each its window
    return (ATTENTION_REF_KEYS / (ATTENTION_REF_KEYS + half)) / (keys / (keys + half))


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
    """Ring attention overlaps each K/V block transfer with the previous block's compute: what shows."""
    return max(0.0, ring_s - attention_s)


FP8_DISPATCH_BYTES = 1.0 + 4.0 / 128  # fp8 element + one fp32 scale per 128-element tile (report §3.3.2)


# Ops of an MoE layer that run in the A2A overlap's combine node, on the comm stream after the combine all-to-all
# (fine_grained_callables.py:544-586 ``submodule_combine_forward``: ``combine_postprocess`` unpermutes, the shared
# expert's output is added, ``mlp_bda`` adds the residual); ``a2a_overlap.py`` says where every other op runs.
COMBINE_NODE_OPS = ("combine", "shared_add", "mlp_residual")


def a2a_overlap_compute_split(graph: LayerGraph, model: ModelSpec, cluster: ClusterSpec, job: JobSpec,
                              par: ParallelConfig, rt: Runtime | None) -> OverlapNodes:
    """Compute seconds of one MoE layer per node of the A2A-overlap schedule (``a2a_overlap``): the ``mlp`` node is
    the routed experts (``experts`` ops, named ``expert_*``), the combine node's post-processing ``COMBINE_NODE_OPS``,
    the ``attn`` node everything else (attention block, norms, router, permutation, shared experts:
    fine_grained_callables.py:477 runs them in the attention node)."""
    side = {"attn": [0.0, 0.0], "mlp": [0.0, 0.0], "comb": [0.0, 0.0]}
    for op in graph.ops:
        oc = op_compute(op, graph, model, cluster, job, par, rt)
        key = ("mlp" if op.kind == "experts" or op.name.startswith("expert_")
               else "comb" if op.name in COMBINE_NODE_OPS else "attn")
        side[key][0] += oc.forward_s
        side[key][1] += oc.backward_s
    return OverlapNodes(*side["attn"], *side["mlp"], *side["comb"])


def a2a_overlap_exposed_s(a2a: list[float], nodes: OverlapNodes) -> float:
    """Exposed EP time of one layer under Megatron-Core's A2A overlap (``--overlap-moe-expert-parallel-comm``): the
    steady-state layer step of the combined 1F1B schedule as megatron-core issues it (two streams in FIFO order,
    one CUDA event per micro-batch chaining its nodes: ``cost_models.a2a_overlap``) less the layer's compute.
    ``a2a`` = the four all-to-alls as ``moe_all_to_all_parts`` orders them: forward dispatch, forward combine,
    combine's backward, dispatch's backward."""
    return overlap_exposed_s(a2a, nodes)


def moe_all_to_all(model: ModelSpec, cluster: ClusterSpec, job: JobSpec, local_tokens: float, ep: int,
                   stride: int = 1, *, rho: float | None = None, dispatcher: str | None = None) -> tuple[float, float]:
    """(seconds, bytes each rank sends) of one MoE layer's four all-to-alls (dispatch and combine, forward and
    backward) for ``local_tokens`` tokens on one rank, over an EP group of ``ep`` ranks at ``stride``.

    The group spans ``D`` NVLink domains with ``n`` of its ranks in each (``place_group``). A token's ``k`` routed
    copies reach ``E[domains] = D·(1 − (1 − 1/D)^k)`` domains under uniform routing; group-limited routing with
    one group per domain caps it at the expected number of the ``M = topk_group`` chosen groups' domains,
    ``D·(1 − C(G − G/D, M)/C(G, M))`` (DeepSeek-V3: ≤ 4 nodes). A fraction ``(D − 1)/D`` of them is remote.
    Megatron's ``alltoall`` dispatcher sends each remote copy over the NIC (``k·(D−1)/D`` per token) and local
    copies over NVLink; DeepEP sends one copy per remote domain over the NIC and forwards copies to their GPUs
    over NVLink (``k·(1 − 1/n)``), the two links in parallel: the slower one sets the time; HybridEP (Megatron-Core's
    other flex backend, the one for multi-node NVLink) routes the same way. fp8 training with DeepEP dispatches in
    fp8 (forward dispatch and the backward of combine; combine stays bf16: report §3.3.3); HybridEP is priced in
    bf16. The busiest rank carries ``rho`` × the mean (default the catalog's ``moe_imbalance``;
    ``moe.moe_load_imbalance``); ``dispatcher`` defaults to the catalog's."""
    parts = moe_all_to_all_parts(model, cluster, job, local_tokens, ep, stride, rho=rho, dispatcher=dispatcher)
    return sum(p[0] for p in parts), sum(p[1] for p in parts)


def moe_all_to_all_parts(model: ModelSpec, cluster: ClusterSpec, job: JobSpec, local_tokens: float, ep: int,
                         stride: int = 1, *, rho: float | None = None,
                         dispatcher: str | None = None) -> list[tuple[float, float]]:
    """``moe_all_to_all``'s four all-to-alls, (seconds, bytes) each: forward dispatch, forward combine, combine's
    backward (dispatch-shaped), dispatch's backward (combine-shaped)."""
    eff = cluster.efficiency
    k, h = model.moe_top_k, model.expert_input_size  # a latent MoE moves latent-wide tokens (moe_layer.py:265-270)
    place = place_group(ep, stride, cluster)
    d, n = place.n_outer, place.n_inner
    domains = d * (1 - (1 - 1 / d) ** k)
    g, mg = model.arch.router.num_groups, model.arch.router.group_top_k
    if g and mg and d > 1 and g % d == 0:
        per = g // d
        domains = min(domains, d * (1 - math.comb(g - per, mg) / math.comb(g, mg)))
    remote = domains * (d - 1) / d
    dispatcher = dispatcher or eff.moe_dispatcher
    deepep = dispatcher in ("deepep", "hybridep")  # one copy per remote domain, forwarded over NVLink
    fp8 = job.precision == "fp8" and dispatcher == "deepep"
    elem = [FP8_DISPATCH_BYTES if fp8 else 2.0, 2.0, FP8_DISPATCH_BYTES if fp8 else 2.0, 2.0]
    tok = local_tokens * h * (eff.moe_imbalance if rho is None else rho)
    bw_in = cluster.gpu.link_gbytes_per_s * 1e9 * eff.link_bus
    bw_out = cluster.inter_node_gbps / 8 * 1e9 * eff.nic_bus
    lat = (n - 1) * cluster.gpu.link_latency_us * 1e-6 + (d - 1) * cluster.gpu.nic_latency_us * 1e-6
    parts = []
    for b in elem:
        if d == 1:
            nic, nvl = 0.0, tok * k * (ep - 1) / ep * b
        elif deepep:
            nic, nvl = tok * remote * b, tok * k * (1 - 1 / n) * b
        else:
            nic, nvl = tok * k * (d - 1) / d * b, tok * k * (n - 1) / ep * b
        parts.append((lat + max(nic / bw_out, nvl / bw_in), nic + nvl))
    return parts


def model_flops_per_token(graph: LayerGraph) -> float:
    """Training model FLOPs per token of one layer (no recompute): 3 × forward, attention counted
    without the causal discount (PaLM / Megatron convention for MFU); a Mamba-2 scan as Megatron-LM counts it
    (``7 · d_inner · state``, training.py ``mamba_layer_flops``)."""
    fwd = 0.0
    for op in graph.ops:
        if op.kind in ("matmul", "router", "experts", "ssm"):
            fwd += op.flops_per_token * op.tokens_factor
        elif op.kind == "attention":
            fwd += op.flops_per_token * 2  # undo the causal halving
    return 3.0 * fwd
