"""The search's knob candidates are cached on what the profile read (``search.score.Scorer.knob_key``), not on a
hand-picked subset of the layout: Megatron's knob rules read ep, schedule and recompute (moe_a2a_overlap,
TransformerConfig:1857-1878 @ core_v0.16.1), which the old key (target, zero, pp, tp, cp, sp, modules) left out, so
the first layout of a key decided the candidates of the others. With --moe-a2a-overlap an ep=1 layout (where every
setting is refused) left the ep>1 layouts of its key with no choice: the search returned cp_comm_type p2p where the
legal a2a is cheaper."""

from __future__ import annotations

from typing import Any

import pytest

from autoplan.api import Engine
from autoplan.catalog import build_cluster, load_model
from autoplan.emit.plan import priced_software
from cost_models.estimate import estimate
from cost_models.specs import JobSpec, ParallelConfig
from cost_models.targets import PROFILES, Software, runtime_for
from search.score import Scorer
from search.space import Layout

MODEL, GPUS, SEQ, GBS = "olmoe-1b-7b", 16, 32768, 64
USER = {"moe_a2a_overlap": True}


def _layout(**kw: Any) -> Layout:
    base = dict(tp=1, cp=4, pp=1, dp=4, ep=4, micro_batch_size=1, m=4, recompute="selective", zero_stage=1,
                hsdp_shard_size=None, schedule="1f1b", vp=1)
    return Layout(**{**base, **kw})  # type: ignore[arg-type]


# layouts of the old key (megatron, zero 1, pp, tp 1, cp 4, SP, no modules) on which Megatron refuses
# moe_a2a_overlap for a field the old key did not hold: ep=1 (TC:1862-1864), recompute=full (TC:1870-1878)
@pytest.mark.parametrize("refused", [dict(ep=1), dict(recompute="full")], ids=["ep1", "full"])
def test_candidates_do_not_depend_on_the_layouts_priced_before(refused: dict[str, Any]) -> None:
    model, cluster = load_model(MODEL), build_cluster("h100-sxm", GPUS)
    job = JobSpec(global_batch_size=GBS, seq_len=SEQ)
    sw = Software(**USER)
    good, bad = _layout(), _layout(**refused)
    fresh = Scorer(model, cluster, job, software=sw)
    want_good, want_bad = fresh.knob_candidates(good), Scorer(model, cluster, job, software=sw).knob_candidates(bad)
    assert len(want_good) > 1 and want_bad == []  # a choice on one, every setting refused on the other
    for order in ((good, bad), (bad, good)):
        sc = Scorer(model, cluster, job, software=sw)
        got = {lay: sc.knob_candidates(lay) for lay in order}
        assert got == {good: want_good, bad: want_bad}
        assert sc.chosen_knobs(good) == fresh.chosen_knobs(good)
        assert sc.knob_key(good) != sc.knob_key(bad)


def test_every_returned_plan_runs_its_knobs_and_took_the_cheapest_legal_setting() -> None:
    res = Engine().search({"model": MODEL, "cluster": {"gpu": "h100-sxm", "num_gpus": GPUS},
                           "job": {"global_batch_size": GBS, "seq_len": SEQ}, "parallel": {"cp": 4}, "top": 10,
                           "target": "megatron", "software": USER})
    model, cluster = load_model(MODEL), build_cluster("h100-sxm", GPUS)
    job = res.job
    assert len(res.plans) == 10
    for plan in res.plans:
        par: ParallelConfig = plan.parallel
        prof = PROFILES[plan.target or "megatron"]
        sw = priced_software(plan.prediction.software)
        prof.check(model, cluster, job, par, runtime_for(prof.name, job, cluster, par, sw))  # Megatron runs it
        cands = prof.knob_candidates(model, cluster, job, par, Software(**USER))
        assert len(cands) > 1  # every plan here has a cp_comm_type to choose
        times = [estimate(model, cluster, job, par, target=prof.name, software=Software(**USER, **c)).step_time_s
                 for c in cands]
        assert plan.prediction.step_time_s == pytest.approx(min(times), rel=1e-9), (par, sw.cp_comm_type)
