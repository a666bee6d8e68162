"""One path from a user's layout to what is priced (``TargetProfile.prepare``), and the API cache keyed on it."""

from __future__ import annotations

import pytest

from autoplan.api import Engine
from autoplan.emit.plan import priced_software
from autoplan.errors import AutoplanError
from cost_models.errors import ConfigError
from cost_models.estimate import estimate
from cost_models.specs import JobSpec, ParallelConfig
from cost_models.targets import PROFILES, REFERENCE_PROFILES, profile_for
from autoplan.catalog import load_model
from autoplan.catalog.cluster import build_cluster

TT_8B = {"model": "llama3-8b", "cluster": {"gpu": "h100-sxm", "num_gpus": 16},
         "job": {"global_batch_size": 64, "seq_len": 4096}, "target": "torchtitan"}
GQA_TP16 = {"model": "llama3-70b", "cluster": {"gpu": "gb200", "num_gpus": 64},
            "job": {"global_batch_size": 64, "seq_len": 4096}}


def test_profile_for_names_framework_and_reference_profiles() -> None:
    assert profile_for("megatron") is PROFILES["megatron"]
    assert profile_for("torchtitan-2024-12") is REFERENCE_PROFILES["torchtitan-2024-12"]
    assert profile_for("any") is None and profile_for(None) is None and profile_for("deepseek") is None


def test_unset_zero_stage_and_explicit_one_are_answered_apart_in_either_order() -> None:
    """The response cache once keyed both on the same dump: whichever came first answered both."""
    for order in ((1, None), (None, 1)):
        engine = Engine()
        for z in order:
            req = {**TT_8B, "parallel": {"tp": 2, **({} if z is None else {"zero_stage": z})}}
            if z == 1:
                with pytest.raises(AutoplanError, match="zero_stage=1"):
                    engine.estimate(req)
            else:
                assert engine.estimate(req).parallel.zero_stage == 3


def test_kv_replication_mode_is_the_targets() -> None:
    """tp 16 > 8 KV heads: Megatron gathers, fsdp2 replicates; the other mode is refused, unset takes the target's."""
    engine = Engine()
    with pytest.raises(AutoplanError, match="kv_replication=replicate.*valid: gather"):
        engine.estimate({**GQA_TP16, "target": "megatron", "parallel": {"tp": 16, "kv_replication": "replicate"}})
    with pytest.raises(AutoplanError, match="kv_replication=gather.*valid: replicate"):
        engine.estimate({**GQA_TP16, "target": "fsdp2", "parallel": {"tp": 16, "kv_replication": "gather"}})
    unset = engine.estimate({**GQA_TP16, "target": "fsdp2", "parallel": {"tp": 16}})
    assert unset.parallel.kv_replication == "replicate"
    explicit = engine.estimate({**GQA_TP16, "target": "fsdp2", "parallel": {"tp": 16, "kv_replication": "replicate"}})
    assert explicit.prediction.step_time_s == unset.prediction.step_time_s


def test_cost_model_check_applies_the_kv_rule() -> None:
    model = load_model("llama3-70b")
    job = JobSpec(global_batch_size=64, seq_len=4096)
    par = ParallelConfig(tp=16, kv_replication="replicate")
    with pytest.raises(ConfigError, match="megatron replicates KV heads by gather"):
        estimate(model, build_cluster("gb200", 64, target="megatron"), job, par, target="megatron")
    fsdp = par.model_copy(update={"zero_stage": 3})
    assert estimate(model, build_cluster("gb200", 64, target="fsdp2"), job, fsdp, target="fsdp2").step_time_s > 0


def test_prepare_runs_torchtitan_zero0_with_cp_as_fsdp() -> None:
    """prepare returns the layout torchtitan really runs and says so (runs_as)."""
    model = load_model("llama3-8b")
    cluster = build_cluster("h100-sxm", 16, target="torchtitan")
    job = JobSpec(global_batch_size=16, seq_len=8192)
    prep = PROFILES["torchtitan"].prepare(model, cluster, job, ParallelConfig(cp=2, zero_stage=0))
    assert prep.par.zero_stage == 0 and prep.runs != prep.par and prep.note
    assert prep.runtime.target == "torchtitan"


def test_a_torchtitan_plan_of_a_model_torchtitan_ships_none_of_says_so() -> None:
    """search / estimate price torchtitan's rules on any model (a user may register one with torchtitan), but
    torchtitan 0.3.0 ships no Mixtral flavor and ``emit --target torchtitan`` refuses it: every prediction says so
    (TorchtitanProfile.model_notes over torchtitan_models.SHIPPED, the table the emitter reads); a shipped model
    and the never-emitted reference profiles carry no such note."""
    engine = Engine()
    job = {"cluster": {"gpu": "h100-sxm", "num_gpus": 16}, "job": {"global_batch_size": 32, "seq_len": 4096},
           "target": "torchtitan"}
    est = engine.estimate({**job, "model": "mixtral-8x7b", "parallel": {"ep": 8}})
    assert any(n.startswith("not emittable for torchtitan 0.3.0") and "does not ship mixtral-8x7b" in n
               for n in est.prediction.notes), est.prediction.notes
    found = engine.search({**job, "model": "mixtral-8x7b", "top": 1})
    assert any(n.startswith("not emittable") for n in found.plans[0].prediction.notes)
    shipped = engine.estimate({**job, "model": "llama3-8b", "parallel": {"tp": 1}})
    assert not any(n.startswith("not emittable") for n in shipped.prediction.notes)
    assert REFERENCE_PROFILES["torchtitan-2024-12"].model_notes(load_model("mixtral-8x7b")) == []


@pytest.mark.parametrize("target", ["megatron", "torchtitan", "fsdp2"])
def test_a_searched_plan_and_its_estimate_carry_the_same_kv_mode(target: str) -> None:
    """Where tp divides the KV heads the mode is ignored, but a plan must echo what an estimate of the same layout
    echoes: fsdp2 plans said 'gather' (the generic default) while estimating them said 'replicate'."""
    engine = Engine()
    req = {"model": "llama3-8b", "cluster": {"gpu": "h100-sxm", "num_gpus": 8},
           "job": {"global_batch_size": 64, "seq_len": 4096}, "target": target}
    plans = engine.search({**req, "top": 3}).plans
    assert plans
    for plan in plans:
        degrees = plan.parallel.model_dump(exclude={"kv_replication"}, exclude_defaults=True)
        knobs = priced_software(plan.prediction.software).given()  # the plan's knobs, as compare re-prices it
        est = engine.estimate({**req, "parallel": degrees, "software": knobs})
        assert est.parallel.kv_replication == plan.parallel.kv_replication == PROFILES[target].kv_default
