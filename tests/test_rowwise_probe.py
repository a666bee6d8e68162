"""benchmarks/rowwise_probe.py over the stored H200 rowwise ``_scaled_mm`` probe: what its printout says, recomputed
from the stored rows (times and kernel names), never copied."""

from __future__ import annotations

from benchmark_modules import load_benchmark

rp = load_benchmark("rowwise_probe", "rowwise_probe")


def test_library_reads_kernel_names() -> None:
    assert rp.library(["Memset (Device)", "nvjet_sm90_qqtst_128x128_128x6_2x1_v_bz_ovscale_TNT"]) == "cuBLASLt"
    assert rp.library(["void cutlass::device_kernel<f8f8bf16_rowwise_...>"]) == "CUTLASS"
    assert rp.library(["Memset (Device)"]) == "unknown"


def test_stored_rowwise_ran_on_cublaslt_not_the_2025_cutlass_kernel() -> None:
    data = rp.load()
    assert data["device"] == "NVIDIA H200" and data["torch"].startswith("2.11")
    for row in data["rows"]:
        # rowwise: cuBLASLt's outer-vector-scaled kernel; tensorwise: cuBLASLt too
        assert any("ovscale" in k for k in row["rowwise"]["kernels"]), row["name"]
        assert rp.library(row["rowwise"]["kernels"]) == rp.library(row["tensorwise"]["kernels"]) == "cuBLASLt"
    text = rp.render(data)
    assert "nothing about the 2025 kernel" in text


def test_rowwise_is_not_slow_here() -> None:
    data = rp.load()
    s = rp.summary(data)
    ratios = [r["rowwise"]["ms"] / r["tensorwise"]["ms"] for r in data["rows"]]
    assert s["n"] == len(data["rows"]) == 15
    assert 0.95 <= s["median"] <= 1.0  # the median shape: rowwise no slower than tensorwise
    assert s["within_5pct"] >= len(ratios) // 2
    assert s["max"] == max(ratios) > 1.3 and s["slowest"] == "8b_tp8_wo"  # the one tail: K = 512
    for row, ratio in zip(data["rows"], ratios):  # the stored ratio columns are the stored times'
        assert row["rowwise_over_tensorwise_time"] == round(ratio, 3) or abs(row["rowwise_over_tensorwise_time"]
                                                                             - ratio) < 2e-3, row["name"]
