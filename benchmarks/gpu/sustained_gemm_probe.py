"""Device probe (runs on a GPU machine, PyTorch only): bf16 GEMM throughput held for ``SECONDS`` without pause, per
window of ``WINDOW_S``, with the SM clock, power and temperature nvidia-smi reads after each window, to see whether
a GPU kept busy as in training slows below the throughput short kernel benchmarks report (power / thermal limits).

Usage: ``python benchmarks/gpu/sustained_gemm_probe.py OUT.json``.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time

import torch

SECONDS, WINDOW_S = 30.0, 1.0
SHAPES = [(8192, 8192, 8192), (4096, 2048, 1536)]  # a large dense GEMM; a Qwen3-30B expert fc1 at 4096 rows


def smi() -> str:
    try:
        return subprocess.run(["nvidia-smi", "--query-gpu=clocks.sm,power.draw,temperature.gpu",
                               "--format=csv,noheader,nounits"], capture_output=True, text=True, timeout=10).stdout.strip()
    except Exception as exc:  # noqa: BLE001
        return f"unavailable: {exc}"


def sustained(m: int, k: int, n: int, seconds: float) -> list[dict]:
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
    flops = 2.0 * m * k * n
    for _ in range(10):
        x @ w.t()
    torch.cuda.synchronize()
    windows, t_end = [], time.time() + seconds
    while time.time() < t_end:
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        count, start = 0, time.time()
        a.record()
        while time.time() - start < WINDOW_S:
            for _ in range(50):
                x @ w.t()
            count += 50
            if count % 500 == 0:
                torch.cuda.synchronize()  # keep the host within a few hundred launches of the device
        b.record()
        torch.cuda.synchronize()
        windows.append({"t_s": round(time.time() - (t_end - seconds), 2),
                        "tflops": flops * count / (a.elapsed_time(b) / 1e3) / 1e12, "smi": smi()})
    return windows


def main(out_path: str) -> None:
    torch.backends.cuda.matmul.allow_tf32 = False
    result = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "idle": smi(),
              "method": f"bf16 x @ w.t() back to back for {SECONDS} s per shape; TFLOP/s per {WINDOW_S} s window "
                        "(CUDA events); nvidia-smi clocks.sm (MHz), power.draw (W), temperature.gpu (C) after each",
              "shapes": []}
    for m, k, n in SHAPES:
        result["shapes"].append({"m": m, "k": k, "n": n, "windows": sustained(m, k, n, SECONDS)})
        w = result["shapes"][-1]["windows"]
        print((m, k, n), [round(x["tflops"]) for x in w], w[0]["smi"], w[-1]["smi"], flush=True)
    with open(out_path, "w") as fh:
        json.dump(result, fh, indent=1)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "sustained_gemm_probe.json")
