"""``--target any``: the best plan that some target profile runs, each candidate priced with its own target's
runtime, knobs and efficiency set, and labelled with that target (which ``emit`` writes for)."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from autoplan import api
from autoplan.catalog import build_cluster, load_model
from autoplan.cli import cli
from autoplan.emit import TARGETS, check_emittable
from autoplan.emit.plan import plan_from_dict, priced_software
from autoplan.errors import ConfigError
from cost_models.specs import JobSpec
from cost_models.targets import PROFILES
from search.space import Tally, enumerate_layouts

REQ = {"model": "llama3-8b", "cluster": {"gpu": "h100-sxm", "num_gpus": 16},
       "job": {"global_batch_size": 64, "seq_len": 4096}, "top": 3}


def test_any_is_the_best_plan_of_the_targets_each_priced_as_it_runs() -> None:
    """any's best = the best of every target's own search (same cost to 1e-9, same target); every plan is one its
    target accepts, and ``estimate --target <plan.target>`` of its layout prices it the same (cluster, runtime)."""
    found = api.search({**REQ, "target": "any"})
    per_target = {t: api.search({**REQ, "target": t, "top": 1}).plans[0] for t in PROFILES}
    best_t = min(per_target, key=lambda t: (per_target[t].prediction.composite_cost, list(PROFILES).index(t)))
    assert found.plans[0].target == best_t
    assert found.plans[0].prediction.composite_cost == pytest.approx(
        per_target[best_t].prediction.composite_cost, rel=1e-9)
    data = found.model_dump(mode="json")
    for i, plan in enumerate(found.plans):
        assert plan.target in TARGETS
        assert plan.prediction.software["target"] == plan.target
        est = api.estimate({**{k: v for k, v in REQ.items() if k != "top"}, "target": plan.target,
                            "parallel": plan.parallel.model_dump(exclude_none=True),
                            "software": priced_software(plan.prediction.software).given()}).prediction
        assert est.step_time_s == pytest.approx(plan.prediction.step_time_s, rel=1e-9)
        assert est.peak_memory_gib == pytest.approx(plan.prediction.peak_memory_gib, rel=1e-9)
        check_emittable(plan_from_dict(data, i + 1, target=plan.target), plan.target)


def test_any_enumerates_only_what_some_profile_runs() -> None:
    """No schedule, ZeRO stage or layout in ``any`` that the labelled target's profile refuses: ZB-H1 and ZeRO-2
    (priced by the cost model) enter only when a profile lists them."""
    model, cluster = load_model("llama3-8b"), build_cluster("h100-sxm", 64)
    layouts = list(enumerate_layouts(model, cluster, JobSpec(global_batch_size=64, seq_len=8192), "any", {}, Tally()))
    assert {lay.target for lay in layouts} == set(PROFILES)
    for lay in layouts:
        prof = PROFILES[lay.target]
        assert lay.schedule in prof.schedules or lay.pp == 1
        assert lay.zero_stage in prof.zero_stages
        assert prof.layout_error(model, tp=lay.tp, pp=lay.pp, cp=lay.cp, ep=lay.ep, zero=lay.zero_stage,
                                 hsdp=lay.hsdp_shard_size, dp_cp=lay.dp * lay.cp, schedule=lay.schedule) is None
    offered = {s for p in PROFILES.values() for s in p.schedules}
    assert {lay.schedule for lay in layouts} <= offered | {"1f1b"}
    assert "zb-h1" in offered or all(lay.schedule != "zb-h1" for lay in layouts)


def test_any_with_knobs_searches_the_targets_that_have_them() -> None:
    have = [t for t, p in PROFILES.items() if "compile" in p.knobs]
    found = api.search({**REQ, "target": "any", "software": {"compile": True}})
    assert found.plans and all(p.target in have for p in found.plans)
    with pytest.raises(ConfigError, match="no target runs the knobs"):  # Megatron's knob with torch.compile
        api.search({**REQ, "target": "any", "software": {"compile": True, "tp_comm_overlap": True}})


def test_search_any_emits_for_the_target_of_its_best_plan(tmp_path) -> None:
    res = CliRunner().invoke(cli, ["search", "--model", "llama3-8b", "--gpus", "16", "--global-batch-size", "64",
                                   "--seq-len", "4096", "--target", "any", "--top", "1", "--format", "json",
                                   "--emit", str(tmp_path)])
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)
    assert data["emitted"]["target"] == data["plans"][0]["target"] and data["emitted"]["files"]


def test_compare_prices_searched_plans_for_the_target_that_runs_them() -> None:
    """``compare '#1' --target torchtitan`` compares the torchtitan search's plan as torchtitan runs it (it was
    re-estimated as Megatron before)."""
    found = api.search({**REQ, "target": "torchtitan", "top": 1}).plans[0]
    res = CliRunner().invoke(cli, ["compare", "#1", "#1", "--model", "llama3-8b", "--gpus", "16",
                                   "--global-batch-size", "64", "--seq-len", "4096", "--target", "torchtitan",
                                   "--format", "json"])
    assert res.exit_code == 0, res.output
    got = json.loads(res.stdout)["plans"][0]
    assert got["prediction"]["step_time_s"] == pytest.approx(found.prediction.step_time_s, rel=1e-9)


def test_search_any_table_names_each_plans_target() -> None:
    res = CliRunner().invoke(cli, ["search", "--model", "llama3-8b", "--gpus", "16", "--global-batch-size", "64",
                                   "--seq-len", "4096", "--target", "any", "--top", "2"])
    assert res.exit_code == 0, res.output
    heads = [line for line in res.stdout.splitlines() if line.startswith("#")]
    assert len(heads) == 2 and all(any(h.startswith(f"#{i + 1}  [{t}] ") for t in PROFILES) for i, h in enumerate(heads))


@pytest.mark.parametrize("target", ["megatron", "any"])
def test_a_pinned_schedule_no_target_runs_is_refused_like_estimate(target: str) -> None:
    """ZB-H1 is priced by the cost model but no profile runs it: a pin is the error ``estimate`` gives (it used to
    return ZB-H1 plans labelled megatron)."""
    with pytest.raises(ConfigError, match="schedule zb-h1: .*no such schedule") as err:
        api.search({**REQ, "target": target, "parallel": {"pp": 2, "schedule": "zb-h1"}})
    assert "zb-h1" not in err.value.valid and "1f1b" in err.value.valid
