"""Transformer Engine's NVFP4 training recipe (``NVFP4BlockScaling``; Megatron-Core ``--fp4-format e2m1
--fp4-recipe nvfp4``), as read from TE's code and docs: what its quantization moves through HBM, what its
sequence-parallel all-gathers carry, what a GEMM saves for the backward, the quantized weight copies TE caches, and
how fast an NVFP4 GEMM runs against a per-tensor fp8 one. Facts only; ``cost_models.te_fp8`` hands them to the
fp8 machinery (``te_cast_bytes`` & co. take ``"nvfp4"`` as a recipe), ``cost_models.gemm`` prices the GEMM, the
megatron target profile sets the runtime.

Read at TransformerEngine 5671fd36 (the 2.12 development commit Megatron-Bridge v0.3.0 = NeMo 26.02 pins:
``pyproject.toml`` ``transformer-engine @ git+...@5671fd3675906cda1ade26c24a65d3dedd88eb89``; Megatron-LM
core_v0.16.1's uv.lock pins the same). ``recipe`` = ``transformer_engine/common/recipe/__init__.py``, ``csrc`` =
``transformer_engine/pytorch/csrc``.

- Every GEMM of a TE linear runs in FP4 (E2M1, 0.5 B/element) with an E4M3 scale per 16 consecutive elements
  along the contraction (1/16 B/element) and one fp32 scale per tensor: fprop (input row-wise x weight row-wise),
  dgrad (output gradient row-wise x weight column-wise), wgrad (input column-wise x output gradient column-wise).
  Scaling runs along K, so each operand needs a row-wise and a column-wise copy, "computed from the high precision
  input to avoid double quantization errors" (recipe ``NVFP4BlockScaling`` docstring).
- Quantizer parameters (recipe ``NVFP4BlockScaling.__post_init__``): inputs 1D blocks + random Hadamard transform
  (RHT, 16x16, column-wise usage only: "so that it can be used for wgrad GEMM"); weights 2D 16x16 blocks, no RHT;
  output gradients 1D + RHT + stochastic rounding. The quantizers ask for both usages
  (``pytorch/quantization.py``:1327-1349 ``rowwise=True, columnwise=True``, ``with_post_rht_amax`` = RHT).
- One RHT quantization (``csrc/quantizer.cpp`` ``NVFP4Quantizer::quantize_impl``:1413-1641) is three kernels, each
  reading the bf16 tensor: ``nvte_hadamard_transform_amax`` (the row-wise amax and the amax of RHT(xᵀ), one read),
  ``nvte_quantize_v2`` for the row-wise copy, ``nvte_hadamard_transform_cast_fusion_columnwise`` for the column-wise
  copy (bf16 input with rows % 64 and cols % 128 == 0; other shapes take an unfused RHT through a bf16 temporary,
  not priced). The RHT is a 16x16 matrix product on the tensor cores, 32 FLOP/element: ~1/20 of the kernel's HBM
  time at Blackwell's ridge point, so the kernels are priced by their bytes. Stochastic rounding draws Philox
  numbers in the same kernel (compute, not bytes).
- A norm feeding the GEMM does not fuse into it: with post-RHT amax TE's norm takes the UNFUSED path
  (``csrc/extensions/normalization.cpp``:356-361), so the norm writes bf16 and the quantizer runs as above.
- Under sequence parallelism the quantizer runs on the local shard with both usages and the all-gather moves the
  row-wise copy with its scales forward, both copies of an output gradient backward (``pytorch/distributed.py``
  ``_all_gather_nvfp4``:1288-; ``module/layernorm_linear.py``:199-205, 247-275 set the gather to row-wise usage).
- The forward saves the input's column-wise copy only ("Discard row-wise data since it is not needed in backward
  pass", ``module/linear.py``:385-399).
- Weights: quantized on the first micro-batch and cached in TE's workspace for the step (Megatron-Core passes
  ``is_first_microbatch``), both usages: 2 x (0.5 + 1/16) B per weight element beside the bf16 weight.
"""

from __future__ import annotations

from cost_models.te_gemm import te_gemm_time_ratio

BF16_BYTES = 2.0
FP4_BYTES, NVFP4_BLOCK, E4M3_SCALE_BYTES = 0.5, 16, 1.0
NVFP4_COPY_BYTES = FP4_BYTES + E4M3_SCALE_BYTES / NVFP4_BLOCK  # one usage of one element, with its block scale

# Quantization of an activation or output gradient, bytes per element beyond its producer's bf16 write: the
# RHT-amax read, the row-wise cast (read, write a copy), the fused RHT column-wise cast (read, write a copy).
NVFP4_CAST_BYTES = BF16_BYTES + 2 * (BF16_BYTES + NVFP4_COPY_BYTES)
# Sequence-parallel all-gathers: (forward input: row-wise copy, backward output gradient: both copies).
NVFP4_TP_GATHER_BYTES = (NVFP4_COPY_BYTES, 2 * NVFP4_COPY_BYTES)
# What the forward keeps of a GEMM input for the wgrad GEMM: the column-wise copy.
NVFP4_SAVED_BYTES = NVFP4_COPY_BYTES
# TE's cached quantized weight (row-wise for fprop, column-wise for dgrad), per weight element of a TE linear.
NVFP4_WEIGHT_CACHE_BYTES = 2 * NVFP4_COPY_BYTES

# NVFP4 GEMM kernel time over the per-tensor fp8 GEMM of the same shape, from Transformer Engine's GEMM profiling
# guide on B300 (te_gemm.TE_PREQUANT_GEMM_MS_B300: FP8 CurrentScaling (2.158, 2.329, 2.325) vs NVFP4 (1.254, 1.305,
# 1.205) ms per layer, fprop/dgrad/wgrad). Achieved 1.81x
# against a 13,125 / 4,500 = 2.9x peak ratio: the kernel, not the tensor-core peak, sets the gain, so the ratio is
# applied as measured on every FP4 GPU and capped by its peak ratio (``cost_models.gemm.matmul_time_s``), as the
# fp8 speed-up is.
NVFP4_GEMM_TIME_RATIO = te_gemm_time_ratio("nvfp4")
