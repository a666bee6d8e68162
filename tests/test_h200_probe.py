"""The H200 kernel measurements (benchmarks/h200_probe.py, data from benchmarks/gpu/*_probe.py) against the cost
model: what they confirm in the catalog and the claims the issue #12 note rests on, recomputed from the stored
measurements and the model, never copied."""

from __future__ import annotations

import math

import pytest
from benchmark_modules import load_benchmark

hp = load_benchmark("h200_probe", "h200_probe")


@pytest.fixture(scope="module")
def cluster():
    return hp.probe_cluster()


@pytest.fixture(scope="module", params=[0, 1], ids=["run1", "run2"])
def moe(request):
    return hp.load(hp.MOE_RUNS[request.param])


def test_probe_data_says_where_it_was_measured(moe, monkeypatch) -> None:
    assert moe["info"]["device"] == "NVIDIA H200"
    assert all(hp.load(path)["device"] == "NVIDIA H200"
               for path in (hp.DENSE_PROBE, hp.ELEMENTWISE_PROBE, hp.SUSTAINED_PROBE))
    pytest.importorskip("torch")  # the probe script imports it; its grid is what the stored data must cover
    monkeypatch.syspath_prepend(str(hp.ROOT / "benchmarks" / "gpu"))  # the probes import probe_common beside them
    probe = load_benchmark("gpu/moe_layer_probe", "moe_layer_probe")
    assert [(r["m"], r["k"], r["n"]) for r in moe["gemm"]] == probe.GEMM_GRID
    assert [r["case"] for r in moe["experts"]] == [c[0] for c in probe.EXPERT_CASES]


def test_catalog_head_dim_64_ratio_is_near_our_runs(cluster) -> None:
    # hopper attention_d64 [meas] comes from NVIDIA's cudnn-frontend numbers; our two SDPA runs give 0.801 and 0.876
    # (each run's d64 and d128 fwd+bwd times moved ~5%, in opposite directions): the catalog's 0.796 is just below
    # both, within one such 5% of the lower; not a confirmation tighter than the runs' 9% spread
    ratios = [hp.head_dim_ratio(hp.load(path)) for path in hp.MOE_RUNS]
    assert 0.95 * min(ratios) <= cluster.efficiency.attention_d64 <= max(ratios)


def test_catalog_hbm_bus_holds_on_our_copy(moe, cluster) -> None:
    copy = next(r for r in moe["memory"] if r["case"].startswith("copy"))
    achieved = copy["bytes"] / copy["ms"] / 1e9 / cluster.gpu.hbm_tbytes_per_s
    assert achieved == pytest.approx(cluster.efficiency.hbm_bus, rel=0.05)


def test_model_does_not_price_the_bf16_hopper_moe_experts_faster_than_they_run(moe, cluster) -> None:
    # the held-out GPT-OSS H100 rows (bf16) are predicted too fast; their expert GEMMs, as op_compute prices them at
    # the published layouts, are not why. (The too-fast Qwen3-30B H100 rows are fp8: the probe timed bf16.)
    rows = [r for r in hp.expert_rows(moe, cluster) if "h100" in r[0]]
    assert len(rows) == 5
    for case, loop_s, grouped_s, balanced_s, priced_s in rows:
        assert priced_s >= balanced_s > loop_s, case
        assert math.isnan(grouped_s) or balanced_s > grouped_s, case


def test_work_saturation_fits_the_kernels_better_than_the_dim_product(moe, cluster) -> None:
    points = hp.gemm_points(moe, cluster)
    catalog = hp.abs_errors([p.model_s for p in points], [p.measured_s for p in points]).mean()
    _, _, product_mape, _ = hp.fit_dim_product(points, cluster)
    g, f_half, work_mape, _ = hp.fit_flop_saturation(points, cluster)
    assert work_mape < 0.10 < product_mape < catalog
    assert 0.5 < g < 0.9 and f_half > 0


def test_sustained_gemms_hold_their_rate() -> None:
    # a GPU kept busy for 30 s at its power cap does not drift below its first second: the gap between the fitted
    # (run-level) efficiencies and single kernels is not a sustained-power slowdown on this machine
    rows = hp.sustained_rows(hp.load(hp.SUSTAINED_PROBE))
    assert len(rows) == 2
    for shape, first, last, spread, *_ in rows:
        assert spread > 0.98 and abs(last / first - 1) < 0.02, shape
