"""SDPA's memory-efficient fallback for MLA (value head dim != query/key head dim) where torchtitan puts flash first
(``Runtime.sdpa_unequal_v_efficient``, ``op_cost.efficient_sdpa``): the catalog's measured rates recomputed from the
stored H200 probe, which runs and GPUs the rule covers, and what it does to the price of the attention core."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
from benchmark_modules import load_benchmark

from autoplan.calibrate import resolve_run
from cost_models.op_cost import efficient_sdpa, op_compute
from cost_models.opgraph import layer_graph
from cost_models.targets import runtime_for

ROOT = Path(__file__).resolve().parents[1]
PROBE = ROOT / "benchmarks" / "data" / "h200_sdpa_backend_probe_2026_12_04.json"
fidelity = load_benchmark("fidelity", "fidelity")


def _probe_rows() -> dict[tuple[str, bool], dict]:
    data = json.loads(PROBE.read_text())
    assert data["device"] == "NVIDIA H200" and data["torch"].startswith("2.11")
    return {(r["backend"], r["v_padded_to_qk"]): r for r in data["rows"] if r["case"] == "dsv3_16b"}


def _resolved(case_id: str, name: str = "more_runs_torchtitan_moe.json"):
    cases, rules = fidelity.load_cases(ROOT / "benchmarks" / "data" / name)
    return resolve_run(fidelity.to_run(next(c for c in cases if c["id"] == case_id), rules))


def test_catalog_rates_are_the_probes() -> None:
    rows = _probe_rows()
    eff, pad = rows[("efficient", False)], rows[("flash", True)]
    assert "same last dimension" in rows[("flash", False)]["error"] or "No available kernel" in \
        rows[("flash", False)]["error"]  # flash refused the unpadded MLA shape
    s = eff["shape"]

    def flops(d_v: int) -> float:  # causal forward FLOPs, each kernel on its own value head dim
        return 2.0 * s["b"] * s["h"] * s["s"] ** 2 * (s["d_qk"] + d_v) / 2

    fwd = (flops(s["d_v"]) / eff["fwd_ms"]) / (flops(s["d_qk"]) / pad["fwd_ms"])
    bwd = (flops(s["d_v"]) / eff["bwd_ms"]) / (flops(s["d_qk"]) / pad["bwd_ms"])
    hopper = _resolved("tt_dsv3_16b_h100_8gpu_sdpa").cluster.efficiency
    assert hopper.attention_efficient_fwd == pytest.approx(fwd, abs=5e-5)
    assert hopper.attention_efficient_bwd == pytest.approx(bwd, abs=5e-5)
    # the probe's own fwd+bwd ratio (3.5x forward FLOPs) from the same rows
    r = json.loads(PROBE.read_text())["ratios"]["dsv3_16b_r_flash_padded_over_efficient_rate_fwd_bwd"]
    assert r == pytest.approx(pad["fwd_bwd_tflops"] / eff["fwd_bwd_tflops"], abs=1e-3)


def test_probe_shape_is_the_run() -> None:
    run = _resolved("tt_dsv3_16b_h100_8gpu_sdpa")
    s, mla = _probe_rows()[("efficient", False)]["shape"], run.model.mla
    assert (s["d_qk"], s["d_v"], s["h"], s["s"], s["b"]) == (
        mla.qk_nope_head_dim + mla.qk_rope_head_dim, mla.v_head_dim, run.model.num_attention_heads,
        run.job.seq_len, run.parallel.micro_batch_size)


def test_rule_covers_flash_first_generations_of_the_2025_profiles_only() -> None:
    run = _resolved("tt_dsv3_16b_h100_8gpu_sdpa")
    assert run.target == "torchtitan-2025-08"
    rt = runtime_for(run.target, run.job, run.cluster, run.parallel, run.knobs)
    assert rt.sdpa_unequal_v_efficient and efficient_sdpa(run.model, run.cluster_with(), rt)
    blackwell = run.cluster.model_copy(update={"gpu": run.cluster.gpu.model_copy(update={"generation": "blackwell"})})
    assert not runtime_for(run.target, run.job, blackwell, run.parallel, run.knobs).sdpa_unequal_v_efficient
    for target in ("torchtitan", "megatron", "fsdp2"):  # cuDNN first on Hopper (torchtitan 0.3.0, fsdp2) / TE
        assert not runtime_for(target, run.job, run.cluster, run.parallel).sdpa_unequal_v_efficient, target
    assert runtime_for("torchtitan-2024-12", run.job, run.cluster, run.parallel).sdpa_unequal_v_efficient


def test_attention_core_priced_at_the_efficient_rates() -> None:
    run = _resolved("tt_dsv3_16b_h100_8gpu_sdpa")
    cluster = run.cluster_with()
    rt = runtime_for(run.target, run.job, run.cluster, run.parallel, run.knobs)
    graph = layer_graph(run.model, "moe", run.job.seq_len)
    core = next(op for op in graph.ops if op.kind == "attention")
    on = op_compute(core, graph, run.model, cluster, run.job, run.parallel, rt)
    flash = replace(rt, sdpa_unequal_v_efficient=False)
    off = op_compute(core, graph, run.model, cluster, run.job, run.parallel, flash)
    eff = cluster.efficiency
    assert on.attn_f == pytest.approx(off.attn_f / eff.attention_efficient_fwd, rel=1e-12)
    assert on.attn_b == pytest.approx(off.attn_b / eff.attention_efficient_bwd, rel=1e-12)
    assert on.attn_f + on.attn_b > 3.5 * (off.attn_f + off.attn_b)


def test_equal_head_dims_keep_flash() -> None:
    run = _resolved("tt_dsv3_16b_h100_8gpu_sdpa")
    rt = runtime_for(run.target, run.job, run.cluster, run.parallel, run.knobs)
    mla = run.model.mla
    same = run.model.model_copy(update={"mla": mla.model_copy(update={"v_head_dim": mla.qk_nope_head_dim
                                                                                   + mla.qk_rope_head_dim})})
    assert not efficient_sdpa(same, run.cluster_with(), rt)
    no_mla = run.model.model_copy(update={"mla": None})
    assert not efficient_sdpa(no_mla, run.cluster_with(), rt)


def test_no_calibration_run_takes_the_rule() -> None:
    # the fit (benchmarks/fidelity.py calibration_runs) is untouched: none of its runs has unequal head dims on a
    # flash-first SDPA stack
    for case, run in fidelity.calibration_runs():
        rt = runtime_for(run.target, run.job, run.cluster, run.parallel, run.knobs)
        assert not efficient_sdpa(run.model, run.cluster_with(), rt), case["id"]
