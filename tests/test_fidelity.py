"""Fidelity against published, measured training runs (benchmarks/fidelity.py).

Targets (issue #6): step-time MAPE ≤ 8% over the Megatron calibration cases and in each of their groups, no case
worse than 20%, with one set of physical parameters per GPU generation (the catalog's), and the catalog values are
what the documented fit produces (no hand-tuned numbers). Issue #12: memory against published peaks."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from autoplan.catalog.registry import efficiency_catalog

from benchmark_modules import load_benchmark


def _load_fidelity():  # type: ignore[no-untyped-def]
    return load_benchmark("fidelity", "fidelity")


fidelity = _load_fidelity()


@pytest.fixture(scope="module")
def rows():  # type: ignore[no-untyped-def]
    return fidelity.evaluate(with_loo=False)


def test_all_published_cases_are_predicted(rows) -> None:  # type: ignore[no-untyped-def]
    cases = json.loads(fidelity.data_path().read_text())["cases"]
    skipped = fidelity.skipped_cases()
    assert len(cases) == 39
    # plus the more_runs.json groups that joined the calibration set (NeMo 24.07 rows, NeMo 24.03 long sequence)
    # and the first measured AMD runs (more_runs_amd.json: 5 MI325X Megatron-Core rows, two sources)
    assert len(rows) + len(skipped) == len(fidelity.calibration_cases()) == 39 + 15 + 5
    assert len(skipped) <= 1 and all(why for _, why in skipped)
    assert {r.generation for r in rows} == {"ampere", "hopper", "cdna3"}


# No exception any more: torchtitan's 8B cp2 at 64k (its measured step grows +53% from 32k to 64k but +137% from 64k
# to 128k for the same doubling of attention work per GPU) was +26% while the generation was fitted on Megatron runs
# alone; with the generation and framework parameters fitted jointly (calibrate.fit_joint) it is +19.6%.
IRREGULAR: dict[str, float] = {}


def test_mape_and_worst_case(rows) -> None:  # type: ignore[no-untyped-def]
    errors = [abs(r.error) for r in rows]
    assert sum(errors) / len(errors) <= 0.08
    for r in rows:
        # issue #12: no run worse than 25% (torchtitan_8B_t2_cp2_64k, the CP series' outlier, sits at 20.0%)
        assert abs(r.error) <= IRREGULAR.get(r.id, 0.25), (r.id, r.error)
    for name, n, mape, worst, worst_id, _ in fidelity.summarize(rows, "group"):
        assert mape <= 0.08, (name, mape)


def test_mfu_columns_share_one_flop_accounting(rows) -> None:  # type: ignore[no-untyped-def]
    for r in rows:
        assert r.measured_mfu == pytest.approx(r.predicted_mfu * r.predicted_s / r.measured_s)
        assert 0.2 < r.measured_mfu < 1.0


def test_project_copy_matches_shared_data() -> None:
    shared = fidelity.SHARED
    if not shared.is_file():
        pytest.skip("shared/calibration not beside the repository")
    own = json.loads((fidelity.DATA / "published_runs.json").read_text())
    assert own == json.loads(shared.read_text())


def test_every_unstated_field_has_a_group_rule() -> None:
    """Nulls are resolved by one documented rule per group (or the authors' own per-case script), never ad hoc."""
    cases = json.loads(fidelity.data_path().read_text())["cases"]
    rules = json.loads((fidelity.DATA / "resolutions.json").read_text())
    for c in cases:
        group = rules["groups"][c["group"]]
        assert group["source"] and group["parallel_rule"]
        run = fidelity.to_run(c, rules)
        if c["job"]["micro_batch_size"] is None:
            assert "cases" in group or "micro_batch_size" in group["defaults"]
        assert run.parallel.micro_batch_size >= 1
        if c["parallel"]["sequence_parallel"] is None:
            assert run.parallel.sequence_parallel == (c["parallel"]["tp"] > 1)
        assert run.parallel.recompute == (c["parallel"]["recompute"] or "none")
        assert "flash_attention" in run.software
    # The SC'21 values are the authors' script's, and the interleaving they imply is legal.
    sc21 = rules["groups"]["megatron_sc21_table1"]["cases"]
    assert [v["micro_batch_size"] for v in sc21.values()] == [16, 16, 16, 8, 4, 2, 2, 1, 1, 1]


def test_svg_scatter(rows, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    svg = fidelity.svg_scatter(rows)
    root = ET.fromstring(svg)
    ns = "{http://www.w3.org/2000/svg}"
    assert len(root.findall(f"{ns}circle")) >= len(rows)
    assert root.find(f"{ns}polygon") is not None  # the ±10% band
    titles = [c.find(f"{ns}title").text for c in root.findall(f"{ns}circle") if c.find(f"{ns}title") is not None]
    assert len(titles) == len(rows) and all("measured" in t for t in titles)
    table = fidelity.render(rows)
    assert f"| all: all | {len(rows)} |" in table


def test_cli_writes_table_and_svg(tmp_path: Path) -> None:
    assert fidelity.main(["--no-loo", "--out", str(tmp_path)]) == 0
    assert (tmp_path / "fidelity.svg").read_text().startswith("<svg")
    assert "MAPE" in (tmp_path / "fidelity.md").read_text()


def test_export_runs_round_trip(tmp_path: Path) -> None:
    from autoplan.calibrate import load_runs

    paths = fidelity.export_runs(tmp_path)
    assert sorted(p.name for p in paths) == ["a100-80g.jsonl", "h100-sxm-96g.jsonl", "h100-sxm.jsonl", "mi325x.jsonl"]
    assert sum(len(load_runs(p)) for p in paths) == 39 + 15 + 5


@pytest.mark.slow
def test_catalog_is_the_fit_of_the_published_runs() -> None:
    """gpus.yaml's [fit] values are the fixed point of `fidelity.py --fit` (to the precision written there)."""
    from autoplan.catalog.registry import framework_efficiency

    fitted = fidelity.fit_catalog()
    catalog = efficiency_catalog()
    assert "framework torchtitan" in fitted
    for gen, values in fitted.items():
        have = (framework_efficiency(gen.split()[1]) if gen.startswith("framework ")
                else {n: getattr(catalog[gen], n) for n in values})
        # a framework's ratios to the generation (gpus.yaml frameworks: <f>: scale:) are written to 10 digits
        assert values.get("scale", {}) == pytest.approx(have.get("scale", {}), rel=1e-9), gen
        for name, value in values.items():
            if name == "scale":
                continue
            if name == "tp_overlap" and have[name] >= 0.94 and value >= 0.94:
                continue  # a plateau: every value ≥ 0.94 leaves only the 1/(2t) floor exposed
            tol = 1e-6 if name in fidelity.HOST_FIELDS else 1e-3  # host seconds: µs, as written
            assert have[name] == pytest.approx(value, rel=0.01, abs=tol), (gen, name)
    for name in fidelity.HOST_FIELDS:
        host = fitted["framework megatron"][name]
        assert host > 0, f"the MoE host rows are host-bound: the fit of {name} is not 0"
        assert framework_efficiency("megatron")[name] == pytest.approx(host, abs=1e-6)


def test_host_fit_recovers_a_known_value() -> None:
    """``fit_moe_host`` on rows whose 'measured' step time is the model's own at a known host cost finds that cost
    (both terms): the host-calibration runs, re-measured at 1.2 ms per layer + 0.3 ms per local expert, those of them
    the floor moves at all."""
    from dataclasses import replace

    known = (1.2e-3, 3.0e-4)  # not the catalog's values
    runs = []
    for _, r in fidelity.host_calibration_runs():
        at = fidelity.with_host(r, known)
        if at > 1.01 * fidelity.with_host(r, (0.0, 0.0)):
            runs.append(replace(r, measured_step_time_s=at))
    assert len(runs) >= 3
    assert fidelity.fit_moe_host(runs) == pytest.approx(known, rel=0.01)
    assert fidelity.host_loss(runs, known) == pytest.approx(0.0, abs=1e-12)


def test_host_floor_changes_no_calibration_prediction() -> None:
    """The MoE host cost the catalog now carries (frameworks.megatron) moves no calibration run (published_runs.json
    and the groups that joined it: dense, or MoE with nothing host-bound): each run, priced as fidelity prices it,
    equals its price with the cost at 0 — the fit of every other parameter is untouched by it."""
    from autoplan.catalog.registry import framework_efficiency

    values = [framework_efficiency("megatron")[f] for f in fidelity.HOST_FIELDS]
    assert all(v > 0 for v in values)
    runs = fidelity.calibration_runs()
    megatron = [r for _, r in runs if r.target == "megatron"]
    assert megatron and all([getattr(r.cluster.efficiency, f) for f in fidelity.HOST_FIELDS] == values
                            for r in megatron)
    for case, r in runs:
        assert fidelity.with_host(r, (0.0, 0.0)) == r.predict(), case["id"]


def test_host_calibration_rows_are_the_moe_rows_without_overlap_of_their_groups() -> None:
    """The host fit's rows: every MoE row of the flagged releases (each with a basis) that runs no A2A overlap and is
    no hybrid (Mamba) stack; one release, one leave-one-release-out group (26.04.01's rows sit in two files)."""
    rows = fidelity.host_calibration_runs()
    every = fidelity.host_calibration_runs(with_overlap=True)
    # s11-hostfit: 26.04 / 26.04.01 (TE 2.14) joined 25.11 / 26.02 (TE 2.9 / 2.12): 21 + 26 rows
    assert {c["logo_group"] for c, _ in rows} == {"megatron_bridge_25.11", "megatron_bridge_26.02",
                                                   "megatron_bridge_26.04", "megatron_bridge_26.04.01"}
    assert len(rows) == 47 and sum(c["logo_group"] == "megatron_bridge_26.04.01" for c, _ in rows) == 13
    assert all(r.model.num_experts > 0 and r.model.hybrid_pattern is None
               and not r.knobs.given().get("moe_a2a_overlap") for _, r in rows)
    assert {c["id"] for c, _ in rows} < {c["id"] for c, _ in every}
    assert all(r.knobs.given().get("moe_a2a_overlap") for c, r in every if c["id"] not in {x["id"] for x, _ in rows})
    for path in fidelity.more_runs_files():
        _, rules = fidelity.load_cases(path)
        for g in fidelity.host_calibration_groups(rules):
            assert rules["groups"][g].get("host_calibration_basis"), g


@pytest.mark.slow
def test_leave_one_out_error(rows) -> None:  # type: ignore[no-untyped-def]
    rows = fidelity.evaluate(with_loo=True, with_logo=False)
    loo = [abs(r.loo_error) for r in rows if r.loo_error is not None]
    assert len(loo) == 25 + 15 + 5  # the Megatron-Core runs
    assert sum(loo) / len(loo) <= 0.08
    assert max(loo) <= 0.20


@pytest.mark.slow
def test_leave_one_group_out_error() -> None:
    """Fit without a whole source, predict it. Issue #12's targets: MAPE ≤ 10% (met: 5.6%) and no run worse than 25%
    (met since session 6: 23.0%, the README's 32B). Session 5 left it at 26.6%: without the README the fp8 runs traded
    fp8_gemm_speedup (1.67) against a free tp_overlap share (0.68 vs 0.96 in-sample) and the README's tp-8 32B paid the
    low share. Megatron's userbuffers are now priced per collective against its own GEMM (cost_models/te_userbuffers),
    so no fit can trade them; what the README-out fit still trades is fp8_gemm_speedup (1.64) against dp_overlap (0.25
    vs 0.63 in-sample): the 32B (dp 48) pays it. On the 38 runs of sessions 1-3 the README 32B was 26.9-29.9%: nothing
    but the README had Megatron runs with large data-parallel groups, so dp_overlap was unidentified without it; the
    NeMo 24.07 rows (dp up to 64) that joined the calibration set identify it in part.
    SC'21, the only A100 source, is predicted from Hopper's fit carried over by ``transfer_efficiency`` (saturation
    dim scaled by the roofline ridge point): within 8% on average. With the group out, a parameter no training run
    sees (fp8 without NeMo) takes its micro-benchmark value (FP8_GEMM_MICROBENCH), not the catalog's fit."""
    rows = fidelity.evaluate(with_loo=False, with_logo=True)
    logo = [abs(r.logo_error) for r in rows if r.logo_error is not None]
    assert len(logo) == len(rows)
    assert sum(logo) / len(logo) <= 0.065
    assert max(logo) <= 0.25  # issue #12's target; measured 0.230
    right, total, _ = fidelity.ranking(rows, logo=True)
    assert right / total >= 0.85
    sc21 = [abs(r.logo_error or 0.0) for r in rows if r.group == "megatron_sc21_table1"]
    assert sum(sc21) / len(sc21) <= 0.08
    table = fidelity.render(rows)
    assert "LOGO MAPE" in table


def test_memory_against_published_peaks() -> None:
    """Published peak memory (torchtitan: max_memory_reserved) vs the model's reserved peak for target torchtitan
    (issue #12 target: MAPE ≤ 10%); every configuration that really trained fits under the default headroom."""
    rows = fidelity.memory_rows()
    assert len(rows) == 18
    errors = [abs(p / m - 1) for _, m, p, _ in rows]
    assert sum(errors) / len(errors) <= 0.10
    for _, measured, predicted, parts in rows:
        assert parts["reserved"] == pytest.approx(predicted)
        assert parts["allocated"] < parts["reserved"] and parts["allocated"] < parts["total"]
        # torchtitan's launcher runs expandable segments: the reserve is reported, not held (cost_models.memory)
        assert parts["allocator"] == 0.0 and parts["reserved"] == pytest.approx(
            parts["allocated"] + parts["allocator_cached"])
        assert parts["total"] == pytest.approx(parts["allocated"] + parts["runtime"])
        assert parts["total"] <= 96 * (1 - 0.05)  # h100-sxm-96g less the default 5% headroom
    assert "memory MAPE" in fidelity.render_memory(rows)


def test_reserve_fit_brackets_the_catalog_reserve() -> None:
    """``fidelity.reserve_fit``: its optimum minimises the memory MAPE (neighbours are no better), and the catalog's
    ``ALLOCATOR_RESERVE`` stays under the held reserve every calibration run that trained allows."""
    from cost_models.memory import ALLOCATOR_RESERVE

    rows = fidelity.memory_rows()
    fit = fidelity.reserve_fit(rows)

    def mape(c: float) -> float:
        return sum(abs(p["allocated"] + c * (p["activations"] + p["transients"]) - m) / m
                   for _, m, _, p in rows) / len(rows)

    best = float(fit["best"])  # type: ignore[arg-type]
    assert fit["best_mape"] == pytest.approx(mape(best))
    assert mape(best) <= min(mape(best - 0.001), mape(best + 0.001))
    assert fit["catalog_mape"] == pytest.approx(sum(abs(p / m - 1) for _, m, p, _ in rows) / len(rows))
    bound, _ = fidelity.held_reserve_bound()
    assert ALLOCATOR_RESERVE <= bound


def test_transfer_scales_the_saturation_dim_by_the_ridge_point() -> None:
    """A generation without reference runs: dimensionless efficiencies carry over, ``gemm_half_dim`` scales with
    peak FLOP/s ÷ HBM bytes/s, and a GPU without fp8 tensor cores keeps its fp8 ratio of 1."""
    from autoplan.catalog import build_cluster

    cat = efficiency_catalog()
    h100, a100 = build_cluster("h100-sxm", 8).gpu, build_cluster("a100-80g", 8).gpu
    out = fidelity.transfer_efficiency(cat["hopper"], h100, a100, cat["ampere"])
    ridge = (a100.peak_bf16_tflops / a100.hbm_tbytes_per_s) / (h100.peak_bf16_tflops / h100.hbm_tbytes_per_s)
    assert out.gemm_half_dim == pytest.approx(cat["hopper"].gemm_half_dim * ridge)
    assert 0.4 < ridge < 0.6
    assert out.gemm_max == cat["hopper"].gemm_max and out.dp_overlap == cat["hopper"].dp_overlap
    assert out.fp8_gemm_speedup == 1.0 and out.tp_overlap == cat["ampere"].tp_overlap
    assert out.link_bus == cat["ampere"].link_bus


def test_attention_kernel_share_recomputes_the_cited_cudnn_benchmarks() -> None:
    """The cuDNN micro-benchmark shares behind Blackwell's attention: fwd + bwd time for a forward FLOP and 2.5 of
    backward, over the datasheet peak of the GPU each was run on (H200 989, B200 2250 TFLOP/s)."""
    from autoplan.catalog.registry import load_gpu
    from cost_models.specs import ATTENTION_KERNEL_BENCH

    for gen, (gpu, fwd, bwd) in ATTENTION_KERNEL_BENCH.items():
        want = 3.5 / (1 / fwd + 2.5 / bwd) / load_gpu(gpu).peak_bf16_tflops
        assert fidelity.attention_kernel_share(gen) == pytest.approx(want)
    # GB200's cuDNN 9.17 kernel at 8k tokens: 0.519 of its 2500 TFLOP/s; H200's cuDNN 9.1: 0.496 of 989
    assert fidelity.attention_kernel_share("blackwell") == pytest.approx(0.5195, abs=5e-4)
    assert fidelity.attention_kernel_share("hopper") == pytest.approx(0.4957, abs=5e-4)
    assert fidelity.attention_kernel_share("ampere") is None


def test_blackwell_attention_half_keys_is_the_cudnn_sweeps_fit() -> None:
    """``attention_half_keys`` for Blackwell is a·x/(x + h) fitted to NVIDIA's cuDNN 9.19.1 GB200 sweep (causal d 128,
    2k-32k tokens, fwd+bwd share of the GPU's datasheet peak; benchmarks/gpu_facts.py ATTENTION_SWEEP_919), refitted
    here; the curve stays within 3% of every point, the 2k row included (the former 4k-128k cuDNN 9.17 fit, 334,
    priced that row 1.27x fast)."""
    from autoplan.catalog.registry import load_gpu
    from benchmark_modules import load_benchmark

    facts = load_benchmark("gpu_facts", "gpu_facts")
    sweep = facts.ATTENTION_SWEEP_919["gb200"]
    peak = load_gpu("gb200").peak_bf16_tflops
    a, h = fidelity.attention_half_keys_fit(sweep, peak)
    assert efficiency_catalog()["blackwell"].attention_half_keys == pytest.approx(h, abs=1.0)
    assert h == pytest.approx(facts.attention_half_keys("gb200"))
    for tokens, (fwd, bwd) in sweep.items():
        share = fidelity.kernel_share(fwd, bwd, peak)
        assert a * (tokens / 2) / (tokens / 2 + h) == pytest.approx(share, rel=0.03), tokens
    # the old value misses the short end of the same data by more than the fit's worst point
    norm = lambda x, hh: (x / (x + hh)) / (4096 / (4096 + hh))  # noqa: E731
    ref = fidelity.kernel_share(*sweep[8192], peak)
    assert norm(1024, 334.0) * ref / fidelity.kernel_share(*sweep[2048], peak) > 1.2


def test_blackwell_catalog_is_hoppers_fit_transferred() -> None:
    """No measured Blackwell run is in the data set: its catalog efficiencies are Hopper's fit carried over by
    ``transfer_efficiency`` (GEMM saturation dim by the ridge point, attention by the cuDNN kernel ratio) — the
    catalog entry cannot go stale when Hopper is refitted."""
    from autoplan.catalog.registry import load_gpu

    cat = efficiency_catalog()
    h100, b200 = load_gpu("h100-sxm"), load_gpu("b200")
    out = fidelity.transfer_efficiency(cat["hopper"], h100, b200, cat["blackwell"])
    kernel = fidelity.attention_kernel_share("blackwell") / fidelity.attention_kernel_share("hopper")
    assert out.attention == pytest.approx(cat["hopper"].attention * kernel)
    for name in ("gemm_max", "gemm_half_dim", "attention", "fp8_gemm_speedup", "dp_overlap", "tp_overlap"):
        assert getattr(cat["blackwell"], name) == pytest.approx(getattr(out, name), abs=1e-4, rel=1e-4), name


def test_ranking_of_differently_configured_runs(rows) -> None:  # type: ignore[no-untyped-def]
    """Issue #12: where one job (model, GPU count, batch, sequence) was measured under several configurations,
    the model orders them right in >= 85% of the pairs (in-sample; the leave-one-group-out ranking is reported by
    benchmarks/fidelity.py, not asserted)."""
    right, total, wrong = fidelity.ranking(rows)
    assert total == 8  # torchtitan's compile / fp8 / async-TP series and the 405B 1F1B / interleaved pair
    assert right / total >= 0.85, wrong
    assert "Ranking (in-sample)" in fidelity.render_ranking(rows)


def test_calibration_runs_fit_under_the_default_headroom() -> None:
    """Issue #12: a configuration that really trained is predicted to fit (priced with the knobs its recipe states:
    Nemotron-4 340B with the bf16 gradients and bf16 Adam moments of NeMo 24.07's recipe, resolutions.json)."""
    rows = fidelity.calibration_fits()
    assert len(rows) == 38 + 16 + 5
    over = [(cid, round(gib, 2), limit) for cid, gib, limit, fits in rows if not fits]
    assert not over, over
    assert "predicted to fit" in fidelity.render_fits(rows)
