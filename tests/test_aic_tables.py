"""benchmarks/aic_gemm.py on a synthetic aiconfigurator tree: the B200-relative GEMM ratios it makes for
gpu_facts.AIC_GEMM_VS_B200 (plateau shapes only, fastest row per shape, paired shapes, tables measured on another GPU
skipped)."""

from __future__ import annotations

import pytest

from benchmark_modules import load_benchmark

pd = pytest.importorskip("pandas")
pytest.importorskip("pyarrow")
aic = load_benchmark("aic_gemm", "aic_gemm")


Row = tuple[str, int, int, int, float]  # dtype, m, n, k, latency ms


def _table(tmp_path, system: str, device: str, rows: list[Row]) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / aic.DATA / system / "gemm" / "trtllm" / "1.0" / "gemm_perf.parquet"
    path.parent.mkdir(parents=True)
    pd.DataFrame([{"device": device, "kernel_source": "torch_flow", "gemm_dtype": dt, "m": m, "n": n, "k": k,
                   "latency": ms} for dt, m, n, k, ms in rows]).to_parquet(path)


def test_measure_pairs_plateau_shapes_and_skips_other_gpus_tables(tmp_path) -> None:  # type: ignore[no-untyped-def]
    big, other = (8192, 8192, 8192), (16384, 4096, 8192)
    _table(tmp_path, "b200_sxm", "NVIDIA B200", [("bfloat16", *big, 1.0), ("bfloat16", *other, 2.0),
                                                 ("bfloat16", 1024, 8192, 8192, 1.0), ("fp8", *big, 0.5)])
    # GB200: 1.25x and 1.0x on the two bf16 plateau shapes (geometric mean 1.118), a slower duplicate row of the
    # first (the fastest counts), a small shape it alone runs fast (off the plateau: ignored); fp8 2x
    _table(tmp_path, "gb200", "NVIDIA GB200", [("bfloat16", *big, 0.8), ("bfloat16", *big, 0.9),
                                               ("bfloat16", *other, 2.0), ("bfloat16", 1024, 8192, 8192, 0.1),
                                               ("fp8", *big, 0.25)])
    _table(tmp_path, "b300_sxm", "NVIDIA GB300", [("bfloat16", *big, 0.5)])  # GB300's rows in B300's directory
    found = aic.measure(aic.Tree(tmp_path))
    assert found["gb200"]["bf16"]["trtllm/1.0"] == round((1.25 * 1.0) ** 0.5, 3)
    assert found["gb200"]["fp8"]["trtllm/1.0"] == 2.0
    assert "b300" not in found
