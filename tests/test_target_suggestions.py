"""A target's refusal names the targets that accept what it refuses, computed from the profiles
(``cost_models.targets.common.targets_that``), not a name written into the message: every target it names runs the
layout / model / precision, every other target refuses it, and with none it says so."""

from __future__ import annotations

import re

import pytest

from autoplan.catalog import build_cluster, load_model
from autoplan.emit.torchtitan import balancing_warnings
from cost_models.errors import ConfigError
from cost_models.specs import JobSpec, ParallelConfig
from cost_models.targets import PROFILES, runtime_for

CLUSTER = build_cluster("h100-sxm", 16)
JOB = JobSpec(global_batch_size=16, seq_len=8192)


def _named(err: ConfigError) -> set[str]:
    m = re.search(r"use --target ([a-z0-9 ]+?)(?:;|$| for )", str(err))
    return set(m.group(1).split(" or ")) if m else set()


def _runs(target: str, model: str, par: ParallelConfig, job: JobSpec = JOB) -> bool:
    try:
        PROFILES[target].check(load_model(model), CLUSTER, job, par, runtime_for(target, job, CLUSTER, par))
    except ConfigError:
        return False
    return True


@pytest.mark.parametrize("model,par,job", [
    ("llama3-8b", ParallelConfig(cp=2, zero_stage=3), JOB),  # CP: megatron and torchtitan
    ("deepseek-v3", ParallelConfig(cp=2, zero_stage=3), JOB),  # torchtitan builds no MTP with CP: megatron only
    ("mixtral-8x7b", ParallelConfig(ep=2, zero_stage=3), JOB),  # torchtitan runs EP too
    ("nemotron-h-8b", ParallelConfig(zero_stage=3), JOB),  # a hybrid stack: megatron only
    ("llama3-8b", ParallelConfig(zero_stage=3), JOB.model_copy(update={"precision": "fp8"})),
], ids=["cp", "cp-mtp", "ep", "hybrid", "fp8"])
def test_fsdp2_refusals_name_exactly_the_targets_that_run_it(model: str, par: ParallelConfig, job: JobSpec) -> None:
    with pytest.raises(ConfigError) as info:
        prof = PROFILES["fsdp2"]
        prof.check(load_model(model), CLUSTER, job, par, prof.resolve(None, job, CLUSTER, par))
    named = _named(info.value)
    assert named, str(info.value)
    assert named == {t for t in PROFILES if t != "fsdp2" and _runs(t, model, par, job)}, str(info.value)
    assert {v.removeprefix("target ") for v in info.value.valid or [] if str(v).startswith("target ")} <= named


@pytest.mark.parametrize("field,value", [("pipeline_layout", "Etttttttttttttttt|ttttttttttttttttL"),
                                         ("recompute_modules", ("mlp",))])
def test_a_megatron_field_refusal_names_the_targets_with_that_setting(field: str, value: object) -> None:
    err = PROFILES["fsdp2"].megatron_field_error(field)
    assert err is not None
    assert _named(err) == {t for t, p in PROFILES.items() if field in p.megatron_fields}, str(err)


def test_a_refusal_no_target_accepts_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(type(PROFILES["megatron"]), "hybrid_models", False)
    err = PROFILES["fsdp2"].model_error(load_model("nemotron-h-8b"))
    assert err is not None and "no target runs it" in str(err) and "--target" not in str(err)
    assert not [v for v in err.valid or [] if str(v).startswith("target ")]


def test_torchtitan_balancing_warning_names_the_targets_that_train_the_loss(monkeypatch: pytest.MonkeyPatch) -> None:
    model = load_model("mixtral-8x7b")
    [warn] = [w for w in balancing_warnings(model) if "load-balancing loss" in w]
    assert warn.endswith("use --target megatron for the published balancing")
    monkeypatch.setattr(type(PROFILES["megatron"]), "trains_moe_aux_loss", False)
    [warn] = [w for w in balancing_warnings(model) if "load-balancing loss" in w]
    assert warn.endswith("no target emits this model with it") and "--target" not in warn


def test_advice_is_a_field_of_the_refusal_not_text_to_split() -> None:
    """``ConfigError.advice``: said after the rule, left out of ``reason``, which notes quote (torchtitan's 'not
    emittable' note split its refusals' text on '. Use another' before)."""
    from cost_models.targets.torchtitan_models import shipped_model_error

    err = ConfigError("rule broken", valid=[1, 2], advice="do this instead")
    assert str(err) == "rule broken; do this instead; valid: 1, 2" and err.reason == "rule broken"
    model = load_model("mixtral-8x22b")  # torchtitan 0.3.0 ships no flavor of its architecture
    refusal = shipped_model_error(model)
    assert refusal is not None and refusal.advice and refusal.advice.startswith("use another --target")
    assert "another --target" not in refusal.reason and str(refusal).endswith(refusal.advice)
    [note] = PROFILES["torchtitan"].model_notes(model)
    assert refusal.reason in note and "another --target" not in note


def test_fsdp2_ep_refusal_names_the_targets_that_run_the_pipeline_asked_for() -> None:
    """The EP refusal's advice checks the other targets at the layout's pp (it checked pp=1: at pp=2 it named
    torchtitan, which builds no MTP under PP). None runs DeepSeek-V3 with ep 8 and pp 2 at ZeRO-3 (Megatron-LM's
    torch FSDP2 has no EP either): the advice names Megatron with the ZeRO stage that runs it."""
    prof, model = PROFILES["fsdp2"], load_model("deepseek-v3")
    flat, piped = ParallelConfig(ep=8, zero_stage=3), ParallelConfig(pp=2, ep=8, zero_stage=3)
    with pytest.raises(ConfigError) as info:
        prof.check(model, CLUSTER, JOB, flat, prof.resolve(None, JOB, CLUSTER, flat))
    assert _named(info.value) == {"torchtitan"} and _runs("torchtitan", "deepseek-v3", flat), str(info.value)
    with pytest.raises(ConfigError) as info:
        prof.check(model, CLUSTER, JOB, piped, prof.resolve(None, JOB, CLUSTER, piped))
    assert "torchtitan" not in str(info.value)
    assert not any(_runs(t, "deepseek-v3", piped) for t in PROFILES if t != "fsdp2")
    assert str(info.value).endswith("use --target megatron with zero_stage 1; valid: 1"), str(info.value)
    assert _runs("megatron", "deepseek-v3", piped.model_copy(update={"zero_stage": 1}))


@pytest.mark.parametrize("model", ["deepseek-v3", "llama3-8b"])
def test_fsdp2_cp_refusal_names_the_stage_that_runs_the_pipeline_asked_for(model: str) -> None:
    """The CP refusal's advice, as the EP refusal's: DeepSeek-V3 with cp 2 and pp 2 runs on no target at ZeRO-3
    (Megatron-LM's torch FSDP2 refuses PP, torchtitan builds no MTP with PP or CP); it said 'no target runs it',
    and Megatron runs it at ZeRO-1, which it now names with the stage. Llama 3 8B at the same layout runs on
    torchtitan at ZeRO-3: the advice stays the targets that run it at the stage asked for."""
    prof, piped = PROFILES["fsdp2"], ParallelConfig(pp=2, cp=2, zero_stage=3)
    with pytest.raises(ConfigError) as info:
        prof.check(load_model(model), CLUSTER, JOB, piped, prof.resolve(None, JOB, CLUSTER, piped))
    msg = str(info.value)
    assert msg.startswith("cp=2: the fsdp2 target does not emit context parallelism; ") and "no target" not in msg
    at_three = {t for t in PROFILES if t != "fsdp2" and _runs(t, model, piped)}
    if at_three:
        assert _named(info.value) == at_three == {"torchtitan"} and "zero_stage" not in msg, msg
        return
    assert msg.endswith("use --target megatron with zero_stage 1; valid: cp=1"), msg
    assert _runs("megatron", model, piped.model_copy(update={"zero_stage": 1}))
    # a target named with a stage is one whose stages hold it: torchtitan has no ZeRO-1 and refuses it at both of its
    assert not any(_runs("torchtitan", model, piped.model_copy(update={"zero_stage": z})) for z in (0, 3))


def test_a_model_fsdp2_refuses_is_refused_by_its_model_rule_before_its_ep_rule() -> None:
    """Qwen3-Next (Gated DeltaNet) on fsdp2 with ep 8: the model rule (no degree helps), naming megatron, which runs
    the model with that ep; the EP rule came first and said no target runs it."""
    prof, par = PROFILES["fsdp2"], ParallelConfig(ep=8, zero_stage=3)
    with pytest.raises(ConfigError) as info:
        prof.check(load_model("qwen3-next-80b-a3b"), CLUSTER, JOB, par, prof.resolve(None, JOB, CLUSTER, par))
    msg = str(info.value)
    assert "Gated DeltaNet" in msg and "the fsdp2 target cannot run them" in msg and "ep=8" not in msg, msg
    assert _named(info.value) == {"megatron"}, msg
    assert _runs("megatron", "qwen3-next-80b-a3b", ParallelConfig(ep=8, zero_stage=1))
