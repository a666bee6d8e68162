"""Per-GPU efficiency facts (gpus.yaml ``gpu_efficiency``): public micro-benchmarks that measure one GPU against a
sibling of its generation under the same benchmark, and how the catalog's values are made from them.

Blackwell Ultra (GB300, B300) has the same datasheet dense BF16/FP8 peaks as Blackwell (GB200: 2.5 / 5 PFLOP/s;
B300 = B200: 2.25 / 4.5), but a 1400 W TGP against GB200's 1200 W (B300 1100 W vs B200 1000 W) and twice the SFU
exponent throughput (MUFU.EX2: 10.7 vs 5 TeraExponentials/s; NVIDIA, "Inside NVIDIA Blackwell Ultra: The Chip
Powering the AI Factory Era", https://developer.nvidia.com/blog/inside-nvidia-blackwell-ultra-the-chip-powering-the-ai-factory-era/
and "Making Softmax More Efficient with NVIDIA Blackwell Ultra",
https://developer.nvidia.com/blog/making-softmax-more-efficient-with-nvidia-blackwell-ultra/). Both show up in
measurements at equal peaks:

- sustained GEMM throughput (the power budget sets the tensor clock a long GEMM loop runs at): Azure's AI
  benchmarking guide runs the same cuBLASLt FP8 GEMM benchmark (random init, 10,000 warm-up iterations) on
  ND GB200 v6 and ND GB300 v6 — ``SUSTAINED_FP8_GEMM``;
- the fused attention kernel (softmax exponentials on the SFU): NVIDIA's cudnn-frontend SDPA training benchmark,
  GB200 and GB300 in one commit (same cuDNN 9.17, same shape) — ``GB300_ATTENTION_SWEEP`` next to
  ``cost_models.specs.BLACKWELL_ATTENTION_SWEEP``.

It also holds the NVLink 5 collective measurements behind the ``blackwell`` generation's ``link_bus`` / ``nvls_bus``
(``NCCL_ALLREDUCE_BUSBW``: one report measuring H100 and B300 the same way).

``blackwell_ultra_efficiency`` turns them into the GPU's ratios to the ``blackwell`` generation's values;
``tests/test_gpu_facts.py`` recomputes the catalog from it.

NVIDIA's ai-dynamo/aiconfigurator ships GEMM tables measured by one collector on B200, GB200, B300 and GB300 (and
Hopper) for several inference-framework versions: each version is one harness run on every GPU, so their ratios are
the GPUs' relative GEMM throughput at training-size shapes — ``AIC_GEMM_VS_B200`` (benchmarks/aic_gemm.py makes it),
held against the catalog by ``aic_crosscheck``: a cross-check, not a value (it moved the held-out runs the wrong way).

CDNA 3 (MI300X, MI325X) has no measured training run in the calibration set. AMD publishes its Max-Achievable FLOPs
(``AMD_MAF``): hipBLASLt-bench on one large, CU-balanced GEMM per precision, both GPUs, the same benchmark —
``cdna3_gemm_efficiency`` makes the ``cdna3`` generation's ``gemm_max`` / ``fp8_gemm_speedup`` from MI300X's through
the model's own GEMM curve, and ``mi325x_efficiency`` MI325X's sustained ratio to it (equal datasheet peaks, a 1000 W
vs 750 W board power: the GB300/GB200 case).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from cost_models.specs import ATTENTION_REF_KEYS, BLACKWELL_ATTENTION_SWEEP  # noqa: E402

# cuBLASLt FP8 GEMM, TFLOP/s, (m, n, k) -> (ND GB200 v6, ND GB300 v6). Azure/AI-benchmarking-guide
# Azure_Results/ND_GB200_v6_results.md @ 2a370be (CUDA 12.8, driver 570.133.20) and egmsft/AI-benchmarking-guide
# Azure_Results/ND_GB300_v6_results.md @ 18e80a2 (CUDA 13.0, driver 580.82.07), "GEMM CuBLASLt (FP8)" tables
# (Benchmarks/GEMMCublasLt.py): random initialization, 10,000 warm-up iterations.
SUSTAINED_FP8_GEMM: dict[tuple[int, int, int], tuple[float, float]] = {
    (1024, 1024, 1024): (489.2, 553.5),
    (2048, 2048, 2048): (2243.6, 2288.9),
    (4096, 4096, 4096): (2834.6, 3257.0),
    (8192, 8192, 8192): (2876.6, 3286.3),
    (16384, 16384, 16384): (2906.9, 3308.5),
    (32768, 32768, 32768): (2825.6, 3271.3),
    (1024, 2145, 1024): (1022.2, 1115.1),
    (6144, 12288, 12288): (2895.6, 3279.5),
    (802816, 192, 768): (1459.5, 1717.1),
}
# Shapes whose every dim is >= this run on the plateau on both GPUs (the training GEMMs' regime): the sustained
# ratio is their mean. Smaller / skinny shapes measure launch and tile quantization, not the power budget.
PLATEAU_DIM = 4096

# GEMM throughput over B200's in NVIDIA's own same-harness tables: ai-dynamo/aiconfigurator @ 095f58a51c4c
# (aic-core/src/aiconfigurator_core/systems/data/<system>/gemm/<framework>/<version>/gemm_perf.parquet), GPU -> dtype
# -> harness -> geometric mean over the shapes with every dim >= PLATEAU_DIM of B200's latency / the GPU's (n = 675-693
# shapes per harness). Made by benchmarks/aic_gemm.py from a checkout of that commit. A cross-check
# (``aic_crosscheck``): applied as per-GPU gemm_max scales over B200's (s34: GB200 0.973, B300 1.0637, GB300 1.1024;
# the MoE host cost and the SSD rate refitted) they put the same-recipe GPU pairs of benchmarks/heldout.py 12% closer,
# but the 324 held-out runs 12.42% -> 12.63% MAPE (GB300 dense +5.8% -> +8.5% slow, Nemotron 3 Super B300 +30% ->
# +34%): not adopted.
AIC_GEMM_VS_B200: dict[str, dict[str, dict[str, float]]] = {
    "gb200": {
        "bf16": {"sglang/0.5.10": 1.07, "sglang/0.5.14": 1.049, "sglang/0.5.9": 1.065, "trtllm/1.3.0rc10": 1.102,
                 "trtllm/1.3.0rc20": 1.055, "vllm/0.19.0": 1.094, "vllm/0.22.0": 1.121, "vllm/0.24.0": 0.847},
        "fp8": {"sglang/0.5.10": 1.108, "sglang/0.5.14": 1.094, "sglang/0.5.9": 1.11, "trtllm/1.3.0rc10": 1.077,
                "trtllm/1.3.0rc20": 1.052, "vllm/0.19.0": 1.152, "vllm/0.24.0": 1.095},
    },
    "b300": {
        "bf16": {"sglang/0.5.10": 1.07, "sglang/0.5.9": 1.045, "trtllm/1.3.0rc10": 1.05, "trtllm/1.3.0rc20": 1.035,
                 "vllm/0.19.0": 1.063, "vllm/0.24.0": 1.058},
        "fp8": {"sglang/0.5.10": 1.085, "sglang/0.5.9": 1.077, "trtllm/1.3.0rc10": 1.055, "trtllm/1.3.0rc20": 1.052,
                "vllm/0.19.0": 1.077, "vllm/0.24.0": 1.07},
    },
    "gb300": {
        "bf16": {"sglang/0.5.10": 1.247, "sglang/0.5.14": 1.238, "sglang/0.5.9": 1.234, "trtllm/1.3.0rc10": 1.269,
                 "trtllm/1.3.0rc20": 1.257, "vllm/0.19.0": 1.234, "vllm/0.24.0": 1.229},
        "fp8": {"sglang/0.5.10": 1.293, "sglang/0.5.14": 1.285, "sglang/0.5.9": 1.291, "trtllm/1.3.0rc10": 1.212,
                "trtllm/1.3.0rc20": 1.21, "vllm/0.19.0": 1.186, "vllm/0.24.0": 1.196},
    },
}

# cuDNN SDPA, bf16, causal, batch 1, 128 query / 8 KV heads, head dim 128 (Llama 3.1 405B's shape), cuDNN 9.17
# (cudnn-frontend 1.17): tokens -> (forward, backward) TFLOP/s on GB300. NVIDIA/cudnn-frontend
# benchmark/sdpa_benchmark_training/artifacts/sdpa_bf16_benchmark_results_NVIDIA_GB300.csv @ d48a60e (2025-12-19),
# rows "1,N,N,128,8,128,True,cudnn_fe" — the same commit, shape and cuDNN as BLACKWELL_ATTENTION_SWEEP's GB200 file.
GB300_ATTENTION_SWEEP: tuple[str, dict[int, tuple[float, float]]] = ("gb300", {
    4096: (1682.0, 1110.0), 8192: (1899.0, 1292.0), 16384: (1978.0, 1399.0),
    32768: (2007.0, 1438.0), 65536: (1951.0, 1399.0), 131072: (1821.0, 1360.0),
})

# cuDNN SDPA at head dim 64 against head dim 128, one GPU, one cuDNN (9.19.1, cudnn-frontend 1.19.0), bf16,
# non-deterministic backward, 64 query / 8 KV heads: NVIDIA/cudnn-frontend
# benchmark/sdpa_benchmark_training/results/<gpu>_919_only_cudnn/ @ afa9f7c (2026-03-09; removed in 50c8aeb):
# gpt_oss_*.csv "gpt_oss,...,bfloat16,top_left,2,8192,8192,64,8,64,64,both,False" (batch 2, causal with a 1024-token
# sliding window, sliding_window_size 1024) and llama3.1_*.csv "llama3.1,...,bfloat16,top_left,1,2048,2048,64,8,128,128,
# both,False" (batch 1, causal 2048 tokens): both kernels see ~1000 keys per query (960 and 1024.5; the benchmark
# counts only unmasked scores, as the model does; backward FLOPs 2.5x the forward's, benchmark_single_sdpa.py flops()).
# gpu -> ((tokens, window, fwd, bwd) at d 64, (tokens, fwd, bwd) at d 128), TFLOP/s.
ATTENTION_HEAD_DIM_BENCH: dict[str, tuple[tuple[int, int, float, float], tuple[int, float, float]]] = {
    "h200": ((8192, 1024, 349.0, 300.0), (2048, 484.0, 370.0)),
    "gb200": ((8192, 1024, 609.0, 646.0), (2048, 1042.0, 836.0)),
    "gb300": ((8192, 1024, 718.0, 668.0), (2048, 1266.0, 906.0)),
}
# The d-128 causal kernel's sequence sweep from the same 9.19.1 files (llama3.1_*.csv rows "llama3.1,llama3.1,cudnn,
# bfloat16,top_left,1,N,N,64,8,128,128,both,False", N = 2048..32768; the 2048 row is ATTENTION_HEAD_DIM_BENCH's d-128
# row): gpu -> tokens -> (fwd, bwd) TFLOP/s. Its a·x/(x + h) fit (``attention_half_keys``) sets the catalog's
# ``attention_half_keys`` (blackwell: GB200's; gb300 / b300: GB300's): x/(x + h) follows every point within 2% (GB200
# h 837, GB300 777; H200 618, not used: hopper has no saturation field). The older cuDNN 9.17 sweep
# (cost_models.specs.BLACKWELL_ATTENTION_SWEEP, 128 query heads) fitted on 4k-128k gave 334 / 486: its 64k-128k points
# fall (0.50 of peak at 128k vs 0.57 at 32k), which a rising x/(x + h) can only meet with a small h; on 4k-32k alone
# it gives 648 / 676, and its own 2k row (736 TFLOP/s fwd+bwd) sits 1.44x below the 334 curve.
ATTENTION_SWEEP_919: dict[str, dict[int, tuple[float, float]]] = {
    "h200": {2048: (484.0, 370.0), 4096: (591.0, 474.0), 8192: (644.0, 541.0), 16384: (673.0, 579.0),
             32768: (688.0, 581.0)},
    "gb200": {2048: (1042.0, 836.0), 4096: (1335.0, 1132.0), 8192: (1598.0, 1311.0), 16384: (1687.0, 1402.0),
              32768: (1720.0, 1473.0)},
    "gb300": {2048: (1266.0, 906.0), 4096: (1672.0, 1195.0), 8192: (1887.0, 1385.0), 16384: (1968.0, 1490.0),
              32768: (2014.0, 1549.0)},
}
# Cross-checks (not used to make a value): FlashAttention-3 (Shah et al. 2024, arXiv 2407.08608) Fig. 5, H100, cuDNN
# forward, non-causal, 4k / 16k tokens: d 64 408 / 413, d 128 609 / 595 TFLOP/s (0.67 / 0.69, forward only, whose
# ratio the 9.19.1 H200 rows above share: 349/484 = 0.72); and the GPT-OSS shape with its own 128-token window on
# Blackwell, cuDNN 9.22 (cudnn-frontend 1.21.1), batch 2, 128 MHA heads, d 64, 8192 tokens (127 keys per query):
# results/gpt_oss/<gpu>/gpt_oss_20260424_*.csv @ fb682ce (2026-04-29) — gpu -> (fwd, bwd) TFLOP/s. The kernel skips
# the masked tiles (its time is linear in the tokens: GB200 fwd 0.109 / 0.210 / 0.414 / 0.822 ms at 2k-16k) and runs
# near the causal d-128 kernel's saturation x/(x + attention_half_keys) (``swa128_crosscheck``): measured 0.129 / 0.124 of
# the d-128 8k kernel's fwd+bwd throughput, the model's curve times the d-64 factor 0.116 / 0.118 (the 2k-32k fit,
# h 837 / 777; the former 4k-128k cuDNN 9.17 fit, h 334 / 486, said 0.217 / 0.164: 1.68x / 1.32x too fast).
SWA128_D64_BENCH: dict[str, tuple[float, float]] = {"gb200": (165.0, 187.0), "gb300": (172.0, 198.0)}
# The d-128 causal reference of that commit, same GPUs and cuDNN, 8192 tokens, batch 2, 64 query / 8 KV heads
# (results/llama3.1/<gpu>/llama3.1_20260424_*.csv @ fb682ce): gpu -> (fwd, bwd) TFLOP/s.
D128_8K_BENCH_922: dict[str, tuple[float, float]] = {"gb200": (1574.0, 1332.0), "gb300": (1856.0, 1435.0)}

# nccl-tests all_reduce_perf bus bandwidth, GB/s, one 8-GPU NVSwitch node: GPU -> (NVLS off = ring, NVLS on).
# NVIDIA/nccl#2140 (2026-04-28, NCCL 2.30.4+cuda13.1), one reporter, both systems: 8x H100 370 -> 480 (hopper's
# catalog link_bus / nvls_bus, measured earlier, are exactly these), 8x B300 695 -> 845. Blackwell's NVLink 5 (18
# links x 50 GB/s per direction) and NVLink-SHARP switch are the same on B200/GB200/B300/GB300: one generation value.
NCCL_ALLREDUCE_BUSBW: dict[str, tuple[float, float]] = {"h100-sxm": (370.0, 480.0), "b300": (695.0, 845.0)}
# Cross-checks of the Blackwell pair (not used to make the values): Azure AI-benchmarking-guide ND GB200 v6 / ND GB300
# v6 "NCCL AllReduce (Ring algorithm)", 4 GPUs of one compute tray over the NVLink switch, 8 GB in place: 679.61 /
# 680.45 GB/s (NCCL 2.25.1); NVIDIA/nccl#1807: 8x B200, NCCL 2.27.1, default algorithm, "830+".
NCCL_RING_ALLREDUCE_CROSSCHECK: dict[str, float] = {"gb200": 679.61, "gb300": 680.45}

# nccl-tests alltoall_perf, out-of-place busbw (= algbw·(n−1)/n, nccl-tests src/alltoall.cu AlltoAllGetBw; the bytes
# a rank sends to its n−1 peers over the time, which is what ep_comm / collectives price at link·link_bus·a2a_link_ratio), one
# NVLink domain, the largest size each run printed: (gpu, ranks, bytes per rank, busbw GB/s, NCCL, source).
# OCI = oracle-quickstart/oci-gpu-quickstarts @ 6a0abdc (2026-04-10), nvidia/<GPU>/README-<GPU>.md "NCCL All-to-All"
# sections (smaller sizes truncated there): GB200 NVL72 (NCCL 2.27.3, per the page's all-reduce runs) 1 tray / 2 trays
# / 16 trays of one rack; GB300 NVL72 (NCCL 2.28.7) the same; B300 HGX (NCCL 2.28.9) one node. NVIDIA/nccl#2169
# (2026-05-11): 4x H100 80GB HBM3 of one node, NCCL 2.30.4, 524288000 B (the reporter's point: busbw falls 12-15%
# above 512 MiB; 500 MiB is below it). Rank count moves it little (GB200 4 / 8 / 64 ranks: 0.68 / 0.74 / 0.69 of 900).
OCI_GPU_QUICKSTARTS = "https://github.com/oracle-quickstart/oci-gpu-quickstarts/blob/6a0abdc/nvidia"
NCCL_ALLTOALL_NVLINK: tuple[tuple[str, int, int, float, str, str], ...] = (
    ("gb200", 4, 8589934592, 615.30, "2.27.3", f"{OCI_GPU_QUICKSTARTS}/GB200/README-GB200.md"),
    ("gb200", 8, 17179869184, 662.27, "2.27.3", f"{OCI_GPU_QUICKSTARTS}/GB200/README-GB200.md"),
    ("gb200", 64, 8589934592, 622.92, "2.27.3", f"{OCI_GPU_QUICKSTARTS}/GB200/README-GB200.md"),
    ("gb300", 4, 17179869184, 627.69, "2.28.7", f"{OCI_GPU_QUICKSTARTS}/GB300/README-GB300.md"),
    ("gb300", 8, 17179869184, 685.06, "2.28.7", f"{OCI_GPU_QUICKSTARTS}/GB300/README-GB300.md"),
    ("gb300", 64, 17179869184, 666.92, "2.28.7", f"{OCI_GPU_QUICKSTARTS}/GB300/README-GB300.md"),
    ("b300", 8, 8589934592, 675.55, "2.28.9", f"{OCI_GPU_QUICKSTARTS}/B300/README-B300.md"),
    ("h100-sxm", 4, 524288000, 334.90, "2.30.4", "https://github.com/NVIDIA/nccl/issues/2169"),
)
# The same pages' all-to-alls across NVLink domains (not used to make a value; ``alltoall_nic_crosscheck``): (gpu,
# ranks, domains, bytes, algbw GB/s, NIC Gb/s per GPU, source). Megatron's alltoall dispatcher (and NCCL's alltoall)
# sends (d−1)/d of a rank's bytes to other domains, each GPU through its own NIC (sjeaugey, NVIDIA/nccl-tests#130,
# #267: "alltoall cannot aggregate the bandwidth of multiple NICs"), so NIC rate = algbw·(d−1)/d. GB200: 4 x 400 Gb/s
# IB per 4-GPU tray (the page's NCCL_IB_HCA list); B300: 8 x 2 x 400 Gb/s RoCE per node (CX-8, 800 Gb/s per GPU);
# GB300: 8 x 400 Gb/s RoCE per 4-GPU tray.
NCCL_ALLTOALL_ACROSS_DOMAINS: tuple[tuple[str, int, int, int, float, float, str], ...] = (
    ("b300", 16, 2, 8589934592, 193.04, 800.0, f"{OCI_GPU_QUICKSTARTS}/B300/README-B300.md"),
    ("gb200", 128, 2, 8589934592, 90.40, 400.0, f"{OCI_GPU_QUICKSTARTS}/GB200/README-GB200.md"),
    ("gb200", 192, 3, 8589934592, 62.82, 400.0, f"{OCI_GPU_QUICKSTARTS}/GB200/README-GB200.md"),
    ("gb300", 128, 2, 17179869184, 48.04, 800.0, f"{OCI_GPU_QUICKSTARTS}/GB300/README-GB300.md"),
)

# B200's HBM bandwidth from its memory bus as the CUDA 13 driver reports it (cudaDeviceProp.memoryBusWidth 7680 bits;
# nvidia-smi clocks.max.memory 3996 MHz; HBM3e moves two transfers per clock): pytorch/ao#4002 (2026-03-05),
# torchao/testing/training/roofline_utils.py @ df68b8253 "NVIDIA B200" peak_mem_bw_bytes_sec. The datasheet's 8 TB/s is
# the 8192-bit width older drivers reported. (gpu, bus width bits, memory clock MHz, source)
MEMORY_BUS: tuple[tuple[str, int, int, str], ...] = (
    ("b200", 7680, 3996, "https://github.com/pytorch/ao/pull/4002"),
)


def hbm_tbytes_per_s(bus_width_bits: int, memory_clock_mhz: int) -> float:
    """Peak HBM bandwidth, TB/s: bus width in bytes x memory clock x 2 (double data rate)."""
    return bus_width_bits / 8 * memory_clock_mhz * 1e6 * 2 / 1e12


# BF16 GEMM on B300, autocast mode (BF16 has no quantization), Fprop rows of TE's GEMM profiling guide, M = 31 x 512
# tokens: NVIDIA/TransformerEngine docs/examples/gemm_profiling/gemm_profiling.rst @ 1609c890e (TE#2863), "GEMM
# Benchmark (Model Config Mode) on NVIDIA B300 SXM6 AC": (m, k, n) -> ms. A cross-check of the generation's GEMM curve
# (``gemm_crosscheck``), not used to make a value.
B300_TE_BF16_GEMM_MS: dict[tuple[int, int, int], float] = {
    (15872, 4096, 12288): 1.071, (15872, 4096, 4096): 0.307, (15872, 4096, 16384): 1.393, (15872, 16384, 4096): 1.426,
}


# AMD Max-Achievable FLOPs, TFLOP/s, hipBLASLt-bench (trig_float input, rotating 512 MB buffers, ROCm 6.3.0, hipBLASLt
# db8e93b4fd6): precision -> ((m, n, k), MI300X (750 W), MI325X (1000 W)). ROCm/rocm-blogs
# blogs/software-tools-optimization/measuring-max-achievable-flops-part2/README.md (AMD, 2025; "AMD MAF Results", Table
# 1, and Appendix B's commands for the shapes: BF16 m 4096 n 4864 k 32896, FP8 m 4096 n 3648 k 32896). Table 1's FP8
# MI300X figure (1273 at 1230 MHz) is used; its footnote 4 prints 1223.6 at 1273 MHz (the figures look swapped:
# FP8/BF16 1.73 instead of 1.80; the MI325X footnote agrees with its table to 0.6%).
AMD_MAF: dict[str, tuple[tuple[int, int, int], float, float]] = {
    "bf16": ((4096, 4864, 32896), 708.0, 843.0),
    "fp8": ((4096, 3648, 32896), 1273.0, 1519.0),
}


def cdna3_gemm_efficiency(gemm_half_dim: float) -> dict[str, float]:
    """The ``cdna3`` generation's ``gemm_max`` and ``fp8_gemm_speedup`` from MI300X's Max-Achievable FLOPs
    (``AMD_MAF``): the values at which the model's GEMM curve (peak · gemm_max · Π x/(x + ``gemm_half_dim``) ·
    speed-up, cost_models/gemm.py) runs AMD's BF16 and FP8 shapes at the measured throughput. The half-dim is the
    generation's prior (no public MI300X shape sweep is used here): a larger one would raise gemm_max."""
    from autoplan.catalog.registry import load_gpu

    peak = load_gpu("mi300x").peak_bf16_tflops

    def shape(dims: tuple[int, int, int]) -> float:
        out = 1.0
        for x in dims:
            out *= x / (x + gemm_half_dim)
        return out

    (bf16_dims, bf16, _), (fp8_dims, fp8, _) = AMD_MAF["bf16"], AMD_MAF["fp8"]
    gemm_max = bf16 / peak / shape(bf16_dims)
    return {"gemm_max": gemm_max, "fp8_gemm_speedup": fp8 / peak / shape(fp8_dims) / gemm_max}


def mi325x_efficiency() -> dict[str, Any]:
    """gpus.yaml ``gpu_efficiency`` for MI325X over ``cdna3`` (MI300X's figures): its sustained GEMM throughput over
    MI300X's in the same benchmark at equal datasheet peaks (1307 / 2615 TFLOP/s), mean of the BF16 and FP8 shapes —
    a power budget (1000 vs 750 W) sets the sustained clock (1447 vs 1207 MHz BF16), every GEMM, as GB300's."""
    ratios = [b / a for _, a, b in AMD_MAF.values()]
    return {"scale": {"gemm_max": round(sum(ratios) / len(ratios), 4)}}


def gemm_crosscheck() -> list[tuple[str, str, float, float]]:
    """(GPU, shape, measured, model) TFLOP/s: the catalog's GEMM curve (cost_models.gemm.matmul_time_s, the GPU's
    efficiencies as build_cluster gives them) against the sustained micro-benchmarks above."""
    from autoplan.catalog import build_cluster
    from cost_models.gemm import matmul_time_s

    rows = []
    for i, gpu in enumerate(("gb200", "gb300")):
        c = build_cluster(gpu, 8)
        for (m, n, k), tflops in SUSTAINED_FP8_GEMM.items():
            rows.append((gpu, f"fp8 {m}x{n}x{k}", tflops[i], 2 * m * n * k / matmul_time_s(m, k, n, c, "fp8") / 1e12))
    c = build_cluster("b300", 8)
    for (m, k, n), ms in B300_TE_BF16_GEMM_MS.items():
        rows.append(("b300", f"bf16 {m}x{k}x{n}", 2 * m * k * n / ms / 1e9, 2 * m * k * n / matmul_time_s(m, k, n, c) / 1e12))
    return rows


def nvlink_bus_efficiency(gpu: str) -> tuple[float, float]:
    """(link_bus, nvls_bus) of ``gpu``'s generation: ring and NVLS all-reduce busbw over the nominal per-direction
    NVLink bandwidth (``NCCL_ALLREDUCE_BUSBW``)."""
    from autoplan.catalog.registry import load_gpu

    ring, nvls = NCCL_ALLREDUCE_BUSBW[gpu]
    link = load_gpu(gpu).link_gbytes_per_s
    return ring / link, nvls / link


def alltoall_link_efficiency(generation: str) -> float:
    """NCCL all-to-all busbw / nominal NVLink of ``generation``: the mean of its ``NCCL_ALLTOALL_NVLINK`` rows' busbw
    over the row GPU's nominal per-direction NVLink bandwidth (``alltoall_ring_ratio`` over the ring's)."""
    from autoplan.catalog.registry import load_gpu

    shares = [busbw / load_gpu(gpu).link_gbytes_per_s for gpu, _, _, busbw, _, _ in NCCL_ALLTOALL_NVLINK
              if load_gpu(gpu).generation == generation]
    if not shares:
        raise ValueError(f"no all-to-all row for generation {generation!r}")
    return sum(shares) / len(shares)


def alltoall_ring_ratio(generation: str) -> float:
    """``Efficiency.a2a_link_ratio`` of ``generation``: its all-to-all busbw share (``alltoall_link_efficiency``) over
    its ring all-reduce's, the catalog's ``link_bus`` (``NCCL_ALLREDUCE_BUSBW``): the all-to-all is priced at
    link·link_bus·ratio, so it follows a profile's or calibration's link_bus."""
    from autoplan.catalog.registry import efficiency_for

    return alltoall_link_efficiency(generation) / efficiency_for(generation).link_bus


def alltoall_nic_crosscheck() -> list[tuple[str, int, int, float]]:
    """(GPU, ranks, domains, achieved / line rate) of each ``NCCL_ALLTOALL_ACROSS_DOMAINS`` row: the per-GPU NIC rate
    algbw·(d−1)/d over the NIC's line rate, to hold against the catalog's ``nic_bus``."""
    return [(gpu, n, d, algbw * (d - 1) / d / (gbps / 8))
            for gpu, n, d, _, algbw, gbps, _ in NCCL_ALLTOALL_ACROSS_DOMAINS]


def sustained_gemm_ratio() -> float:
    """GB300 / GB200 sustained FP8 GEMM throughput on the plateau shapes (mean of the per-shape ratios)."""
    ratios = [b / a for (m, n, k), (a, b) in SUSTAINED_FP8_GEMM.items() if min(m, n, k) >= PLATEAU_DIM]
    return sum(ratios) / len(ratios)


def median_ratio(gpu: str, dtype: str) -> float:
    """``gpu``'s ``dtype`` GEMM throughput over B200's: the median over the harnesses of ``AIC_GEMM_VS_B200`` (one
    harness's outlier, e.g. vllm 0.24.0's GB200 bf16 table at 0.85, does not move it)."""
    from statistics import median

    return float(median(AIC_GEMM_VS_B200[gpu][dtype].values()))


def aic_gemm_ratio(gpu: str) -> float:
    """``gpu``'s GEMM throughput over B200's: the geometric mean of bf16's and fp8's ``median_ratio`` (the per-GPU
    scale serves both: fp8 runs at the generation's ``fp8_gemm_speedup`` over bf16)."""
    return (median_ratio(gpu, "bf16") * median_ratio(gpu, "fp8")) ** 0.5


def aic_crosscheck() -> list[tuple[str, float, float]]:
    """(GPU, measured, priced) GEMM throughput over B200's on the plateau: ``aic_gemm_ratio`` against the catalog's
    (datasheet peak x ``gemm_max`` of the GPU over B200's, bf16 and fp8 alike). Not used to make a value: applied as
    per-GPU scales (s34) they moved the held-out runs the other way (see ``AIC_GEMM_VS_B200``)."""
    from autoplan.catalog import build_cluster

    ref = build_cluster("b200", 8)
    rows = []
    for gpu in AIC_GEMM_VS_B200:
        c = build_cluster(gpu, 8)
        priced = (c.gpu.peak_bf16_tflops * c.efficiency.gemm_max) / (ref.gpu.peak_bf16_tflops * ref.efficiency.gemm_max)
        rows.append((gpu, aic_gemm_ratio(gpu), priced))
    return rows


def attention_share_ratio() -> float:
    """GB300 / GB200 fused-attention kernel share of peak (fwd + 2.5x bwd FLOPs) at the reference length (8k
    tokens = ATTENTION_REF_KEYS keys per query), same benchmark commit; both GPUs' datasheet peaks are 2500."""
    from benchmarks.fidelity import kernel_share
    from autoplan.catalog.registry import load_gpu

    tokens = int(2 * ATTENTION_REF_KEYS)
    (g0, s0), (g1, s1) = BLACKWELL_ATTENTION_SWEEP, GB300_ATTENTION_SWEEP
    return (kernel_share(*s1[tokens], load_gpu(g1).peak_bf16_tflops)
            / kernel_share(*s0[tokens], load_gpu(g0).peak_bf16_tflops))


def swa_keys_per_query(tokens: int, window: int | None) -> float:
    """Unmasked scores per query of a top-left causal kernel with a ``window``-key band (None: plain causal), as the
    cudnn-frontend benchmark counts them (benchmark_single_sdpa.py flops())."""
    w = window if window is not None and window < tokens else tokens
    return (w * (w + 1) / 2 + (tokens - w) * w) / tokens


def attention_half_keys(gpu: str) -> float:
    """``Efficiency.attention_half_keys`` from ``ATTENTION_SWEEP_919``: h of a·x/(x + h) fitted to the GPU's cuDNN
    9.19.1 d-128 causal sweep, 2k-32k tokens, fwd + 2.5x bwd (benchmarks/fidelity.py attention_half_keys_fit)."""
    from autoplan.catalog.registry import load_gpu
    from benchmarks.fidelity import attention_half_keys_fit

    return attention_half_keys_fit(ATTENTION_SWEEP_919[gpu], load_gpu(gpu).peak_bf16_tflops)[1]


def _half_keys(gpu: str) -> float:
    """The GPU's catalog saturation in keys per query (hopper has none: ATTN_HALF_KEYS, the H100 FA3 fit)."""
    from autoplan.catalog.registry import efficiency_for_gpu
    from cost_models.attention_cost import ATTN_HALF_KEYS

    return efficiency_for_gpu(gpu).attention_half_keys or ATTN_HALF_KEYS


def attention_d64_ratio(gpu: str) -> float:
    """``Efficiency.attention_d64`` from ``ATTENTION_HEAD_DIM_BENCH``: the d-64 kernel's fwd+bwd throughput over the
    d-128 kernel's, the latter moved to the d-64 row's keys per query on the GPU's own saturation x/(x + h) (960 vs
    1024.5 keys: a 1-2% correction)."""
    from benchmarks.fidelity import kernel_share

    (t64, window, f64, b64), (t128, f128, b128) = ATTENTION_HEAD_DIM_BENCH[gpu]
    x64, x128 = swa_keys_per_query(t64, window), swa_keys_per_query(t128, None)
    h = _half_keys(gpu)
    at_x64 = kernel_share(f128, b128, 1.0) * (x64 / (x64 + h)) / (x128 / (x128 + h))
    return kernel_share(f64, b64, 1.0) / at_x64


def swa128_crosscheck() -> list[tuple[str, float, float]]:
    """(GPU, measured, model) throughput of GPT-OSS's 128-token-window d-64 kernel as a share of the same commit's
    d-128 causal kernel at 8k tokens (fwd + 2.5x bwd): the model's is its saturation x/(x + h) at 127 vs 4096.5 keys
    per query times the d-64 factor (attention_cost.head_dim_factor)."""
    from autoplan.catalog import build_cluster
    from autoplan.catalog.registry import catalog_model
    from benchmarks.fidelity import kernel_share
    from cost_models.attention_cost import head_dim_factor

    rows = []
    x, ref = swa_keys_per_query(8192, 128), swa_keys_per_query(8192, None)
    for gpu, (fwd, bwd) in SWA128_D64_BENCH.items():
        h = _half_keys(gpu)
        model = (x / (x + h)) / (ref / (ref + h)) / head_dim_factor(catalog_model("gpt-oss-120b"), build_cluster(gpu, 8))
        rows.append((gpu, kernel_share(fwd, bwd, 1.0) / kernel_share(*D128_8K_BENCH_922[gpu], 1.0), model))
    return rows


def blackwell_ultra_efficiency() -> dict[str, dict[str, Any]]:
    """gpus.yaml ``gpu_efficiency`` for GB300 and B300 over the ``blackwell`` generation (whose GEMM and attention
    figures stand for GB200/B200), ratios under ``scale``:

    - gb300 ``gemm_max`` × ``sustained_gemm_ratio`` (every GEMM: the sustained tensor clock is the power budget's,
      bf16 as fp8; the GEMM benchmark is FP8, the only precision Azure ran on both);
    - gb300 ``attention`` × ``attention_share_ratio`` and its own ``attention_half_keys`` (the same x/(x + h) fit
      to its own cuDNN 9.19.1 sweep that makes Blackwell's from GB200's, ``attention_half_keys``);
    - gb300 its own ``attention_d64`` (``attention_d64_ratio``; the generation's is GB200's);
    - b300: the attention facts only — the same Blackwell Ultra SM (2x SFU), measured on GB300; no B300-vs-B200
      GEMM benchmark is public, so its GEMMs stay the generation's (a prior, as B200's)."""
    half = attention_half_keys("gb300")
    attention = round(attention_share_ratio(), 4)
    d64 = round(attention_d64_ratio("gb300"), 3)
    return {
        "gb300": {"scale": {"gemm_max": round(sustained_gemm_ratio(), 4), "attention": attention},
                  "attention_half_keys": round(half), "attention_d64": d64},
        "b300": {"scale": {"attention": attention}, "attention_half_keys": round(half), "attention_d64": d64},
    }


if __name__ == "__main__":
    print(f"sustained FP8 GEMM GB300/GB200: {sustained_gemm_ratio():.4f}; "
          f"attention kernel share GB300/GB200 at 8k: {attention_share_ratio():.4f}")
    print("GEMM throughput over B200's, aiconfigurator's same-harness tables vs the catalog: "
          + ", ".join(f"{g} {m:.4f} vs {p:.4f}" for g, m, p in aic_crosscheck()))
    for name, fields in blackwell_ultra_efficiency().items():
        print(f"  {name}: {fields}")
    print("attention_d64 (cuDNN 9.19.1, d 64 / d 128 at ~1000 keys per query): "
          + ", ".join(f"{g} {attention_d64_ratio(g):.3f}" for g in ATTENTION_HEAD_DIM_BENCH))
    print("GPT-OSS 128-window d-64 kernel / d-128 causal 8k kernel (cuDNN 9.22): "
          + ", ".join(f"{g} measured {m:.3f} model {p:.3f}" for g, m, p in swa128_crosscheck()))
    print("NCCL alltoall busbw / nominal NVLink: "
          + ", ".join(f"{g} {alltoall_link_efficiency(g):.4f} (/ link_bus: a2a_link_ratio {alltoall_ring_ratio(g):.4f})"
                      for g in ("hopper", "blackwell")))
    print("alltoall across domains, NIC rate / line rate: "
          + ", ".join(f"{g} {n} ranks / {d} domains {r:.3f}" for g, n, d, r in alltoall_nic_crosscheck()))
    from autoplan.catalog.registry import efficiency_for

    print(f"cdna3 from AMD's MI300X MAF (half-dim {efficiency_for('cdna3').gemm_half_dim:g}): "
          f"{ {k: round(v, 4) for k, v in cdna3_gemm_efficiency(efficiency_for('cdna3').gemm_half_dim).items()} }; "
          f"mi325x: {mi325x_efficiency()}")
    print("\n| GPU | GEMM | measured TFLOP/s | model | model / measured |\n|---|---|---:|---:|---:|")
    for gpu, shape, measured, model in gemm_crosscheck():
        print(f"| {gpu} | {shape} | {measured:.0f} | {model:.0f} | {model / measured:.3f} |")
