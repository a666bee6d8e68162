"""``estimate --target`` prices with the target framework's efficiency parameters (gpus.yaml ``frameworks``, fitted
on that framework's published runs): what the calibration fits is what a user's estimate and search use."""

from __future__ import annotations

import pytest

from autoplan import api
from autoplan.calibrate import MeasuredRun, resolve_run
from autoplan.catalog.registry import framework_efficiency
from autoplan.request import ClusterRequest

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
    for field, value in framework_efficiency("torchtitan").items():
        assert getattr(tt.efficiency, field) == value
    assert req.resolve("megatron") == base  # Megatron-Core is the reference: no overrides
    assert req.resolve("any") == base


def test_search_and_estimate_agree_for_torchtitan() -> None:
    """The search's best torchtitan plan, re-estimated with its layout, has the same step time (the Scorer and the
    estimate see the same cluster efficiency)."""
    req = {"model": "llama3-8b", "cluster": {"gpu": "h100-sxm", "num_gpus": 16},
           "job": {"global_batch_size": 64, "seq_len": 4096}, "target": "torchtitan", "top": 1}
    best = api.search(req).plans[0]
    est = api.estimate({**{k: v for k, v in req.items() if k != "top"},
                        "parallel": best.parallel.model_dump(exclude_none=True)})
    assert est.prediction.step_time_s == pytest.approx(best.prediction.step_time_s, rel=1e-6)
