"""Transformer Engine's measured GEMM kernel times per quantization recipe (a leaf: te_fp8 and te_nvfp4 read it)."""

from __future__ import annotations

# Transformer Engine's GEMM profiling guide times the 12 GEMMs of a transformer layer (hidden 4096, FFN 16384,
# 15,872 tokens) with pre-quantized inputs (no quantization timed) on B300, per-layer ms (fprop, dgrad, wgrad), per
# recipe (NVIDIA/TransformerEngine docs/examples/gemm_profiling/gemm_profiling.rst, "Autocast vs Pre-quantized", at
# 1609c890e, TE#2863). The block-scaled recipes' GEMM time over the per-tensor fp8 GEMM's comes from it
# (te_fp8.MXFP8_GEMM_TIME_RATIO, te_nvfp4.NVFP4_GEMM_TIME_RATIO).
TE_PREQUANT_GEMM_MS_B300 = {"fp8_tensorwise": (2.158, 2.329, 2.325), "mxfp8": (2.365, 2.397, 2.400),
                            "nvfp4": (1.254, 1.305, 1.205)}


def te_gemm_time_ratio(recipe: str) -> float:
    """A recipe's GEMM time over per-tensor fp8's on the same shapes (``TE_PREQUANT_GEMM_MS_B300``)."""
    return sum(TE_PREQUANT_GEMM_MS_B300[recipe]) / sum(TE_PREQUANT_GEMM_MS_B300["fp8_tensorwise"])
