"""The search tries Megatron's selective-recompute module sets itself: the ladder of ``cost_models.recompute_ladder``
(modules cheapest re-run per byte freed first, each prefix a set), on every selective layout of a target that runs
``--recompute-modules``, beside Megatron's default ``core_attn``; a pin still sets one set."""

from __future__ import annotations

import pytest

from autoplan.catalog import build_cluster, load_model
from cost_models.memory import graphs_for
from cost_models.opgraph import kind_counts
from cost_models.recompute import module_errors
from cost_models.recompute_ladder import NO_LADDER, module_price
from cost_models.specs import RECOMPUTE_MODULES, JobSpec, ParallelConfig
from cost_models.targets import Software, runtime_for
from search.planner import search
from search.score import Scorer
from search.space import Tally, enumerate_layouts, module_ladder_for

JOB = JobSpec(global_batch_size=256, seq_len=4096)


def _price(model, cluster, job, module, software=None):  # type: ignore[no-untyped-def]
    """(seconds, bytes freed) of one module on the reference layout the ladder is ordered on."""
    par = ParallelConfig(micro_batch_size=1)
    return module_price(graphs_for(model, job.seq_len), kind_counts(model), model,
                        cluster, job, par, runtime_for("megatron", job, cluster, par, software), (module,))


@pytest.mark.parametrize("name", ["deepseek-v3", "llama3-8b", "mixtral-8x7b", "llama4-maverick-17b-128e"])
def test_ladder_is_nested_cheapest_per_byte_first_and_only_modules_that_free_bytes(name: str) -> None:
    model, cluster = load_model(name), build_cluster("h100-sxm", 256, target="megatron")
    ladder = module_ladder_for(model, cluster, JOB, "megatron").sets
    assert ladder, f"{name}: no module frees activations"
    added: list[str] = []
    for i, rung in enumerate(ladder):
        assert list(rung) == [m for m in RECOMPUTE_MODULES if m in rung]  # Megatron's order: equal sets compare equal
        prev = set(ladder[i - 1]) if i else set()
        new = set(rung) - prev
        assert prev < set(rung) and len(new) == 1  # each rung adds one module to the one below
        added.append(new.pop())
    ratios = []
    for m in added:
        assert module_errors(model, ParallelConfig(recompute_modules=(m,)), None) is None  # the model has it
        seconds, freed = _price(model, cluster, JOB, m)
        assert freed > 0
        ratios.append(max(seconds, 0.0) / freed)
    assert ratios == sorted(ratios)
    for m in set(RECOMPUTE_MODULES) - set(added):  # left out: the model lacks it, or it frees nothing
        if module_errors(model, ParallelConfig(recompute_modules=(m,)), None) is None:
            assert _price(model, cluster, JOB, m)[1] <= 0


def test_deepseek_v3_ladder_holds_megatron_bridge_recipe_set() -> None:
    """Megatron-Bridge's DeepSeek-V3 recipes recompute mla_up_proj, moe_act and layernorm: the three cheapest per
    byte on this model, so one rung of its ladder."""
    model, cluster = load_model("deepseek-v3"), build_cluster("h100-sxm", 256, target="megatron")
    assert ("moe_act", "layernorm", "mla_up_proj") in module_ladder_for(model, cluster, JOB, "megatron").sets


def test_ladder_follows_the_targets_rules() -> None:
    model = load_model("deepseek-v3")
    assert module_ladder_for(model, build_cluster("h100-sxm", 256, target="torchtitan"), JOB, "torchtitan") == NO_LADDER
    assert module_ladder_for(model, build_cluster("h100-sxm", 256, target="fsdp2"), JOB, "fsdp2") == NO_LADDER
    # fp8 with delayed scaling: Megatron refuses moe_act and layernorm recompute (transformer_config.py:1241-1247)
    cluster = build_cluster("h100-sxm", 256, target="megatron")
    fp8 = JOB.model_copy(update={"precision": "fp8"})
    delayed = module_ladder_for(model, cluster, fp8, "megatron", Software(fp8_recipe="delayed")).sets
    assert delayed and not {"moe_act", "layernorm"} & set(delayed[-1])
    assert {"moe_act", "layernorm"} <= set(module_ladder_for(model, cluster, fp8, "megatron",
                                                              Software(fp8_recipe="blockwise")).sets[-1])


def test_selective_layouts_come_once_per_rung_and_a_pin_sets_one() -> None:
    model, cluster = load_model("deepseek-v3"), build_cluster("h100-sxm", 256, target="megatron")
    ladder = module_ladder_for(model, cluster, JOB, "megatron")
    shape = {"tp": 2, "pp": 8, "ep": 8, "micro_batch_size": 1, "zero_stage": 1, "schedule": "1f1b"}
    lays = list(enumerate_layouts(model, cluster, JOB, "megatron", shape, Tally(), {"megatron": ladder}))
    by_rc = {rc: [lay.recompute_modules for lay in lays if lay.recompute == rc] for rc in ("none", "selective", "full")}
    assert by_rc["none"] == by_rc["full"] == [None] * len(by_rc["none"])
    per = len(by_rc["none"])
    assert by_rc["selective"] == [m for _ in range(per) for m in [None, *ladder.sets]]
    pinned = list(enumerate_layouts(model, cluster, JOB, "megatron",
                                    {**shape, "recompute_modules": ladder.sets[0]}, Tally(), {"megatron": ladder}))
    assert {lay.recompute_modules for lay in pinned} == {ladder.sets[0]}
    # no ladder given (the structural callers): Megatron's default only, as before
    plain = list(enumerate_layouts(model, cluster, JOB, "megatron", shape, Tally()))
    assert [lay.recompute_modules for lay in plain if lay.recompute == "selective"] == [None] * per


def test_search_is_no_worse_than_any_rung_pinned_and_finds_module_plans() -> None:
    """The search covers every pinned rung's layouts, so its best plan costs at most each pinned search's best; on
    DeepSeek-V3 (memory-bound at this size) a module set wins over Megatron's default. With the EP A2A overlap held
    off: searched (a layout knob), it hides the all-to-alls and recompute none wins here, which would not exercise
    the ladder."""
    model, cluster = load_model("deepseek-v3"), build_cluster("h100-sxm", 256, target="megatron")
    scorer = Scorer(model, cluster, JOB, software=Software(moe_a2a_overlap=False))
    free = search(model, cluster, JOB, top_k=1, find_smallest_cluster=False, scorer=scorer)
    best = free.plans[0]
    for rung in module_ladder_for(model, cluster, JOB, "megatron").sets:
        pinned = search(model, cluster, JOB, top_k=1, find_smallest_cluster=False,
                        pins={"recompute_modules": rung}, scorer=scorer)
        assert best.prediction.composite_cost <= pinned.plans[0].prediction.composite_cost * (1 + 1e-12)
    default = search(model, cluster, JOB, top_k=1, find_smallest_cluster=False,
                     pins={"recompute_modules": ("core_attn",)}, scorer=scorer)
    assert best.prediction.composite_cost < default.plans[0].prediction.composite_cost
    assert best.parallel.recompute == "selective" and best.parallel.recompute_modules not in (None, ("core_attn",))


def test_explanation_names_the_module_sets_two_selective_plans_differ_in() -> None:
    from search.explain import explain

    model, cluster = load_model("deepseek-v3"), build_cluster("h100-sxm", 256, target="megatron")
    res = search(model, cluster, JOB, top_k=3, find_smallest_cluster=False, pins={"recompute": "selective"})
    pairs = [(a, b) for a in res.plans for b in res.plans if a.parallel.recompute_modules != b.parallel.recompute_modules]
    assert pairs, "the ladder gave the top plans one module set"
    a, b = pairs[0]
    text = explain(a.parallel, a.prediction, b.parallel, b.prediction, cluster)
    names = [",".join(p.parallel.recompute_modules or ("core_attn",)) for p in (a, b)]
    assert f"recompute modules {names[0]} vs {names[1]}" in text.split("layouts differ in")[1]
