"""`autoplan calibrate`: recovers known parameters from runs the model itself generated, writes a profile that
`estimate --cluster` uses, reports leave-one-out error, and rejects bad run files with one line (exit 2)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from autoplan.calibrate import (DEFAULT_FIT_FIELDS, PHYSICAL_BOUNDS, MeasuredRun, ResolvedRun, fit, leave_one_out,
                                load_runs, resolve_run)
from autoplan.catalog import build_cluster, load_model
from autoplan.catalog.registry import efficiency_catalog
from autoplan.cli import cli
from cost_models.estimate import estimate
from cost_models.specs import JobSpec, ParallelConfig

# Known parameters, deliberately away from the hopper catalog values. tp_overlap is not among them: Megatron runs
# price their userbuffers per collective (cost_models/te_userbuffers), so no Megatron run sees the share (it is held).
TRUE = {"gemm_max": 0.78, "gemm_half_dim": 400.0, "attention": 0.40, "fp8_gemm_speedup": 1.7, "dp_overlap": 0.7}
# (model, gpus, tp, pp, vp, mbs, precision, seq, global batch, zero): shapes, TP degrees, fp8/bf16 and a
# DP-heavy run (one micro-batch, DDP across 8 nodes) so every fitted parameter moves some step time.
CONFIGS = [
    ("llama3-8b", 8, 1, 1, 1, 1, "bf16", 4096, 64, 1),
    ("llama3-8b", 16, 2, 1, 1, 2, "fp8", 8192, 64, 1),
    ("llama3-8b", 64, 4, 2, 1, 1, "bf16", 8192, 128, 1),
    ("llama3-8b", 64, 1, 1, 1, 1, "bf16", 4096, 64, 0),
    ("llama3-70b", 64, 8, 4, 1, 1, "bf16", 4096, 128, 1),
    ("llama3-70b", 128, 4, 4, 5, 1, "fp8", 8192, 128, 1),
    ("llama3-70b", 256, 8, 2, 1, 1, "fp8", 4096, 512, 1),
    ("gpt3-175b", 256, 8, 8, 1, 1, "bf16", 2048, 256, 1),
    ("llama2-13b", 32, 2, 1, 1, 1, "bf16", 2048, 256, 1),
]


def _line(cfg: tuple, step_s: float = 1.0) -> dict:
    model, n, tp, pp, vp, mbs, prec, seq, gbs, zero = cfg
    return {"name": f"{model}-n{n}-tp{tp}-pp{pp}-{prec}", "model": model,
            "cluster": {"gpu": "h100-sxm", "num_gpus": n},
            "job": {"global_batch_size": gbs, "seq_len": seq, "precision": prec},
            "parallel": {"tp": tp, "pp": pp, "vp": vp, "micro_batch_size": mbs, "sequence_parallel": tp > 1,
                         "zero_stage": zero},
            "measured_step_time_s": step_s}


@pytest.fixture(scope="module")
def synthetic_lines() -> list[dict]:
    """Run lines whose 'measured' step times are the model's own predictions with TRUE parameters."""
    lines = []
    for cfg in CONFIGS:
        run = resolve_run(MeasuredRun.model_validate(_line(cfg)))
        truth = run.cluster.efficiency.model_copy(update=TRUE)
        lines.append(_line(cfg, run.predict(truth)))
    return lines


def _write(tmp_path: Path, lines: list[dict]) -> Path:
    path = tmp_path / "runs.jsonl"
    path.write_text("# synthetic runs\n\n" + "\n".join(json.dumps(x) for x in lines) + "\n")
    return path


def test_calibrate_recovers_known_parameters(tmp_path: Path, synthetic_lines: list[dict]) -> None:
    runs_file = _write(tmp_path, synthetic_lines)
    profile = tmp_path / "my-cluster.yaml"
    r = CliRunner().invoke(cli, ["calibrate", str(runs_file), "--gpu", "h100-sxm", "-o", str(profile), "--no-loo",
                                 "--format", "json"])
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    assert set(out["fitted"]) == set(DEFAULT_FIT_FIELDS) - {"tp_overlap"}
    assert out["held"] == ["tp_overlap"]
    for name, value in TRUE.items():
        assert out["parameters"][name]["after"] == pytest.approx(value, rel=0.02), name
    assert out["mape_before"] > 0.05 and out["mape_after"] < 0.005

    # The profile is the format build_cluster reads, and `estimate --cluster` then reproduces the runs.
    data = yaml.safe_load(profile.read_text())
    assert data["gpu"] == "h100-sxm" and data["gpus_per_node"] == 8
    cluster = build_cluster("h100-sxm", 64, profile=profile)
    for name, value in TRUE.items():
        assert getattr(cluster.efficiency, name) == pytest.approx(value, rel=0.02)
    line = synthetic_lines[4]  # llama3-70b on 64 GPUs, tp8 pp4
    r = CliRunner().invoke(cli, ["estimate", "--model", "llama3-70b", "--gpus", "64", "--tp", "8", "--pp", "4",
                                 "--global-batch-size", "128", "--seq-len", "4096", "--cluster", str(profile),
                                 "--format", "json"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["prediction"]["step_time_s"] == pytest.approx(line["measured_step_time_s"], rel=0.01)


def test_fit_is_bounded_and_reports_identifiability(synthetic_lines: list[dict]) -> None:
    runs = [resolve_run(MeasuredRun.model_validate(x)) for x in synthetic_lines[:4]]
    # Runs 800x slower than the model can explain: every parameter runs into its physical bound, none beyond.
    slow = [replace(r, measured_step_time_s=r.measured_step_time_s * 800) for r in runs]
    res = fit(slow, efficiency_catalog()["hopper"], ("gemm_max", "moe_imbalance"))
    lo, _ = PHYSICAL_BOUNDS["gemm_max"]
    assert res.efficiency.gemm_max == pytest.approx(lo)
    assert "gemm_max" in res.at_bound
    assert res.held == ["moe_imbalance"]  # dense runs cannot see the MoE imbalance


def test_leave_one_out_on_noise_free_runs(synthetic_lines: list[dict]) -> None:
    runs: list[ResolvedRun] = [resolve_run(MeasuredRun.model_validate(x)) for x in synthetic_lines[:5]]
    errors = leave_one_out(runs, efficiency_catalog()["hopper"], ("gemm_max", "attention"), prior_weight=0.0)
    assert len(errors) == 5
    # Only two of the six true parameters are free, so a held-out run is predicted as well as the fit allows.
    base = fit(runs, efficiency_catalog()["hopper"], ("gemm_max", "attention"), prior_weight=0.0)
    assert max(abs(e) for e in errors) < max(0.02, 3 * max(abs(e) for e in base.errors_after))


def test_calibrate_table_output_and_loo(tmp_path: Path, synthetic_lines: list[dict]) -> None:
    runs_file = _write(tmp_path, synthetic_lines[:4])
    profile = tmp_path / "p.yaml"
    r = CliRunner().invoke(cli, ["calibrate", str(runs_file), "-o", str(profile), "--fit", "gemm_max,attention"])
    assert r.exit_code == 0, r.output
    assert "leave-one-out" in r.stdout and "gemm_max" in r.stdout and profile.is_file()
    assert profile.read_text().startswith("# autoplan cluster profile")


def test_software_setting_is_applied_not_fitted(synthetic_lines: list[dict]) -> None:
    line = {**synthetic_lines[0], "software": {"flash_attention": False}}
    run = resolve_run(MeasuredRun.model_validate(line))
    assert run.cluster_with().efficiency.flash_attention is False
    assert run.predict() > resolve_run(MeasuredRun.model_validate(synthetic_lines[0])).predict()


@pytest.mark.parametrize("content, message", [
    ('{"model": "llama3-8b"}', "required field missing"),
    ('{"model": "llama3-8b", "cluster": {"num_gpus": 8}, "measured_step_time_s": 1, "speed": 3}', "unknown field"),
    ("not json", "invalid JSON"),
    ('{"model": "nope-9b", "cluster": {"num_gpus": 8}, "measured_step_time_s": 1}', "unknown model"),
    ('{"model": "llama3-8b", "cluster": {"num_gpus": 8}, "parallel": {"tp": 3}, "measured_step_time_s": 1}',
     "tp=3"),
    ('{"model": "llama3-8b", "cluster": {"num_gpus": 8}, "measured_step_time_s": 1, '
     '"software": {"fast": true}}', "unknown software setting"),
    ("", "holds no runs"),
])
def test_bad_run_files(tmp_path: Path, content: str, message: str) -> None:
    path = tmp_path / "runs.jsonl"
    path.write_text(content + "\n")
    r = CliRunner().invoke(cli, ["calibrate", str(path), "-o", str(tmp_path / "p.yaml")])
    assert r.exit_code == 2
    assert message in r.stderr and "Traceback" not in r.output


def test_a_bad_run_among_good_ones_is_named(tmp_path: Path, synthetic_lines: list[dict]) -> None:
    """The run whose layout is refused is named by line and name (was the bare 'tp=3 does not divide ...', with
    nothing saying which of the file's runs)."""
    bad = {**synthetic_lines[1], "name": "the-bad-one", "parallel": {**synthetic_lines[1]["parallel"], "tp": 3}}
    path = _write(tmp_path, [synthetic_lines[0], bad])  # a comment and a blank line first: the run is on line 4
    r = CliRunner().invoke(cli, ["calibrate", str(path), "-o", str(tmp_path / "p.yaml")])
    assert r.exit_code == 2 and f"{path}:4 (run 'the-bad-one'): tp=3 does not divide" in r.stderr, r.output


def test_bad_fit_field_and_gpu_mismatch(tmp_path: Path, synthetic_lines: list[dict]) -> None:
    runs_file = _write(tmp_path, synthetic_lines[:2])
    r = CliRunner().invoke(cli, ["calibrate", str(runs_file), "-o", str(tmp_path / "p.yaml"), "--fit", "speed"])
    assert r.exit_code == 2 and "unknown parameter" in r.output
    r = CliRunner().invoke(cli, ["calibrate", str(runs_file), "-o", str(tmp_path / "p.yaml"), "--gpu", "a100-80g"])
    assert r.exit_code == 2 and "a100-80g" in r.stderr


def test_load_runs_skips_comments(tmp_path: Path, synthetic_lines: list[dict]) -> None:
    runs = load_runs(_write(tmp_path, synthetic_lines[:3]))
    assert len(runs) == 3 and runs[0].model == "llama3-8b"


def test_measured_run_matches_estimate_inputs(synthetic_lines: list[dict]) -> None:
    """A run line means exactly what the same flags mean to `autoplan estimate`."""
    run = resolve_run(MeasuredRun.model_validate(synthetic_lines[2]))
    direct = estimate(load_model("llama3-8b"), build_cluster("h100-sxm", 64),
                      JobSpec(global_batch_size=128, seq_len=8192, precision="bf16"),
                      ParallelConfig(tp=4, pp=2, micro_batch_size=1, sequence_parallel=True, zero_stage=1))
    assert run.predict() == pytest.approx(direct.step_time_s, rel=1e-12)


def test_every_fittable_parameter_is_an_efficiency_field() -> None:
    from cost_models.specs import Efficiency

    assert set(PHYSICAL_BOUNDS) <= set(Efficiency.model_fields)
    for name, (lo, hi) in PHYSICAL_BOUNDS.items():
        assert lo < hi, name
    for gen, eff in efficiency_catalog().items():
        for name, (lo, hi) in PHYSICAL_BOUNDS.items():
            assert lo <= getattr(eff, name) <= hi or name == "nvls_bus" and getattr(eff, name) == 0.0, (gen, name)


@pytest.mark.parametrize("target,knobs,zero", [("torchtitan", {}, 3), ("fsdp2", {}, 3),
                                               ("megatron", {"optimizer": "muon"}, 0), ("megatron", {}, 1)])
def test_a_run_without_zero_stage_takes_its_targets_default(target: str, knobs: dict, zero: int) -> None:
    """A runs-file line that leaves zero_stage unset is resolved as ``autoplan estimate`` resolves the same flags
    (``TargetProfile.with_defaults``): torchtitan / fsdp2 run FSDP (3), Megatron's Muon 0; the check then passes
    and the run is priced at that stage, not at the generic default 1 that torchtitan has no form of."""
    line = {"model": "llama3-8b", "cluster": {"gpu": "h100-sxm", "num_gpus": 8}, "target": target, "knobs": knobs,
            "job": {"global_batch_size": 16, "seq_len": 4096}, "parallel": {"tp": 1, "pp": 1},
            "measured_step_time_s": 1.0}
    run = resolve_run(MeasuredRun.model_validate(line))
    assert run.parallel.zero_stage == zero
