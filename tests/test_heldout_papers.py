"""Held-out measured runs from papers (benchmarks/data/more_runs_papers.json, priced by benchmarks/heldout.py).

Every case resolves like a calibration run (dp consistent with the GPU count, a source that names its table or
section, a FLOP accounting where the step time is derived), and — a REGRESSION GUARD, not a fidelity target — each
source's per-case error stays within what was measured when the data landed (plus 2 points): a change to the cost
model that makes these runs worse shows up here. The issue's targets (MAPE <= 10%, worst <= 35%) are NOT met by the
Llama 3 405B rows; the script reports them (`python benchmarks/heldout.py --files benchmarks/data/more_runs_papers.json`).
"""

from __future__ import annotations

import json
import re

import pytest

from benchmark_modules import load_heldout


@pytest.fixture(scope="module")
def heldout():  # type: ignore[no-untyped-def]
    return load_heldout()


@pytest.fixture(scope="module")
def path(heldout):  # type: ignore[no-untyped-def]
    return heldout.fidelity.DATA / "more_runs_papers.json"


@pytest.fixture(scope="module")
def evaluated(heldout, path):  # type: ignore[no-untyped-def]
    return heldout.evaluate([path])


def test_every_paper_case_resolves(path, evaluated) -> None:
    rows, skipped, cases = evaluated
    data = json.loads(path.read_text())
    assert not skipped and {r.id for r in rows} == {c["id"] for c in data["cases"]}
    for g in data["groups"].values():
        assert re.search(r"arXiv \d{4}\.\d{5}", g["source"]), g["source"]
    for c in data["cases"]:
        assert re.search(r"arXiv \d{4}\.\d{5}.*\b(Table|Section) \d", c["source"]), c["id"]
        par, cl, meas = c["parallel"], c["cluster"], c["measured"]
        assert par["dp"] * par["tp"] * par["pp"] * par["cp"] == cl["num_gpus"], c["id"]
        assert meas["basis"] and meas["flop_accounting"], c["id"]


def test_llama3_step_time_is_the_published_tflops(path) -> None:
    """Table 4's TFLOPs/GPU back to a step time with the FLOP count the case states (6N + 12*L*h*s per token)."""
    for c in json.loads(path.read_text())["cases"]:
        if c["group"] != "llama3_405b_paper":
            continue
        job, meas, n = c["job"], c["measured"], c["cluster"]["num_gpus"]
        per_token = 6 * 405.85e9 + 12 * 126 * 16384 * job["seq_len"]
        tokens = job["global_batch_size"] * job["seq_len"]
        assert tokens == pytest.approx(16e6, rel=0.05)  # Table 4: 16M tokens per batch
        assert meas["step_time_s"] == pytest.approx(tokens * per_token / (meas["tflops_per_gpu"] * 1e12 * n), rel=1e-3)


# REGRESSION GUARD: per-case relative error (predicted/measured - 1) when the data landed
# (python benchmarks/heldout.py --files benchmarks/data/more_runs_papers.json); a case may not get worse by more
# than 2 points. Llama 3 405B, MT-NLG and Nemotron-4 are misses (see /work/notes/issue-12.md), not targets.
SEEN = {
    # Llama 3: session 6 prices Meta's FSDP as the paper describes it (fp32 accumulation over micro-batches, one
    # reduce-scatter per step: zero 1); it was Megatron-FSDP's per-micro-batch, per-chunk-waited one (+50/+46/+11%)
    "llama3_405b_t4_8192gpu_8k": -0.115, "llama3_405b_t4_16384gpu_8k": -0.109, "llama3_405b_t4_16384gpu_128k": -0.147,
    # Nemotron-4: V = 2 read from Table 2's MFU drop (session 6); was V = 8 (-14.7/-14.6/-16.0%)
    "nemotron4_340b_t2_1536gpu": -0.092, "nemotron4_340b_t2_3072gpu": -0.091, "nemotron4_340b_t2_6144gpu": -0.090,
    # MT-NLG: micro-batch 2 read from §2.4's own scaling (session 6); was 1 (-16.3/-17.3/-19.6%)
    "mtnlg_530b_280nodes": -0.084, "mtnlg_530b_350nodes": -0.074, "mtnlg_530b_420nodes": -0.082,
    "korthikanti22_22B_full_recompute": 0.046, "korthikanti22_22B_selective_sp": 0.001,
    "korthikanti22_175B_full_recompute": 0.062, "korthikanti22_175B_selective_sp": 0.030,
    "korthikanti22_530B_full_recompute": 0.099, "korthikanti22_530B_selective_sp": 0.053,
    "korthikanti22_1T_full_recompute": 0.131, "korthikanti22_1T_selective_sp": 0.117,
}
MARGIN = 0.02


def test_llama3_scaling_drop_is_the_bubble(evaluated) -> None:
    """Llama 3 §3.3.2: 'The slight drop in MFU to 41% on 16K GPUs with DP=128 compared to 43% on 8K GPUs with DP=64
    is due to the lower batch size per DP group' — at a fixed batch, half the micro-batches per pipeline, so a
    bigger bubble (PP-1)/(V*M). The resolution (one-layer chunks: V = 8, micro-batch 1) must reproduce that drop:
    GPU-seconds per step 16k / 8k, predicted vs measured (1.075), within 1.5 points. V = 4 gives 1.122, V = 2 1.200."""
    rows, _, _ = evaluated
    by = {r.id: r for r in rows}
    a, b = by["llama3_405b_t4_8192gpu_8k"], by["llama3_405b_t4_16384gpu_8k"]
    measured = b.measured_s * b.num_gpus / (a.measured_s * a.num_gpus)
    predicted = b.predicted_s * b.num_gpus / (a.predicted_s * a.num_gpus)
    assert measured == pytest.approx(430 / 400, rel=1e-3)  # Table 4: 430 vs 400 TFLOP/s per GPU, same work
    assert predicted == pytest.approx(measured, abs=0.015)


def test_nemotron4_scaling_drop_is_the_bubble(evaluated) -> None:
    """Nemotron-4 340B Table 2: MFU 42.3% at dp 32 (batch 1536, M = 48 micro-batches of 1 per pipeline) and 41.0% at
    dp 64 (batch 2304, M = 36). The paper states interleaving, not V; the resolution V = 2 must reproduce that drop
    (GPU-seconds per sample, 6144 / 3072 GPUs: 1.032 from the MFUs, 1.036 from the iteration times) within 0.6
    points of the iteration-time ratio. V = 4 gives 1.024, V = 8 (one-layer chunks) 1.018, V = 1 1.061."""
    rows, _, _ = evaluated
    by = {r.id: r for r in rows}
    a, b = by["nemotron4_340b_t2_3072gpu"], by["nemotron4_340b_t2_6144gpu"]
    gpus_per_sample = (b.num_gpus / 2304) / (a.num_gpus / 1536)  # Table 2 batch sizes 1536, 2304
    measured = b.measured_s / a.measured_s * gpus_per_sample
    predicted = b.predicted_s / a.predicted_s * gpus_per_sample
    assert measured == pytest.approx(8.0 / 10.3 * 4 / 3)
    assert 42.3 / 41.0 == pytest.approx(measured, abs=0.005)  # the MFUs say the same within their rounding
    assert predicted == pytest.approx(measured, abs=0.006)


def test_mtnlg_scaling_is_the_1f1b_bubble(evaluated) -> None:
    """MT-NLG §2.4: batch 1920 on 280 / 350 / 420 DGX A100 servers in 60.1 / 50.2 / 44.4 s. At a fixed batch the
    GPU-seconds per step grow as DeepSpeed's 1F1B bubble (PP-1)/M does with fewer micro-batches; the resolution
    (micro-batch 2: M = 120 / 96 / 80) must reproduce 420/280 = 1.108 within 1 point and 350/280 = 1.044 within 1.5
    (micro-batch 1 gives 1.065 / 1.032, micro-batch 4 1.181 / 1.091)."""
    rows, _, _ = evaluated
    by = {r.id: r for r in rows}
    base = by["mtnlg_530b_280nodes"]
    for rid, measured, tol in (("mtnlg_530b_420nodes", 44.4 * 1.5 / 60.1, 0.01),
                               ("mtnlg_530b_350nodes", 50.2 * 1.25 / 60.1, 0.015)):
        r = by[rid]
        assert r.measured_s * r.num_gpus / (base.measured_s * base.num_gpus) == pytest.approx(measured)
        assert r.predicted_s * r.num_gpus / (base.predicted_s * base.num_gpus) == pytest.approx(measured, abs=tol), rid


def test_scaling_view_pairs_the_paper_sources(heldout, evaluated) -> None:
    """heldout.scaling pairs each source's runs of one job shape on different GPU counts (Llama 8k, Nemotron-4,
    MT-NLG; not the 128k Llama row: another sequence and cp) and every paper pair's predicted GPU-seconds-per-sample
    ratio is within 1.5% of the measured one: nothing that grows with GPU count is missing at 1.5k-16k GPUs."""
    rows, _, cases = evaluated
    pairs = {a: (b, m, p) for a, b, m, p in heldout.scaling(rows, cases)}
    assert set(pairs) == {"llama3_405b_t4_16384gpu_8k", "mtnlg_530b_350nodes", "mtnlg_530b_420nodes",
                          "nemotron4_340b_t2_3072gpu", "nemotron4_340b_t2_6144gpu"}
    assert pairs["mtnlg_530b_420nodes"][0] == "mtnlg_530b_280nodes"
    assert all(abs(p / m - 1) < 0.015 for _, m, p in pairs.values()), pairs


def test_scale_rows_are_not_latency_bound(heldout, path, evaluated) -> None:
    """The >1024-GPU rows' DP / CP / PP collectives move GB-sized payloads: with the scale-out α at 30 µs per ring
    step (Llama 3 §3.3.3: "latency up to tens of microseconds" on a multi-hop fabric; catalog 3.7) every H100 / A100
    paper row moves by less than 1.5 points (the 128k row's CP all-gather most), and the what-if reaches the GPUs."""
    rows, _, _ = evaluated
    slow, _, _ = heldout.evaluate([path], heldout.parse_what_if(["h100-sxm.nic_latency_us=30",
                                                                 "a100-80g.nic_latency_us=30"]))
    base = {r.id: r for r in rows if r.num_gpus > 1024}
    moved = {r.id: r.error - base[r.id].error for r in slow if r.id in base}
    assert len(moved) == 9 and all(d > 0 for d in moved.values())
    assert max(moved.values()) < 0.015, moved


def test_paper_errors_regression_guard(evaluated) -> None:
    """REGRESSION GUARD (not the issue's target): no paper case's |error| grows past what was measured + 2 points."""
    rows, _, _ = evaluated
    assert {r.id for r in rows} == set(SEEN)
    worse = [f"{r.id} {r.error:+.1%} (was {SEEN[r.id]:+.1%})" for r in rows if abs(r.error) > abs(SEEN[r.id]) + MARGIN]
    assert not worse, worse
