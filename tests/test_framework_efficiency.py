"""``estimate --target`` prices with the target framework's efficiency parameters (gpus.yaml ``frameworks``, fitted
on that framework's published runs): what the calibration fits is what a user's estimate and search use."""

from __future__ import annotations

import pytest

from autoplan import api
from autoplan.calibrate import MeasuredRun, resolve_run
from autoplan.catalog.cluster import target_kernel_fields
from autoplan.catalog.registry import efficiency_for_gpu, framework_efficiency, load_gpu, resolve_over
from autoplan.emit.plan import priced_software
from autoplan.request import ClusterRequest
from cost_models.targets import PROFILES, framework_of

CASE = {"model": "llama3-8b", "cluster": {"gpu": "h100-sxm", "num_gpus": 64},
        "job": {"global_batch_size": 256, "seq_len": 8192},
        "parallel": {"tp": 2, "pp": 1, "zero_stage": 3, "micro_batch_size": 1}}


@pytest.mark.parametrize("knobs", [{}, {"compile": True}, {"compile": True, "async_tp": True}])
def test_torchtitan_estimate_equals_the_calibrated_model(knobs: dict) -> None:
    """The API's estimate for target torchtitan is the prediction calibrate fits (resolve_run applies the same
    framework parameters): equal to 1e-9, and not Megatron's price."""
    assert framework_efficiency("torchtitan"), "gpus.yaml holds torchtitan parameters"
    run = MeasuredRun(**CASE, measured_step_time_s=1.0, target="torchtitan", knobs=knobs)
    calibrated = resolve_run(run).predict()
    est = api.estimate({**CASE, "target": "torchtitan", "software": knobs}).prediction.step_time_s
    assert est == pytest.approx(calibrated, rel=1e-9)
    megatron_eff = api.Engine().estimate({**CASE, "parallel": {**CASE["parallel"], "zero_stage": 1},
                                          "target": "megatron"}).prediction.step_time_s
    assert est != pytest.approx(megatron_eff, rel=1e-3)


def test_cluster_resolves_the_framework_parameters_then_the_profile() -> None:
    req = ClusterRequest(gpu="h100-sxm", num_gpus=8)
    base, tt = req.resolve(), req.resolve("torchtitan")
    entry = framework_efficiency("torchtitan")
    kernel = target_kernel_fields("torchtitan", "hopper")  # 0.3.0 runs cuDNN SDPA on H100: attention_fa2 off
    assert kernel == {"attention_fa2": False}
    for field, value in {**entry, **kernel}.items():
        if field != "scale":
            assert getattr(tt.efficiency, field) == value
    for field, ratio in entry["scale"].items():
        assert getattr(tt.efficiency, field) == pytest.approx(getattr(base.efficiency, field) * ratio, rel=1e-12)
    # Megatron-Core is the reference the generations are fitted on: its one override is its MoE host cost (per layer
    # and per local expert)
    host = {"moe_host_s_per_layer", "moe_host_s_per_expert"}
    assert set(framework_efficiency("megatron")) == host
    mega = req.resolve("megatron")
    for field in host:
        assert getattr(mega.efficiency, field) == framework_efficiency("megatron")[field] > 0
    assert mega.efficiency.model_copy(update=dict.fromkeys(host, 0.0)) == base.efficiency
    assert mega.model_copy(update={"efficiency": base.efficiency}) == base
    assert req.resolve("any") == base


def test_search_and_estimate_agree_for_torchtitan() -> None:
    """The search's best torchtitan plan, re-estimated with its layout, has the same step time (the Scorer and the
    estimate see the same cluster efficiency)."""
    req = {"model": "llama3-8b", "cluster": {"gpu": "h100-sxm", "num_gpus": 16},
           "job": {"global_batch_size": 64, "seq_len": 4096}, "target": "torchtitan", "top": 1}
    best = api.search(req).plans[0]
    est = api.estimate({**{k: v for k, v in req.items() if k != "top"},
                        "parallel": best.parallel.model_dump(exclude_none=True),
                        "software": priced_software(best.prediction.software).given()})  # the knobs it chose
    assert est.prediction.step_time_s == pytest.approx(best.prediction.step_time_s, rel=1e-6)


@pytest.mark.parametrize("target", ["torchtitan", "fsdp2", "megatron"])
def test_emit_estimate_and_search_price_a_plan_alike(target: str, tmp_path) -> None:
    """One plan, one target: the search's prediction, ``estimate`` of its layout and what ``emit --plan`` prices
    before writing (its own CLI path: ``resolve_plan`` → ``price``) agree to 1e-9, because all three resolve the
    cluster through ``ClusterRequest.resolve(target)`` (the efficiency set the target's profile names)."""
    import json

    from autoplan.cli.emit_cmd import emit_cmd, resolve_plan, with_target_defaults
    from autoplan.emit import price

    req = {"model": "llama3-8b", "cluster": {"gpu": "h100-sxm", "num_gpus": 16},
           "job": {"global_batch_size": 64, "seq_len": 4096}, "target": target, "top": 1}
    found = api.search(req)
    best = found.plans[0]
    est = api.estimate({**{k: v for k, v in req.items() if k != "top"},
                        "parallel": best.parallel.model_dump(exclude_none=True),
                        "software": {k: v for k, v in best.prediction.software.items()
                                     if k in PROFILES[target].knobs}}).prediction
    plan_file = tmp_path / "plan.json"
    plan_file.write_text(json.dumps(found.model_dump(mode="json")))
    kw = dict(emit_cmd.make_context("emit", ["--target", target, "-o", str(tmp_path / "out"),
                                             "--plan", str(plan_file)]).params)
    for key in ("target", "out_dir", "allow_over_memory"):
        kw.pop(key)
    emitted = price(with_target_defaults(resolve_plan(kw, target), target), target)
    assert est.step_time_s == pytest.approx(best.prediction.step_time_s, rel=1e-9)
    assert emitted.step_time_s == pytest.approx(best.prediction.step_time_s, rel=1e-9)
    assert emitted.peak_memory_gib == pytest.approx(best.prediction.peak_memory_gib, rel=1e-9)
    if target != "megatron":  # the target's own efficiency set is what all three priced with
        meg = api.estimate({**{k: v for k, v in req.items() if k not in ("top", "target")},
                            "parallel": {**best.parallel.model_dump(exclude_none=True), "zero_stage": 1}})
        assert meg.prediction.step_time_s != pytest.approx(est.step_time_s, rel=1e-6)


def test_emit_keeps_a_cluster_profile_over_the_target_efficiency(tmp_path) -> None:
    """A cluster profile's own fields win over the target's efficiency set on every path: emit resolves the cluster
    once for its target (it used to lay torchtitan's ``gemm_max`` over the profile's a second time)."""
    from autoplan.cli.emit_cmd import emit_cmd, resolve_plan, with_target_defaults
    from autoplan.emit import price

    prof = tmp_path / "cluster.yaml"
    prof.write_text("gpu: h100-sxm\nefficiency: {gemm_max: 0.71}\n")
    args = ["--model", "llama3-8b", "--gpus", "16", "--global-batch-size", "64", "--seq-len", "4096",
            "--tp", "2", "--pp", "1", "--zero", "3", "--cluster", str(prof)]
    kw = dict(emit_cmd.make_context("emit", ["--target", "torchtitan", "-o", str(tmp_path / "o"), *args]).params)
    for key in ("target", "out_dir", "allow_over_memory"):
        kw.pop(key)
    plan = with_target_defaults(resolve_plan(kw, "torchtitan"), "torchtitan")
    assert plan.cluster.efficiency.gemm_max == 0.71
    est = api.estimate({"model": "llama3-8b", "cluster": {"gpu": "h100-sxm", "num_gpus": 16, "profile": str(prof)},
                        "job": {"global_batch_size": 64, "seq_len": 4096}, "target": "torchtitan",
                        "parallel": {"tp": 2, "pp": 1, "zero_stage": 3}})
    assert price(plan, "torchtitan").step_time_s == pytest.approx(est.prediction.step_time_s, rel=1e-9)


# ---- framework kernel efficiencies as ratios to the GPU's own value (gpus.yaml frameworks: <f>: scale:) ----------
def test_the_ratio_fields_are_stored_as_ratios_and_the_overlaps_absolute() -> None:
    """calibrate.FRAMEWORK_RATIO_FIELDS (the stack's kernels relative to Megatron-Core/TE's) sit under ``scale``; the
    overlap shares (facts of the stack's schedule) are absolute."""
    from autoplan.calibrate import FRAMEWORK_FIT_FIELDS, FRAMEWORK_RATIO_FIELDS

    entry = framework_efficiency("torchtitan")
    assert set(entry["scale"]) == set(FRAMEWORK_RATIO_FIELDS) == {"gemm_max", "fp8_gemm_speedup"}
    assert set(FRAMEWORK_FIT_FIELDS) - set(FRAMEWORK_RATIO_FIELDS) == {"tp_overlap", "dp_overlap"} <= set(entry)


def test_the_ratios_give_the_hopper_fit_back_as_written() -> None:
    """Fitted on Hopper, stored as ratios to hopper's written values: on Hopper they give back a value of the fit's
    written precision (4 decimals) to 1e-9 — so every calibration run (all Hopper) is priced as with the fit's
    absolute values. The prices of the 14 torchtitan calibration runs with those rounded absolutes equal the
    catalog's to 1e-9."""
    from benchmark_modules import load_benchmark

    fidelity = load_benchmark("fidelity", "fidelity")
    entry = framework_efficiency("torchtitan")
    hopper = efficiency_for_gpu("h100-sxm-96g")
    absolute = {f: round(getattr(hopper, f) * r, 4) for f, r in entry["scale"].items()}
    for field, ratio in entry["scale"].items():
        assert getattr(hopper, field) * ratio == pytest.approx(absolute[field], rel=1e-9), field
    runs = [r for _, r in fidelity.calibration_runs() if framework_of(r.target) == "torchtitan"]
    assert len(runs) == 14 and {r.cluster.gpu.generation for r in runs} == {"hopper"}
    for r in runs:
        written = r.cluster.efficiency.model_copy(update=absolute)
        assert r.predict() == pytest.approx(r.predict(written), rel=1e-9), r.name


@pytest.mark.parametrize("gpu", ["h100-sxm", "h200", "a100-80g", "b200", "gb300", "mi300x", "mi355x"])
def test_the_ratios_apply_to_each_gpus_own_value(gpu: str) -> None:
    """torchtitan on any GPU: its gemm_max / fp8 speed-up are the GPU's own (generation's with the GPU's facts) times
    the stored ratio — MI300X's cdna3 prior is lowered by torchtitan's ratio, not raised to Hopper's fitted absolute;
    GB300's measured GEMM scale is kept — and the overlap shares are the stack's, on every GPU."""
    entry = framework_efficiency("torchtitan")
    own = efficiency_for_gpu(gpu)
    tt = ClusterRequest(gpu=gpu, num_gpus=8).resolve("torchtitan").efficiency
    assert tt.gemm_max == pytest.approx(own.gemm_max * entry["scale"]["gemm_max"], rel=1e-12)
    assert tt.gemm_max < own.gemm_max  # below Megatron-Core/TE's on the same GPU, whatever the generation
    assert tt.fp8_gemm_speedup == pytest.approx(max(1.0, own.fp8_gemm_speedup * entry["scale"]["fp8_gemm_speedup"]))
    assert (tt.tp_overlap, tt.dp_overlap) == (entry["tp_overlap"], entry["dp_overlap"])
    if own.gemm_max < efficiency_for_gpu("h100-sxm").gemm_max:  # cdna3: not Hopper's fitted absolute (it was 0.698)
        assert tt.gemm_max < ClusterRequest(gpu="h100-sxm", num_gpus=8).resolve("torchtitan").efficiency.gemm_max


def test_fidelitys_fit_prices_a_framework_as_the_catalog_does() -> None:
    """``fidelity.predict_with`` (the fit's view: generation values + framework entries as stored) prices a
    torchtitan run on a GPU the framework was never fitted on as ``build_cluster`` does: the same ratios, applied
    to that run's generation."""
    from autoplan.catalog.registry import efficiency_catalog
    from benchmark_modules import load_benchmark

    fidelity = load_benchmark("fidelity", "fidelity")
    params = (efficiency_catalog(), {"torchtitan": framework_efficiency("torchtitan")})
    for gpu in ("mi300x", "b200", "h100-sxm", "mi325x", "gb300"):  # the last two: GPUs with their own facts
        run = resolve_run(MeasuredRun(**{**CASE, "cluster": {"gpu": gpu, "num_gpus": 64},
                                         "job": {**CASE["job"], "precision": "fp8"}}, measured_step_time_s=1.0,
                                      target="torchtitan", knobs={"compile": True, "fp8_recipe": "rowwise"}))
        assert fidelity.predict_with(run, params) == pytest.approx(run.predict(), rel=1e-12), gpu


@pytest.mark.parametrize("gpu", ["mi325x", "gb300", "h100-sxm"])
def test_the_generation_fit_sees_a_gpus_own_facts(gpu: str) -> None:
    """``calibrate.fit_joint`` fits a generation's values; a run on a GPU with its own gpus.yaml ``gpu_efficiency``
    (MI325X's GEMM ratio to MI300X, GB300's to GB200) is priced through that entry, as ``build_cluster`` prices it:
    at the generation's catalog values the fit's errors are the catalog's own (not MI300X's GEMMs on an MI325X)."""
    from autoplan.calibrate import fit_joint
    from autoplan.catalog.registry import efficiency_for

    run = resolve_run(MeasuredRun(**{**CASE, "cluster": {"gpu": gpu, "num_gpus": 64}}, measured_step_time_s=1.0))
    res = fit_joint([run], efficiency_for(load_gpu(gpu).generation), fields=(), fw_fields=())
    assert res.mape_before == pytest.approx(abs(run.predict() - 1.0), rel=1e-12)


def test_torchtitan_runs_cudnn_attention_where_its_profile_puts_it_first() -> None:
    """torchtitan's SDPA wrapper puts CUDNN_ATTENTION first (sdpa_kernel(set_priority=True)) on sm100 from 3b85aa31f
    (2025-05-14; models/attention.py:204-211 @ 6fc499f6, the B200 torchao run's commit) and on every CUDA GPU from
    6a3a9da95 (2025-10-09; 0.3.0): there the attention core is priced at the generation's cuDNN figure, 1/FA2_VS_CUDNN
    = 1/0.62 as fast as the FlashAttention-2 its 2024-12 runs (flash first: H100) and every ROCm build (no cuDNN)
    run. The held-out B200 group states no attention_fa2 of its own: the profile decides."""
    from autoplan.calibrate import on_gpu
    from autoplan.catalog.registry import efficiency_for
    from cost_models.gemm import attention_time_s
    from cost_models.specs import FA2_VS_CUDNN

    def cluster(gpu: str, target: str):
        return ClusterRequest(gpu=gpu, num_gpus=8).resolve(target)

    fa2 = {(g, t): cluster(g, t).efficiency.attention_fa2 for g in ("b200", "gb300", "h100-sxm", "mi300x")
           for t in ("torchtitan-2024-12", "torchtitan-2025-08", "torchtitan")}
    assert fa2 == {("b200", "torchtitan-2024-12"): True, ("b200", "torchtitan-2025-08"): False,
                   ("b200", "torchtitan"): False, ("gb300", "torchtitan-2024-12"): True,
                   ("gb300", "torchtitan-2025-08"): False, ("gb300", "torchtitan"): False,
                   ("h100-sxm", "torchtitan-2024-12"): True, ("h100-sxm", "torchtitan-2025-08"): True,
                   ("h100-sxm", "torchtitan"): False, ("mi300x", "torchtitan-2024-12"): True,
                   ("mi300x", "torchtitan-2025-08"): True, ("mi300x", "torchtitan"): True}
    # plain FSDP2 on torch 2.13: torch's own order prefers cuDNN on sm90/sm100 (cuDNN > 9.15.0), flash on A100
    assert [cluster(g, "fsdp2").efficiency.attention_fa2 for g in ("a100-80g", "h100-sxm", "b200", "mi300x")] == [
        True, False, False, True]
    old, new = cluster("b200", "torchtitan-2024-12"), cluster("b200", "torchtitan-2025-08")
    assert attention_time_s(1e12, new) == pytest.approx(attention_time_s(1e12, old) * FA2_VS_CUDNN, rel=1e-12)
    # the fit's view of a run (generation + framework entry, then calibrate.on_gpu) sees the same kernel
    run = resolve_run(MeasuredRun(**{**CASE, "cluster": {"gpu": "b200", "num_gpus": 64}}, measured_step_time_s=1.0,
                                  target="torchtitan-2025-08", knobs={"compile": True}))
    eff = efficiency_for("blackwell")
    assert on_gpu(eff.model_copy(update=resolve_over(eff, framework_efficiency("torchtitan"))), run).attention_fa2 is False
    # targets of one efficiency set that run different attention kernels do not share resolved specs
    assert api._efficiency_key("torchtitan-2025-08") != api._efficiency_key("torchtitan-2024-12")
    cases, rules = load_cases_heldout()
    assert "attention_fa2" not in rules["groups"]["torchao_mx_b200_2025_08"]["software"]


def load_cases_heldout():
    import json
    from pathlib import Path

    data = json.loads((Path(__file__).resolve().parents[1] / "benchmarks/data/more_runs_torchtitan.json").read_text())
    return data["cases"], {"groups": data["groups"]}


def test_fa2_stack_on_ampere_takes_the_fa2_figure_once() -> None:
    """Ampere's ``attention`` is a FlashAttention-2 prior (Dao 2023 §4.1, ``attention_measures_fa2``): a PyTorch
    stack running SDPA's FA2 there (fsdp2 on A100: flash first) is priced at it, not at FA2_VS_CUDNN (a Hopper
    FA2/cuDNN ratio) of it again; on Hopper, whose figure is cuDNN's, the ratio still applies to an FA2 stack."""
    from cost_models.gemm import attention_time_s
    from cost_models.specs import FA2_VS_CUDNN

    a100 = ClusterRequest(gpu="a100-80g", num_gpus=8)
    fsdp2, megatron = a100.resolve("fsdp2"), a100.resolve("megatron")
    assert fsdp2.efficiency.attention_fa2 and fsdp2.efficiency.attention_measures_fa2
    assert attention_time_s(1e12, fsdp2) == pytest.approx(attention_time_s(1e12, megatron), rel=1e-12)
    h100 = ClusterRequest(gpu="h100-sxm", num_gpus=8)
    old = h100.resolve("torchtitan-2024-12")  # flash first on H100: FA2 below the cuDNN figure
    assert not old.efficiency.attention_measures_fa2
    assert attention_time_s(1e12, old) == pytest.approx(attention_time_s(1e12, h100.resolve("megatron")) / FA2_VS_CUDNN,
                                                        rel=1e-12)
