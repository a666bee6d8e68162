"""HBM bytes of an op's memory-bound kernels (norms, rotary, activations, residual adds, the MoE permutation, the
loss, fp8 casts) for one micro-batch on one rank, forward and backward (COST_MODEL.md §2): what each kernel reads and
writes per element (Williams et al. 2009 roofline; Korthikanti et al. 2022 §4 for which tensors each op touches),
fused or eager as the runtime runs it. ``op_cost`` turns them into seconds at the achieved streaming bandwidth.

Sharding under TP (Shoeybi et al. 2019, Megatron-LM §3): an op whose output has head/FFN/vocab width is
column-parallel (``n ÷ t``), one whose input has it is row-parallel (``k ÷ t``) (``matmul_split``); hidden-width
tensors are split across TP only with sequence parallelism."""

from __future__ import annotations

from collections.abc import Callable

from cost_models.knob_effects import (TORCHAO_ACT_CAST_BYTES, fp8_cast_bytes, fp8_rescale_bytes,
                                      torchao_cast_after_gather, torchao_casts)
from cost_models.gdn import gdn_traffic_bytes
from cost_models.mamba import layout_copy_bytes, ssd_traffic_bytes
from cost_models.opgraph import LayerGraph, Op, gemm_precision, tp_divisor
from cost_models.quant_layout import op_precision
from cost_models.specs import JobSpec, ModelSpec, ParallelConfig
from cost_models.targets.common import CORE_RELEASES as CORE_ORDER, Runtime
from cost_models.te_fp8 import BF16_BYTES, TE_RECIPES, te_gathered_cast_bytes


COLUMN_KINDS = {"q", "kv", "ffn", "expert_ffn", "vocab", "ssm"}  # split by TP (heads / columns)


def matmul_split(op: Op, graph: LayerGraph, t: int) -> tuple[int, int]:
    out_kind = graph.tensors[op.output].dim_kind
    in_kind = graph.tensors[op.inputs[0]].dim_kind
    k, n = op.weight_in, op.weight_out
    if out_kind in COLUMN_KINDS:
        return k, -(-n // t)
    if in_kind in COLUMN_KINDS:
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
# TE's copies of the routed rows into and out of the per-expert blocks the quantized grouped GEMM needs
# (``moe.quantization_padded``): before fc1, read each bf16 row and write it padded (forward), the gradient back the
# other way (backward); the mirror after fc2. Per element of fc1's input / fc2's output (the pad rows, under 16 per
# expert, and the fp32 routing probs padded beside them are left out).
QUANT_PADDING_BYTES = (2 * BF16_BYTES, 2 * BF16_BYTES)
# - RoPE under YaRN (``Runtime.mcore_yarn_unfused_rope``): with a concentration factor != 1 (GPT-OSS: 1.347)
#   ``apply_rotary_pos_emb`` falls back from TE's fused RoPE to ``_apply_rotary_pos_emb_bshd``
#   (models/common/embeddings/rope_utils.py:279-284, 97-125) for q and for k: t*cos (4), rotate_half's neg and cat
#   (2 + 4), *sin (4), the add (6), the cat with the empty pass-through part (4); backward the two muls, neg, cat,
#   the slice's zero-fill and two gradient adds. Per q/k element, against the fused kernel's ROTARY_BYTES:
MCORE_UNFUSED_ROTARY_BYTES = (24.0, 28.0)
# - the loss ``cross_entropy(pred.flatten(0, 1).float(), labels)`` (torchtitan train.py; not compiled in the 2024-12
#   runs, e8977b0 "turning off compile on loss function"): ``float()`` (2 + 4), ``_log_softmax`` (4 + 4), nll
#   gather; backward nll zero-fill (4), ``_log_softmax_backward_data`` (4 + 4 + 4), to bf16 (4 + 2), per logit.
TORCH_LOSS_BYTES = (14.0, 22.0)
# Megatron-Core's fused grouped MLP (``Runtime.moe_fused_grouped_mlp``: TransformerConfig.use_transformer_engine_op_fuser,
# core_v0.18.0 megatron/core/transformer/moe/experts.py:268-273 ``_with_fused_impl``, :374-530 ``_make_fused_ops``:
# te.ops GroupedLinear, ScaledSwiGLU / ScaledClampedQGeGLU, GroupedLinear) under MXFP8 on sm_100 is one fused op of
# Transformer Engine (transformer_engine/pytorch/ops/fused/grouped_mlp.py @ d0067d0 ``fuse_grouped_mlp_ops`` :816-897,
# ``_GroupedMLP_CuTeGEMMBase`` :901-): forward, cuDNN-frontend's ``grouped_gemm_glu_wrapper_sm100`` runs fc1 and writes
# from its epilogue the pre-activation ``c_tensor`` (bf16, kept for backward: :1407, :1550, :1793) and the GLU output
# (probs applied, clamp inside) already quantized, rowwise and columnwise MXFP8 with their scales (``d_tensor``,
# ``d_col_tensor``: :1358, :1626-1645), which fc2 reads as its input; backward, ``grouped_gemm_dglu_wrapper_sm100``
# runs fc2's dgrad with the dGLU in its epilogue: it reads the saved ``c_tensor`` and writes fc1's output gradient
# quantized both ways (``d_row_tensor``, ``d_col_tensor``: :2036, :2064-2080, :2190-2213) and the probs' gradient.
# What no longer goes through HBM, per routed token, against the unfused path (GLU width F, fc1 output 2F):
# - forward: the activation kernel (reads the 2F bf16 fc1 output, writes F bf16) and the cast kernel's read of that
#   bf16 F; the cast's MXFP8 writes are the epilogue's (te_fp8.te_cast_bytes less its bf16 read);
# - backward: fc2's dgrad (F, bf16) read back by the dGLU kernel, the dGLU's 2F bf16 output and the cast kernel's
#   read of it; the epilogue still reads the 2F fc1 output.
# So the activation op keeps its backward read of its inputs only (``FUSED_GLU_BWD_INPUT_READS`` x input bytes), and
# the two casts it feeds (fc2's input forward, fc1's output gradient backward) lose their bf16 read
# (``te_fp8.BF16_BYTES``). Megatron's eager expert glue (MCORE_EXPERT_CLAMP_BYTES: the clamp runs in the epilogue,
# cuDNN ``glu_clamp_max`` :1003-1006; MCORE_EXPERT_BIAS_BYTES: fc2's bias is TE's ``scale_bias`` in the fc2 GEMM,
# core_v0.19.0 experts.py:545-559, whose gradients ``compute_grouped_dbias_dscales`` reduces in one more read of
# fc2's bf16 output gradient, grouped_mlp.py :2267-2281, ``FUSED_SCALED_BIAS_SINCE``; before it, core_v0.18.x builds
# fc2 without ``scale_bias`` and TE reduces the bias gradient inside the output gradient's quantize,
# ``bgrad_group_quantize`` :1945-1953) does not run either.
FUSED_SCALED_BIAS_SINCE = "0.19.0"
FUSED_GLU_BWD_INPUT_READS = 1.0  # the dGLU epilogue reads the saved fc1 output once (bf16)
# fp8 (Transformer Engine): each GEMM input and output gradient is cast by the recipe's quantizer; what it costs, and
# what the norm of a LayerNormLinear fuses, per recipe and GPU: te_fp8.te_cast_bytes.


def local_widths(op: Op, graph: LayerGraph, t: int) -> tuple[int, int]:
    return matmul_split(op, graph, t) if op.kind == "matmul" else (op.weight_in, op.weight_out)


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


def _add_quant_padding(op: Op, graph: LayerGraph, per_rank: Callable[[str], float], fwd: float,
                       bwd: float) -> tuple[float, float]:
    """``fwd`` / ``bwd`` plus TE's padding copies (``QUANT_PADDING_BYTES``) where ``op`` is the grouped fc1 (the
    first experts op reading the dispatched rows: gate and up are one GroupedLinear) or fc2 (the one the combine
    reads)."""
    prod = next((o for o in graph.ops if o.output == op.inputs[0]), None)
    fc1 = prod is not None and prod.kind == "dispatch" \
        and next(o for o in graph.ops if o.kind == "experts" and o.inputs[0] == op.inputs[0]) is op
    fc2 = any(o.kind == "combine" and op.output in o.inputs for o in graph.ops)
    w = (per_rank(op.inputs[0]) if fc1 else 0.0) + (per_rank(op.output) if fc2 else 0.0)
    return fwd + QUANT_PADDING_BYTES[0] * w * op.tokens_factor, bwd + QUANT_PADDING_BYTES[1] * w * op.tokens_factor


def op_traffic_bytes(op: Op, graph: LayerGraph, model: ModelSpec | None, job: JobSpec,
                     par: ParallelConfig, rt: Runtime | None = None,
                     eager: bool = False, non_tn_gemm: bool = False, permute_passes: int = 1,
                     quant_padding: bool = False, glue_ratio: float = 1.0) -> tuple[float, float]:
    """HBM bytes (forward, backward) of one op's memory-bound kernels for one micro-batch on one rank. ``eager``:
    norms, rotary and the gated activation run op by op (``EAGER_*``); the loss is torch's op-by-op cross-entropy
    (``TORCH_LOSS_BYTES``) when the runtime's loss is not fused (``Runtime.fused_loss``). ``non_tn_gemm``: the GPU's
    fp8 GEMM takes any layout (``knob_effects.non_tn_fp8_gemm``: no fp8 transposes). ``permute_passes``: the
    dispatcher's passes over the routed copies per dispatch / combine (``moe.permutation_passes``). ``quant_padding``
    (an experts op): TE pads the routed rows per expert for the quantized grouped GEMM (``moe.quantization_padded``).
    ``glue_ratio``: Megatron-Core's eager glue bytes (``MCORE_EXPERT_CLAMP_BYTES``, ``MCORE_EXPERT_BIAS_BYTES``,
    ``MCORE_UNFUSED_ROTARY_BYTES``) count this many times: the generation's measured device time of those kernels
    over their bytes' streaming time (``Efficiency.mcore_glue_time_ratio``).

    Hidden-width tensors are split across TP only with sequence parallelism (otherwise every TP rank repeats
    the norms and residual adds); head/FFN/vocab-width tensors are split by TP. ``par`` is how *this op* is
    sharded (the search prices per-op shardings with it; a uniform layer passes the layer's config)."""
    t = par.tp
    sp = par.sequence_parallel and t > 1
    tokens = par.micro_batch_size * job.seq_len / par.cp

    def per_rank(tensor: str) -> float:
        ten = graph.tensors[tensor]
        if ten.dim_kind in COLUMN_KINDS:
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
        unfused = not eager and mcore_unfused_rope(rt, model)
        rb = EAGER_ROTARY_BYTES if eager else MCORE_UNFUSED_ROTARY_BYTES if unfused else ROTARY_BYTES
        g = glue_ratio if unfused else 1.0
        fwd, bwd = rb[0] * w * g, rb[1] * w * g
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
        if op.name.startswith("expert_") and fused_grouped_mlp(rt, model):  # in the GEMM epilogues
            fwd, bwd = 0.0, BF16_BYTES * FUSED_GLU_BWD_INPUT_READS * ins * tf
        elif op.name.startswith("expert_") and op.clamped and mcore_glue(rt, model):
            fwd = fwd + MCORE_EXPERT_CLAMP_BYTES[0] * ins * tf * glue_ratio
            bwd = bwd + MCORE_EXPERT_CLAMP_BYTES[1] * ins * tf * glue_ratio
    elif op.kind == "ssm" and model is not None and model.mamba is not None:
        fwd, bwd = ssd_traffic_bytes(model.mamba, t, par.cp)
        cf, cb = layout_copy_bytes(model.mamba, t, par.cp, par.micro_batch_size)
        fwd, bwd = fwd + cf, bwd + cb
    elif op.kind == "gdn" and model is not None and model.gdn is not None:
        fwd, bwd = gdn_traffic_bytes(model, t)
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
    if op.kind == "experts" and graph.tensors[op.output].dim_kind == "hidden" and model is not None \
            and model.linear_bias and fused_grouped_mlp(rt, model):  # fc2's probs-scaled bias (FUSED_SCALED_BIAS_SINCE)
        assert rt is not None
        if CORE_ORDER.index(rt.megatron_core) >= CORE_ORDER.index(FUSED_SCALED_BIAS_SINCE):
            bwd += BF16_BYTES * per_rank(op.output) * tf
    elif op.kind == "experts" and graph.tensors[op.output].dim_kind == "hidden" and mcore_glue(rt, model) \
            and model.linear_bias:  # fc2's bias added per expert outside the GEMM (MCORE_EXPERT_BIAS_BYTES)
        probs = "fp32" if rt.moe_dispatcher in ("deepep", "hybridep") else "bf16"
        w = per_rank(op.output) * tf * glue_ratio
        fwd, bwd = fwd + MCORE_EXPERT_BIAS_BYTES[probs][0] * w, bwd + MCORE_EXPERT_BIAS_BYTES[probs][1] * w
    if quant_padding and op.kind == "experts":
        fwd, bwd = _add_quant_padding(op, graph, per_rank, fwd, bwd)
    if gemm_precision(op, job.precision) in ("fp8", "nvfp4") and op.kind in ("matmul", "experts"):
        k, n = local_widths(op, graph, t)
        scale = tf / (t if sp else 1) if op.kind == "experts" else 1.0  # routed copies on this rank
        prod = next((o for o in graph.ops if o.output == op.inputs[0]), None)
        ao = torchao_casts(rt, job) if op.kind == "matmul" else None
        if ao is not None:  # torchao Float8Linear: every linear casts its input (siblings' casts of one tensor
            # are one kernel under torch.compile), its output gradient, and its weight each micro-batch; a column
            # input / row output gradient that a bf16 SP all-gather produced is cast unfused
            act, w_fwd, w_bwd = ao
            unfused = TORCHAO_ACT_CAST_BYTES[rt.fp8_recipe][0]
            first = next(o for o in graph.ops if o.kind == "matmul" and o.inputs[0] == op.inputs[0]) is op
            gathered_in = graph.tensors[op.output].dim_kind in COLUMN_KINDS and torchao_cast_after_gather(rt, job, sp)
            gathered_dy = graph.tensors[op.inputs[0]].dim_kind in COLUMN_KINDS \
                and torchao_cast_after_gather(rt, job, sp, backward=True)
            fwd += (unfused if gathered_in else act) * k * (1.0 if first or not rt.model_compiled else 0.0) \
                + w_fwd * k * n / tokens
            bwd += (unfused if gathered_dy else act) * n + w_bwd * k * n / tokens
        else:  # Transformer Engine: one module per input (fused q/k/v, gate/up) casts it once; LayerNormLinear's
            # norm takes part in the cast as the recipe allows (te_fp8.te_cast_bytes)
            cast = fp8_cast_bytes(rt, non_tn_gemm)
            recipe = rt.fp8_recipe if rt is not None and rt.fp8_recipe in TE_RECIPES else None
            # the first GEMM of this precision reading the tensor (a recipe's bf16 module casts nothing:
            # quant_layout.op_precision)
            prec = gemm_precision(op, job.precision)
            first = next(o for o in graph.ops if o.kind == op.kind and o.inputs[0] == op.inputs[0]
                         and (o is op or op_precision(o, graph, job.precision, rt) == prec)) is op
            norm_fed = prod is not None and prod.kind == "norm"
            column = op.kind == "matmul" and graph.tensors[op.output].dim_kind in COLUMN_KINDS
            row = op.kind == "matmul" and graph.tensors[op.inputs[0]].dim_kind in COLUMN_KINDS
            # fused grouped MLP: fc2's input (forward) and fc1's output gradient (backward) are quantized in the
            # GLU / dGLU epilogues, which write what the cast writes without reading a bf16 copy (FUSED_GLU_*)
            epi_in = op.kind == "experts" and prod is not None and prod.kind == "elementwise" \
                and fused_grouped_mlp(rt, model)
            epi_dy = op.kind == "experts" and fused_grouped_mlp(rt, model) \
                and any(o.kind == "elementwise" and op.output in o.inputs for o in graph.ops)
            if first:  # SP: a column-parallel input is cast on the local shard, then gathered
                fwd += ((te_gathered_cast_bytes(recipe, non_tn_gemm, t, norm_fed) if sp and column
                         else cast.norm_input if norm_fed else cast.input) - (BF16_BYTES if epi_in else 0.0)) * k * scale
            # SP: a row-parallel output gradient is cast on the local shard, then gathered
            bwd += ((te_gathered_cast_bytes(recipe, non_tn_gemm, t) if sp and row else cast.grad_output)
                    - (BF16_BYTES if epi_dy else 0.0)) * n * scale
        if op.kind == "matmul":  # torchao rowwise: the slow-accum backward GEMMs' separate rescale pass
            dgrad_rescale, wgrad_rescale = fp8_rescale_bytes(rt, job)
            bwd += dgrad_rescale * k + wgrad_rescale * k * n / tokens
    return fwd * tokens, bwd * tokens


def mcore_unfused_rope(rt: Runtime | None, model: ModelSpec | None) -> bool:
    """Whether Megatron-Core applies the model's RoPE op by op (``MCORE_UNFUSED_ROTARY_BYTES``): the runtime says so
    and the model scales standard attention's q/k by a YaRN concentration factor != 1 (MLA has its own fused YaRN
    RoPE, multi_latent_attention.py:553-564)."""
    rs = model.arch.rope_scaling if model is not None else None
    return (rt is not None and rt.mcore_yarn_unfused_rope and model is not None and model.mla is None
            and rs is not None and abs(rs.attention_factor - 1.0) > 1e-9)


def yarn_rope_notes(rt: Runtime | None, model: ModelSpec) -> list[str]:
    """Where ``mcore_unfused_rope`` prices a run the emitted launch does not make: say so with the prediction."""
    if not mcore_unfused_rope(rt, model):
        return []
    factor = model.arch.rope_scaling.attention_factor  # type: ignore[union-attr]
    return [f"{model.name}'s RoPE is priced as megatron-core runs YaRN where the model config sets it (Megatron-Bridge): "
            f"concentration factor {factor:.3f}, so TE's fused RoPE is dropped for the op-by-op one "
            "(rope_utils.py:279-284 @ core_v0.16.1); the Megatron-LM 0.16.1 command line autoplan emits has no YaRN "
            "and runs the fused kernel, slightly faster than priced"]


def fused_grouped_mlp(rt: Runtime | None, model: ModelSpec | None) -> bool:
    """Whether the routed experts run Megatron-Core's fused grouped MLP (``FUSED_GLU_BWD_INPUT_READS``): the runtime
    says so (the megatron target refuses it where TE would not fuse: ``MegatronProfile.check_runtime``) and the model
    has routed experts."""
    return rt is not None and rt.moe_fused_grouped_mlp and model is not None and model.num_experts > 0


def mcore_glue(rt: Runtime | None, model: ModelSpec | None) -> bool:
    """Whether Megatron-Core's eager expert glue (``MCORE_EXPERT_*``) runs: the runtime says so and the model has
    routed experts."""
    return rt is not None and rt.mcore_expert_glue and model is not None and model.num_experts > 0
