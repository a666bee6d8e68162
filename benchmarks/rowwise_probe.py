"""What the stored rowwise ``_scaled_mm`` probe says (benchmarks/data/h200_rowwise_scaled_mm_probe_2026_12_04.json,
taken with ``benchmarks/gpu/rowwise_scaled_mm_probe.py`` on one H200, torch 2.11.0+cu130, CUDA 13.0).

Per shape (the asyncTP TP8 and torchao per-rank GEMMs of the held-out torchtitan rows): rowwise over tensorwise time
(fast accum, torchao's forward), bf16 over tensorwise, and which library ran each variant, read off the recorded
kernel names: ``nvjet_*`` kernels are cuBLASLt's (``ovscale``: its outer-vector, i.e. row x column, scaling), a
``cutlass`` / ``f8f8bf16_rowwise`` kernel would be PyTorch's own CUTLASS path (aten/src/ATen/native/cuda/
RowwiseScaledMM.cu). The cost model's ``knob_effects.ROWWISE_FWD_GEMM_EFFICIENCY`` (0.95: the rowwise forward
GEMM 1/0.95 = 1.053x tensorwise's time) describes that CUTLASS kernel as torchao's 2025 recipe runs met it
(pytorch/pytorch#147971): where this torch ran rowwise on cuBLASLt, the probe times another kernel than the 2025 runs
did and neither confirms nor refutes that figure; it shows only what a current torch does.

    python benchmarks/rowwise_probe.py
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "benchmarks" / "data" / "h200_rowwise_scaled_mm_probe_2026_12_04.json"


def load(path: Path = DATA) -> dict:
    return json.loads(path.read_text())


def library(kernels: list[str]) -> str:
    """The GEMM library of one call's kernels (memsets aside): 'cuBLASLt', 'CUTLASS' or 'unknown'."""
    gemm = [k for k in kernels if not k.startswith("Memset")]
    if gemm and all(k.startswith("nvjet_") for k in gemm):
        return "cuBLASLt"
    if gemm and all("cutlass" in k.lower() or "f8f8bf16_rowwise" in k for k in gemm):
        return "CUTLASS"
    return "unknown"


def table(data: dict) -> list[tuple[str, int, int, int, float, float, str, str]]:
    """(name, m, k, n, rowwise / tensorwise time, bf16 / tensorwise time, rowwise library, tensorwise library)."""
    return [(r["name"], r["m"], r["k"], r["n"], r["rowwise"]["ms"] / r["tensorwise"]["ms"],
             r["bf16"]["ms"] / r["tensorwise"]["ms"], library(r["rowwise"]["kernels"]),
             library(r["tensorwise"]["kernels"])) for r in data["rows"]]


def summary(data: dict) -> dict:
    rows = table(data)
    ratios = [r[4] for r in rows]
    return {"n": len(rows), "median": statistics.median(ratios), "min": min(ratios), "max": max(ratios),
            "slowest": max(rows, key=lambda r: r[4])[0], "rowwise_libraries": sorted({r[6] for r in rows}),
            "within_5pct": sum(abs(x - 1.0) <= 0.05 for x in ratios)}


def render(data: dict) -> str:
    out = [f"{data['device']}, torch {data['torch']}, CUDA {data.get('cuda', '?')}",
           "| shape | M | K | N | rowwise/tensorwise | bf16/tensorwise | rowwise lib | tensorwise lib |",
           "|---|---|---|---|---|---|---|---|"]
    out += [f"| {n} | {m} | {k} | {nn} | {rw:.3f} | {bf:.3f} | {lr} | {lt} |"
            for n, m, k, nn, rw, bf, lr, lt in table(data)]
    s = summary(data)
    libs = ", ".join(s["rowwise_libraries"])
    out.append(f"\nrowwise / tensorwise time over {s['n']} shapes: median {s['median']:.3f}, range {s['min']:.3f}-"
               f"{s['max']:.3f} (slowest {s['slowest']}), {s['within_5pct']} within 5%; rowwise ran on {libs}.")
    if s["rowwise_libraries"] == ["cuBLASLt"]:
        out.append("This torch runs rowwise _scaled_mm on cuBLASLt (nvjet ...ovscale), not PyTorch's CUTLASS "
                   "RowwiseScaledMM kernel that torchao's 2025 runs used: the data say rowwise is not slow now, and "
                   "nothing about the 2025 kernel (knob_effects.ROWWISE_FWD_GEMM_EFFICIENCY stays as sourced).")
    return "\n".join(out)


if __name__ == "__main__":
    print(render(load()))
