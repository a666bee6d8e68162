"""The search's explicit pipeline layouts (``pipeline_split.layout_candidates``): interleaved splits Megatron's split
flags cannot build, weighed where the target takes ``--pipeline-model-parallel-layout``, each priced by the one cost
model ``estimate`` prices a ``--pipeline-layout`` with."""

from __future__ import annotations

import pytest

from autoplan.catalog import build_cluster, load_model
from autoplan.emit import EmitPlan
from autoplan.emit.megatron import megatron_args
from autoplan.emit.plan import priced_software
from cost_models.estimate import estimate
from cost_models.pipeline_layout import layout_from_text
from cost_models.pipeline_split import balanced_layout, candidates, layout_candidates, layout_split
from cost_models.specs import ClusterSpec, JobSpec, ModelSpec
from cost_models.targets import Software
from search.exhaustive import exhaustive_search
from search.planner import interleaved_candidates, search, to_parallel
from search.score import Scorer
from search.space import Tally, enumerate_layouts


def test_balanced_layout_has_the_bridge_recipe_ranks() -> None:
    """DeepSeek-V3 (61 + 1 MTP) on pp 16 x vp 2, ranks (3, 4 x 14, 2): the per-rank layers of Megatron-Bridge's
    DeepSeek-V3 layout, with the last decoder layer in the loss's chunk."""
    text = balanced_layout((3,) + (4,) * 14 + (2,), 2, 1)
    assert text == "Et|(tt|)*14t|(tt|)*15tmL"
    ours, bridge = layout_split(text, 61, 1, 16), layout_split("Et|(tt|)*29tt|mL", 61, 1, 16)
    assert ours.rank_layers == bridge.rank_layers and ours.chunks[0] == bridge.chunks[0] == (1, 2)
    assert balanced_layout((1,) + (4,) * 14 + (2,), 2, 1) is not None  # chunk (0, 0) holds E alone
    assert balanced_layout((0,) + (4,) * 14 + (2,), 2, 1) is None  # rank 0's second chunk would hold nothing
    assert balanced_layout((4,) * 15 + (1,), 2, 1) is None  # the loss's chunk holds the last decoder layer
    assert balanced_layout((4,) * 16, 1, 0) is None  # vp = 1: the split flags say it


@pytest.mark.parametrize("mtp", [0, 1, 2])
def test_layout_candidates_build_their_counts_by_megatrons_rules(mtp: int) -> None:
    seen = 0
    for L in range(2, 40):
        for pp in (2, 3, 4, 8):
            for vp in (2, 3, 4):
                found = layout_candidates(L, pp, vp, mtp)
                if candidates(L, pp, vp):
                    assert found == ()  # the flags build a split: no layout needed
                for sp in found:
                    seen += 1
                    assert sp.layout is not None
                    again = layout_split(sp.layout.text, L, mtp, pp)  # Megatron's validate_layer_layout rules
                    assert again.rank_layers == sp.rank_layers and sum(sp.rank_layers) == L and again.vp == vp
                    flat = layout_from_text(sp.layout.text, pp).flat()
                    assert all(c for _, _, c in flat) and "t" in flat[-1][2]  # no empty stage; L-1 with the loss
                    assert balanced_layout(tuple(sp.rank_layers), vp, mtp) == sp.layout.text
                lows = [max(sp.rank_layers) for sp in found]
                assert lows == sorted(lows) and (not lows or lows[-1] <= lows[0] + 1)
    assert seen > 100


def _tiny() -> ModelSpec:
    return ModelSpec(name="tiny", num_layers=5, hidden_size=256, ffn_hidden_size=1024, num_attention_heads=4,
                     num_kv_heads=4, vocab_size=1000)


def test_tiny_search_weighs_layouts_and_equals_exhaustive() -> None:
    """5 layers on pp 2 x vp 2: no flag split (5 + embedding + loss never splits 2 x 2 evenly, first/last counts
    must be even): the search weighs the layouts, as the exhaustive reference does, and finds its optimum."""
    model, cluster, job = _tiny(), build_cluster("h100-sxm", 4), JobSpec(global_batch_size=16, seq_len=1024)
    pins = {"pp": 2, "vp": 2}
    ref = exhaustive_search(model, cluster, job, "megatron", pins)
    assert ref is not None and ref.parallel.pipeline_layout is not None
    res = search(model, cluster, job, pins=pins, top_k=3, find_smallest_cluster=False)
    assert res.plans[0].prediction.composite_cost == pytest.approx(ref.prediction.composite_cost, rel=1e-9)
    par = res.plans[0].parallel
    assert par.pipeline_layout is not None and par.vp == 2
    argv = megatron_args(EmitPlan(model, cluster, job, par, priced_software(res.plans[0].prediction.software)))
    assert argv[argv.index("--pipeline-model-parallel-layout") + 1] == par.pipeline_layout
    # torchtitan weighs none (its profile does not search layouts): no vp 2 layout of this model at all
    assert not [lay for lay in enumerate_layouts(model, cluster, job, "torchtitan", pins, Tally())]


def _check_scorer_equals_estimate(model: ModelSpec, cluster: ClusterSpec, job: JobSpec, pins: dict) -> int:
    scorer, n = Scorer(model, cluster, job), 0
    for lay in enumerate_layouts(model, cluster, job, "megatron", pins, Tally()):
        for sp in interleaved_candidates(model, lay):
            layers = tuple(sp.rank_layers)
            par = to_parallel(model, lay, layers)
            assert par.pipeline_layout == sp.layout.text  # type: ignore[union-attr]
            fs = scorer.score(lay, layers)
            pred = estimate(model, cluster, job, par, target="megatron",
                            software=Software(**scorer.chosen_knobs(lay)))
            assert fs.step_time_s == pytest.approx(pred.step_time_s, rel=1e-9)
            assert fs.peak_memory_bytes / 2**30 == pytest.approx(pred.peak_memory_gib, rel=1e-9)
            assert fs.composite_cost == pytest.approx(pred.composite_cost, rel=1e-9)
            n += 1
    return n


def test_scorer_equals_estimate_on_tiny_layouts() -> None:
    model, cluster, job = _tiny(), build_cluster("h100-sxm", 4), JobSpec(global_batch_size=16, seq_len=1024)
    assert _check_scorer_equals_estimate(model, cluster, job, {"pp": 2, "vp": 2}) > 0


def test_deepseek_v3_layouts_scorer_equals_estimate() -> None:
    """DeepSeek-V3 (61 layers + 1 MTP, dense first 3) on 1024 H100s, the brief's layout pins at vp 2: every layout
    the search weighs prices the same in the Scorer and in ``estimate``; the searched plans carry their layout and
    are ``estimate``'s; the Megatron-Bridge layout is among them."""
    model, cluster = load_model("deepseek-v3"), build_cluster("h100-sxm", 1024)
    job = JobSpec(global_batch_size=1024, seq_len=8192)
    pins = {"tp": 2, "pp": 16, "cp": 2, "ep": 8, "micro_batch_size": 1, "zero_stage": 1, "recompute": "selective",
            "recompute_modules": ("moe_act", "layernorm", "mla_up_proj", "mlp", "shared_experts"), "vp": 2}
    assert _check_scorer_equals_estimate(model, cluster, job, pins) >= 10
    texts = {sp.layout.text for sp in layout_candidates(61, 16, 2, 1)}  # type: ignore[union-attr]
    assert "Et|(tt|)*14t|(tt|)*15tmL" in texts  # the Bridge recipe's ranks (3, 4 x 14, 2)
    try:
        res = search(model, cluster, job, pins=pins, top_k=3, find_smallest_cluster=False)
    except Exception as err:  # every layout over memory at these pins: the refusal names the closest
        assert "GiB" in str(err)
        return
    for plan in res.plans:
        par = plan.parallel
        assert par.pipeline_layout is not None and par.vp == 2
        assert plan.prediction == estimate(model, cluster, job, par, target="megatron",
                                           software=priced_software(plan.prediction.software))


def test_refused_vp_pin_lists_every_vp_a_pin_plans() -> None:
    """Unpinned, the search stops explicit layouts at MAX_LAYOUT_VP; a pin takes any vp the target runs. So a
    refused vp pin's 'valid:' list names every vp a pin would plan (llama3-8b, 32 layers on pp 2: 1 to 16, the
    uneven ones through explicit layouts), and each listed value does plan."""
    from cost_models.errors import ConfigError
    from search.space import MAX_LAYOUT_VP

    model, cluster, job = load_model("llama3-8b"), build_cluster("h100-sxm", 8), JobSpec(global_batch_size=64,
                                                                                          seq_len=4096)
    with pytest.raises(ConfigError) as err:
        search(model, cluster, job, pins={"pp": 2, "vp": 40}, find_smallest_cluster=False)
    assert err.value.valid == list(range(1, 17))
    beyond_cap = [v for v in err.value.valid if v > MAX_LAYOUT_VP and 32 % (2 * v)]
    assert beyond_cap  # the list is more than the capped unpinned search offers
    for v in (beyond_cap[0], beyond_cap[-1]):
        res = search(model, cluster, job, pins={"pp": 2, "vp": v}, top_k=1, find_smallest_cluster=False)
        assert res.plans[0].parallel.vp == v and res.plans[0].parallel.pipeline_layout is not None
