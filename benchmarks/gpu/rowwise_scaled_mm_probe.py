"""Device probe (runs on a GPU machine, PyTorch only): ``torch._scaled_mm`` with row-wise scales against tensor-wise
scales and a bf16 ``mm``, at the per-rank forward GEMM shapes of the held-out torchtitan Float8 runs, and which kernel
each one launches (``torch.profiler`` CUDA kernel names).

The cost model prices torchao's rowwise forward GEMM (``use_fast_accum=True``) at ``knob_effects.
ROWWISE_FWD_GEMM_EFFICIENCY`` = 0.95 of cuBLAS's tensor-wise fp8 GEMM (pytorch#147971: "most shapes within 90-100%
of tensor-wise efficiency, but there's a long tail going down to 50%"). The asyncTP runs' rowwise rows
(tt_asynctp_*_rowwise_*, TP 8 with sequence parallelism: M = local batch x 8192 gathered tokens, N or K one eighth
of the width: wk / wv N = 128) are predicted 13-22% too fast and ordered against their bf16 pairs; their shapes are
the tail's. Decides: (1) whether this PyTorch still runs row-wise scales on the CUTLASS kernel on Hopper (the kernel
names; if it runs cuBLASLt, the ratio says nothing about the 2025 runs' torch); (2) if CUTLASS, the rowwise /
tensorwise time ratio at those shapes, against 1 / 0.95.

Shapes (M, K, N), forward ``x @ w.t()``: Llama 3 8B TP 8 (M 12 x 8192: asyncTP 8B local batch 12), Llama 3 70B TP 8
(M 16 x 8192), Llama 3 8B unsharded (M 8192: the torchao e2e tables, FSDP 8, local batch 1). Median ms of
``probe_common.timed_ms``; about a minute.

Usage: ``python benchmarks/gpu/rowwise_scaled_mm_probe.py OUT.json``.
"""

from __future__ import annotations

import json
import sys

import torch

from probe_common import timed_ms

E4M3 = torch.float8_e4m3fn
SHAPES = {
    # name: (M, K, N)
    "8b_tp8_wq": (98304, 4096, 512), "8b_tp8_wkv": (98304, 4096, 128), "8b_tp8_wo": (98304, 512, 4096),
    "8b_tp8_w13": (98304, 4096, 1792), "8b_tp8_w2": (98304, 1792, 4096),
    "70b_tp8_wq": (131072, 8192, 1024), "70b_tp8_wkv": (131072, 8192, 128), "70b_tp8_wo": (131072, 1024, 8192),
    "70b_tp8_w13": (131072, 8192, 3584), "70b_tp8_w2": (131072, 3584, 8192),
    "8b_wq": (8192, 4096, 4096), "8b_wkv": (8192, 4096, 1024), "8b_wo": (8192, 4096, 4096),
    "8b_w13": (8192, 4096, 14336), "8b_w2": (8192, 14336, 4096),
}
WARMUP, REPS, INNER = 3, 10, 5


def kernels(fn) -> list[str]:
    """CUDA kernel names one call launches."""
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return sorted({e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA})


def main(out_path: str) -> None:
    torch.backends.cuda.matmul.allow_tf32 = False
    result = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "cuda": torch.version.cuda,
              "method": f"median of {REPS} x {INNER} back-to-back calls after {WARMUP} warm-up (CUDA events); "
                        "x [M, K] e4m3 row-major, w [N, K] e4m3 row-major passed as w.t(); bf16 output; "
                        "use_fast_accum=True (torchao's forward); rowwise scales x [M, 1], w [1, N] fp32; tensorwise "
                        "scalar fp32 scales; bf16 = torch.mm of the same shapes",
              "rows": []}
    for name, (m, k, n) in SHAPES.items():
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
        xf, wf = x.to(E4M3), w.to(E4M3)
        one = torch.ones((), device="cuda", dtype=torch.float32)
        sx = torch.rand(m, 1, device="cuda", dtype=torch.float32) + 0.5
        sw = torch.rand(1, n, device="cuda", dtype=torch.float32) + 0.5
        calls = {
            "bf16": lambda: torch.mm(x, w.t()),
            "tensorwise": lambda: torch._scaled_mm(xf, wf.t(), scale_a=one, scale_b=one, out_dtype=torch.bfloat16,
                                                   use_fast_accum=True),
            "rowwise": lambda: torch._scaled_mm(xf, wf.t(), scale_a=sx, scale_b=sw, out_dtype=torch.bfloat16,
                                                use_fast_accum=True),
        }
        row = {"name": name, "m": m, "k": k, "n": n}
        flops = 2.0 * m * k * n
        for label, fn in calls.items():
            try:
                ms = timed_ms(fn, WARMUP, REPS, INNER)
                row[label] = {"ms": round(ms, 4), "tflops": round(flops / ms / 1e9, 1), "kernels": kernels(fn)}
            except Exception as exc:  # noqa: BLE001 - a refused call is a result
                row[label] = {"error": f"{type(exc).__name__}: {str(exc).splitlines()[0][:300]}"}
        if "ms" in row["rowwise"] and "ms" in row["tensorwise"]:
            row["rowwise_over_tensorwise_time"] = round(row["rowwise"]["ms"] / row["tensorwise"]["ms"], 3)
        if "ms" in row["tensorwise"] and "ms" in row["bf16"]:
            row["bf16_over_tensorwise_time"] = round(row["bf16"]["ms"] / row["tensorwise"]["ms"], 3)
        result["rows"].append(row)
        print(json.dumps({k: v for k, v in row.items() if k not in ("bf16", "tensorwise", "rowwise")}
                         | {lab: row[lab].get("tflops", row[lab].get("error")) for lab in calls}), flush=True)
        del x, w, xf, wf
        torch.cuda.empty_cache()
    with open(out_path, "w") as f:
        json.dump(result, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1])
