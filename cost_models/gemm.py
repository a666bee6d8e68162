"""Achieved GEMM and attention throughput (COST_MODEL.md §2: "efficiency is not a constant").

A GEMM ``(m × k) · (k × n)`` runs at ``peak · gemm_max · Π_x x/(x + x½)`` over its three dims ``x`` —
a saturation curve: tiles are under-filled and wave quantization bites as any dim shrinks (TP splits
``n`` or ``k``, small micro-batches shrink ``m``). ``x½ = gemm_half_dim`` is the per-generation dim at
which one factor reaches 1/2 (larger on newer GPUs with bigger tiles). It is bounded below by the memory
roofline: the operands and result must cross HBM once (Williams et al. 2009, "Roofline").
FP8 speeds GEMMs only (``fp8_gemm_speedup`` ≤ peak ratio); attention, norms and element-wise ops stay bf16.
NVFP4 GEMMs run ``1 / NVFP4_GEMM_TIME_RATIO`` times the fp8 speed (TE's measured kernel ratio, ``te_nvfp4``),
capped by the FP4/FP8 peak ratio; operands cross HBM at 0.5 B + one E4M3 scale per 16 elements.
Memory-bound kernels (norms, element-wise ops, softmax, the loss, fp8 casts) take their HBM traffic over the
achieved streaming bandwidth ``hbm_tbytes_per_s · hbm_bus`` (the roofline's memory side; BabelStream-style
copy bandwidth is 0.85–0.9 of the datasheet figure on A100/H100).
"""

from __future__ import annotations

from functools import lru_cache
from statistics import NormalDist

from cost_models.specs import FA2_VS_CUDNN, ClusterSpec, Precision
from cost_models.te_nvfp4 import NVFP4_COPY_BYTES, NVFP4_GEMM_TIME_RATIO

ELEM_BYTES = {"bf16": 2.0, "fp8": 1.0, "nvfp4": NVFP4_COPY_BYTES}


@lru_cache(maxsize=4096)
def expected_max_normal(n: int) -> float:
    """Expected maximum of ``n`` independent standard normal draws (Blom 1958: Φ⁻¹((n − 0.375)/(n + 0.25));
    0 for one draw, 1.42 for 8, 2.33 for 64, 3.4 for 4096)."""
    return NormalDist().inv_cdf((n - 0.375) / (n + 0.25)) if n > 1 else 0.0


def straggler_pace(cluster: ClusterSpec) -> float:
    """Kernel-time multiplier of a synchronous job on ``num_gpus`` GPUs: every step ends in collectives that
    wait for the slowest rank, and identical GPUs do not run at one speed. Sinha et al. (SC'22, "Not All GPUs
    Are Created Equal", arXiv 2208.11035) measured 8% average performance spread (outliers up to 1.5× slower)
    across the identical GPUs of five production clusters of hundreds to tens of thousands of GPUs, from
    manufacturing variability and power management; Llama 3 (arXiv 2407.21783 §3.3.4) reports a 1-2% diurnal
    throughput swing from DVFS on 16k H100. With per-GPU speeds normal of relative spread ``σ =
    gpu_speed_sigma``, the job runs at the expected slowest of ``N``: ``1 + σ · E[max of N standard normals]``."""
    sigma = cluster.efficiency.gpu_speed_sigma
    return 1.0 + sigma * expected_max_normal(cluster.num_gpus) if sigma > 0 else 1.0


def gemm_efficiency(m: float, k: float, n: float, cluster: ClusterSpec) -> float:
    eff = cluster.efficiency
    half = eff.gemm_half_dim
    shape = 1.0
    for x in (m, k, n):
        shape *= x / (x + half)
    return eff.gemm_max * shape


def matmul_time_s(m: float, k: float, n: float, cluster: ClusterSpec, precision: Precision = "bf16") -> float:
    """One GEMM of ``2·m·k·n`` FLOPs (forward shape; backward is two GEMMs of the same size)."""
    if m <= 0 or k <= 0 or n <= 0:
        return 0.0
    gpu, eff = cluster.gpu, cluster.efficiency
    flops = 2.0 * m * k * n
    speedup = min(eff.fp8_gemm_speedup, gpu.peak_fp8_tflops / gpu.peak_bf16_tflops) if precision != "bf16" else 1.0
    if precision == "nvfp4":
        speedup *= min(1.0 / NVFP4_GEMM_TIME_RATIO, fp4_peak_tflops(cluster) / gpu.peak_fp8_tflops)
    compute = flops / (gpu.peak_bf16_tflops * 1e12 * speedup * gemm_efficiency(m, k, n, cluster))
    memory = ELEM_BYTES[precision] * (m * k + k * n + m * n) / (gpu.hbm_tbytes_per_s * 1e12)
    return max(compute, memory) * straggler_pace(cluster)


def fp4_peak_tflops(cluster: ClusterSpec) -> float:
    """The GPU's dense FP4 peak; a ``ValueError`` where it has no FP4 tensor cores (validation refuses such jobs
    first: ``cost_models.validate``)."""
    peak = cluster.gpu.peak_fp4_tflops
    if peak is None:
        raise ValueError(f"{cluster.gpu.name} has no FP4 tensor cores")
    return peak


def attention_time_s(flops: float, cluster: ClusterSpec) -> float:
    """Flash-attention core (always bf16 here): FLOPs at the attention efficiency (cuDNN / TE fused attention;
    FlashAttention-2 at ``FA2_VS_CUDNN`` of it where the stack runs that kernel)."""
    eff = cluster.efficiency
    return _attention_s(flops, cluster, FA2_VS_CUDNN if eff.attention_fa2 and not eff.attention_measures_fa2 else 1.0)


def cudnn_attention_time_s(flops: float, cluster: ClusterSpec) -> float:
    """The core at the generation's cuDNN / TE fused-attention figure whichever kernel its stack runs: what a kernel's
    measured rate over cuDNN's divides (``op_cost.titan_attention_rates``). Where ``attention`` itself measures
    FlashAttention-2 (``attention_measures_fa2``), cuDNN runs 1 / ``FA2_VS_CUDNN`` as fast."""
    eff = cluster.efficiency
    return _attention_s(flops, cluster, 1.0 / FA2_VS_CUDNN if eff.attention_fa2 and eff.attention_measures_fa2 else 1.0)


def _attention_s(flops: float, cluster: ClusterSpec, kernel: float) -> float:
    """FLOPs at the attention efficiency times ``kernel`` (the kernel's throughput over the one it measures)."""
    peak = cluster.gpu.peak_bf16_tflops
    return flops / (peak * 1e12 * cluster.efficiency.attention * kernel) * straggler_pace(cluster)


def hbm_time_s(nbytes: float, cluster: ClusterSpec) -> float:
    """A memory-bound kernel moving ``nbytes`` through HBM (read + write) at the achieved streaming bandwidth."""
    return nbytes / (cluster.gpu.hbm_tbytes_per_s * 1e12 * cluster.efficiency.hbm_bus) * straggler_pace(cluster)
