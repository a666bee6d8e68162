"""Transformer Engine's fp8 (Megatron-Core's fp8 path), as read from TE's code and docs: what each recipe's
quantization moves through HBM (``te_cast_bytes``), what its sequence-parallel all-gathers carry
(``te_tp_gather_bytes``), and how much slower block-scaled MXFP8 GEMMs run than per-tensor fp8 ones
(``MXFP8_GEMM_TIME_RATIO``). Facts only; ``cost_models.knob_effects`` prices them, the megatron target profile
(``cost_models.targets.megatron``) sets the runtime from them."""

from __future__ import annotations

from dataclasses import dataclass

from cost_models.te_gemm import te_gemm_time_ratio
from cost_models.te_nvfp4 import NVFP4_CAST_BYTES, NVFP4_TP_GATHER_BYTES

# Transformer Engine's fp8 quantization (Megatron-Core's fp8 path), per recipe: HBM bytes per element of a GEMM
# operand beyond the bf16 tensor its producer writes anyway (bf16 = 2, fp8 = 1), read from TE's code at v2.9 (the
# NeMo 25.11 container's TE: Megatron-Bridge v0.2.2 pyproject ``release_v2.9``). ``csrc`` =
# transformer_engine/pytorch/csrc, ``common`` = transformer_engine/common, ``normalization.cpp`` =
# csrc/extensions/normalization.cpp ``rmsnorm_fwd`` (``layernorm_fwd`` :107-131 chooses alike).
# - Per-tensor recipes keep one fp8 copy, plus its transpose for the backward GEMMs only where the fp8 GEMM takes
#   the TN layout alone: Hopper; Blackwell's (sm_100) fp8 GEMM takes any layout (``common/transformer_engine.cpp``
#   :719-727 ``nvte_is_non_tn_fp8_gemm_supported``; ``csrc/quantizer.cpp``:137, :340 allocate the transpose only
#   without it). One kernel reads the bf16 tensor and writes every copy (``nvte_quantize_v2``).
# - delayed (``Float8Quantizer``): the cast uses the previous steps' amax (no amax pass). A norm feeding the GEMM
#   (``LayerNormLinear``, ``module/layernorm_linear.py``:198-215 hands it the quantizer) writes fp8 itself
#   (normalization.cpp:332-333 FULLY_FUSED: 1 byte written where bf16 wrote 2), then ``nvte_transpose`` (read 1,
#   write 1) where a transpose is needed (``common/normalization/rmsnorm/rmsnorm_api.cpp``:96-103).
# - tensorwise (``Float8CurrentScalingQuantizer``, per-tensor current scaling): ``nvte_compute_amax`` reads the
#   tensor once more before the cast (``csrc/quantizer.cpp``:515-535). A norm computes the amax while writing its
#   bf16 output (normalization.cpp:340-344 FUSED_NORM_AMAX_FP8, TE's own norm kernel) and the cast skips the amax
#   pass (``quantize_with_amax``, quantizer.cpp:543-549); the norm still writes bf16, so the cast is extra.
# - mxfp8 (``MXFP8Quantizer``): 1x32 blocks with an E8M0 (1-byte) scale each, along the GEMM's K; fprop and dgrad
#   contract over features, wgrad over tokens, so a rowwise AND a columnwise copy, each with its scales, both
#   written by one kernel from one read (``common/util/cast_kernels.cuh``:1586-1587, :1687 BIDIMENSIONAL
#   ``cast_mxfp8_2D_kernel``; the quantizer allocates both, ``csrc/quantizer.cpp``:905-945; ``module/linear.py``
#   :183, :569 ask for both usages). A norm fuses it only on cuDNN's norm with NVTE_NORM_FWD_USE_CUDNN
#   (normalization.cpp:334-339; TE's default is its own kernel): the norm writes bf16 and the quantizer casts it
#   (UNFUSED, :331, :406-409).
# - blockwise (``Float8BlockQuantizer`` 1x128, Hopper): rowwise and columnwise copies, an fp32 scale per 128
#   elements each, one kernel; a norm writes bf16 and is cast (UNFUSED, normalization.cpp:331).
# The backward casts each GEMM's output gradient with the same quantizer, both usages (``module/linear.py``
# :567-569, ``module/base.py`` ``grad_output_preprocess``): the non-norm cost.
BF16_BYTES, FP8_BYTES = 2.0, 1.0
MX_BLOCK, E8M0_BYTES = 32, 1.0  # OCP MX v1.0: 32-element blocks, one 8-bit power-of-two scale
BLOCKWISE_BLOCK, FP32_SCALE_BYTES = 128, 4.0  # TE Float8BlockScaling: 1x128 tiles, fp32 scales
# "nvfp4": TE's NVFP4BlockScaling, which TE runs through the same fp8_autocast (Megatron-Core fp4_utils.py:146-149);
# its facts live in ``cost_models.te_nvfp4``.
TE_RECIPES = ("delayed", "tensorwise", "blockwise", "mxfp8", "nvfp4")


@dataclass(frozen=True)
class TeCast:
    """Transformer Engine's fp8 cast bytes per element: a GEMM input a norm writes (``LayerNormLinear``), any other
    GEMM input, and an output gradient in the backward."""

    norm_input: float
    input: float
    grad_output: float


def te_cast_bytes(recipe: str | None, non_tn_gemm: bool) -> TeCast:
    """TE's cast bytes for ``recipe`` (None: TE's default, delayed); ``non_tn_gemm``: the fp8 GEMM takes any layout
    (Blackwell), so per-tensor recipes keep no transpose. The kernel sequences are those the comment above cites."""
    copies = 1 if non_tn_gemm else 2
    cast = BF16_BYTES + copies * FP8_BYTES  # one read of the bf16 tensor, each fp8 copy written
    if recipe in (None, "delayed"):
        norm = (FP8_BYTES - BF16_BYTES) + (0.0 if non_tn_gemm else 2 * FP8_BYTES)  # fp8 norm output + transpose
        return TeCast(norm, cast, cast)
    if recipe == "tensorwise":
        return TeCast(cast, BF16_BYTES + cast, BF16_BYTES + cast)  # norm fuses the amax; others read it first
    if recipe == "mxfp8":
        mx = BF16_BYTES + 2 * (FP8_BYTES + E8M0_BYTES / MX_BLOCK)
        return TeCast(mx, mx, mx)
    if recipe == "blockwise":
        block = BF16_BYTES + 2 * (FP8_BYTES + FP32_SCALE_BYTES / BLOCKWISE_BLOCK)
        return TeCast(block, block, block)
    if recipe == "nvfp4":  # the norm does not fuse (te_nvfp4): every operand takes the whole quantization
        return TeCast(NVFP4_CAST_BYTES, NVFP4_CAST_BYTES, NVFP4_CAST_BYTES)
    raise ValueError(f"no Transformer Engine cast for fp8 recipe {recipe!r}")


# Transformer Engine's sequence-parallel all-gathers under fp8 move the quantized tensor, bytes per element:
# (input of a column-parallel linear, forward; output gradient of a row-parallel linear, backward). The forward
# gathers the norm's output quantized, row-wise usage only (``module/layernorm_linear.py``:246-265); the backward
# gathers the output gradient with the quantizer's usages, both for MXFP8 (``module/linear.py``:567-569,
# ``module/base.py``:1145, 1161-1192). Per-tensor fp8 gathers its one fp8 copy and builds any transpose locally
# after (``distributed.py`` ``_all_gather_fp8``:903-975); MXFP8 gathers each copy asked for with its E8M0 scales
# (``_all_gather_mxfp8``:1524, 1547): its row-wise copy forward, both backward, as columnwise scales cannot be
# made from row-wise ones. Blockwise (Hopper's Float8BlockScaling): not read, priced as bf16 (2, 2).
def te_tp_gather_bytes(recipe: str | None) -> tuple[float, float]:
    """(forward input, backward output-gradient) bytes per element of TE's sequence-parallel all-gathers under the
    fp8 ``recipe`` (None: TE's default, delayed)."""
    if recipe in (None, "delayed", "tensorwise"):
        return FP8_BYTES, FP8_BYTES
    if recipe == "mxfp8":
        copy = FP8_BYTES + E8M0_BYTES / MX_BLOCK
        return copy, 2 * copy
    if recipe == "nvfp4":
        return NVFP4_TP_GATHER_BYTES
    return BF16_BYTES, BF16_BYTES


def te_gathered_cast_bytes(recipe: str | None, non_tn_gemm: bool, tp: int, norm_fed: bool = False) -> float:
    """TE's cast of a tensor sequence parallelism all-gathers (a column-parallel linear's input, forward; a
    row-parallel linear's output gradient, backward), bytes per GATHERED element: the quantizer runs on the local
    1/tp shard before the gather (``module/layernorm_linear.py``:246-265, ``distributed.py`` ``_all_gather_fp8`` /
    ``_all_gather_mxfp8``). Per-tensor recipes cast that shard row-wise only (the gather cannot carry a transpose:
    ``_all_gather_fp8`` drops the column-wise usage; TE's norm writes no transpose without it, rmsnorm_api.cpp:96) and
    a TN-only GPU builds the transpose on the gathered tensor (``_create_transpose``: read 1, write 1); MXFP8,
    blockwise and NVFP4 quantize the shard with every usage."""
    if recipe in ("mxfp8", "blockwise", "nvfp4"):
        local = te_cast_bytes(recipe, non_tn_gemm)
        return (local.norm_input if norm_fed else local.input) / tp
    rowwise = te_cast_bytes(recipe, non_tn_gemm=True)  # one fp8 copy, no transpose
    local = rowwise.norm_input if norm_fed else rowwise.grad_output
    return local / tp + (0.0 if non_tn_gemm else 2 * FP8_BYTES)


# Block-scaled MXFP8 GEMMs run slower than per-tensor-scaled fp8 GEMMs of the same shape on Blackwell: the
# tensor cores also load each operand's E8M0 scales (swizzled into tcgen05's layout) and apply them per 32-element
# K block. Measured by Transformer Engine's GEMM profiling guide on B300 (te_gemm.TE_PREQUANT_GEMM_MS_B300): the
# time of an MXFP8 GEMM over the model's fp8 GEMM.
MXFP8_GEMM_TIME_RATIO = te_gemm_time_ratio("mxfp8")
