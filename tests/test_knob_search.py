"""The search chooses the knobs a user left unset (issue 10 item 3): per layout, the legal setting the cost model
prices cheapest (``TargetProfile.knob_candidates`` priced by ``layer_cost``, ``search.score.Scorer.chosen_knobs``);
a knob the user set is kept; the plan's prediction is ``estimate`` with the chosen knobs; the emitters write them.

The expected winners are not written down: each case prices every legal setting with ``estimate`` on the plan's
own layout and checks the search took the cheapest (ties: the target's default). The cases are picked so that
both directions occur (Ulysses a2a, the ring, hierarchical a2a+p2p)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from autoplan.api import Engine
from autoplan.emit import EmitPlan
from autoplan.emit.megatron import megatron_args
from autoplan.emit.plan import priced_software
from cost_models.estimate import estimate
from cost_models.specs import JobSpec, ParallelConfig
from cost_models.targets import PROFILES, Software

# (model, GPUs, seq, pinned layout, what the cost model is expected to prefer, as a sanity label for the cases)
CP_CASES = [
    # GQA, 8 KV heads at tp 1, cp 8, 128k: the ring's per-step kernels and merges cost more than Ulysses' a2a
    ("llama3-8b", 16, 131072, dict(tp=1, cp=8), "a2a"),
    # MHA (32 KV heads) at tp 4, cp 4, 8k: the ring hides behind attention, a2a is exposed
    ("llama2-7b", 32, 8192, dict(tp=4, cp=4), "p2p"),
    # MHA (32 KV heads) at tp 2, cp 8, 8k: a2a inside small groups, the ring over the rest
    ("llama2-7b", 32, 8192, dict(tp=2, cp=8), "a2a+p2p"),
    # GQA with one KV head per rank (tp 8): no a2a level is legal; p2p and allgather tie -> the default p2p
    ("llama3-70b", 128, 131072, dict(tp=8, cp=8), "p2p"),
]


def _request(name: str, gpus: int, seq: int, pins: dict[str, Any], software: dict[str, Any] | None = None,
             target: str = "megatron") -> dict[str, Any]:
    return {"model": name, "cluster": {"gpu": "h100-sxm", "num_gpus": gpus},
            "job": {"global_batch_size": gpus // (pins["tp"] * pins["cp"]), "seq_len": seq},
            "parallel": {**pins, "pp": 1, "zero_stage": 1, "recompute": "full", "micro_batch_size": 1},
            "top": 1, "target": target, "software": software or {}}


def _priced(res: Any) -> tuple[Any, Any, Any, Any, Any]:
    from autoplan.catalog import build_cluster, load_model

    plan = res.plans[0]
    model = load_model(res.model.name)
    cluster = build_cluster(res.cluster.gpu, res.cluster.num_gpus)
    return plan, model, cluster, res.job, plan.parallel


@pytest.mark.parametrize("name,gpus,seq,pins,label", CP_CASES)
def test_search_takes_the_cheapest_legal_cp_comm_type(name: str, gpus: int, seq: int, pins: dict[str, Any],
                                                      label: str) -> None:
    res = Engine().search(_request(name, gpus, seq, pins))
    plan, model, cluster, job, par = _priced(res)
    knobs = plan.prediction.software
    cands = PROFILES["megatron"].knob_candidates(model, cluster, job, par, None)
    assert len(cands) > 1  # there is a choice on this layout
    preds = [estimate(model, cluster, job, par, target="megatron", software=Software(**c)) for c in cands]
    priced = [(p.step_time_s, i, c) for i, (p, c) in enumerate(zip(preds, cands))]
    # the searched knobs change time only: memory is the same under each (the Scorer's memory bounds rely on it)
    assert {(p.peak_memory_gib, tuple(p.memory_gib.items())) for p in preds} == {
        (plan.prediction.peak_memory_gib, tuple(plan.prediction.memory_gib.items()))}
    best_t, _, best = min(priced, key=lambda x: (x[0] * (1 + 1e-12), x[1]))  # ties: the earlier (default first)
    assert plan.prediction.step_time_s == pytest.approx(best_t, rel=1e-12)
    assert {k: knobs.get(k) for k in best} == best
    assert knobs["cp_comm_type"] == label  # the cases cover every direction
    if label == "p2p" and name == "llama3-70b":  # a tie: the target's default, and said to be so
        assert [t for t, _, c in priced if c["cp_comm_type"] == "allgather"][0] == pytest.approx(best_t)
        assert "knobs chosen" not in plan.explanation.lower()
    elif label != "p2p":  # the explanation says what the choice bought over the default
        default_t = priced[0][0]
        assert priced[0][2] == {"cp_comm_type": "p2p"} and default_t > best_t
        assert f"Knobs chosen: cp_comm_type={label}" in plan.explanation
        assert f"vs {default_t:.4g} s with the target's default cp_comm_type=p2p" in plan.explanation


def test_the_plan_is_estimate_with_its_knobs_and_the_emitter_writes_them() -> None:
    name, gpus, seq, pins, _ = CP_CASES[2]
    res = Engine().search(_request(name, gpus, seq, pins))
    plan, model, cluster, job, par = _priced(res)
    sw = priced_software(plan.prediction.software)
    a = sw.cp_a2a_size
    assert sw.cp_comm_type == "a2a+p2p" and a in (2, 4)
    again = Engine().estimate({"model": name, "cluster": {"gpu": "h100-sxm", "num_gpus": gpus},
                               "job": res.job.model_dump(), "parallel": par.model_dump(), "target": "megatron",
                               "software": sw.given()})
    assert again.prediction == plan.prediction  # estimate's numbers, all of them, with the chosen knobs
    args = megatron_args(EmitPlan(model, cluster, job, par, software=sw))
    i = args.index("--cp-comm-type")
    assert args[i + 1] == "a2a+p2p"
    j = args.index("--hierarchical-context-parallel-sizes")
    assert args[j + 1:j + 3] == [str(a), str(par.cp // a)]  # [a2a level, p2p level], product = cp (MLM:403-405)


def test_a_knob_the_user_set_is_kept() -> None:
    name, gpus, seq, pins, _ = CP_CASES[0]
    free = Engine().search(_request(name, gpus, seq, pins))
    assert free.plans[0].prediction.software["cp_comm_type"] == "a2a"
    kept = Engine().search(_request(name, gpus, seq, pins, {"cp_comm_type": "p2p"}))
    assert kept.plans[0].prediction.software["cp_comm_type"] == "p2p"
    assert kept.plans[0].prediction.step_time_s > free.plans[0].prediction.step_time_s
    assert "knobs chosen" not in kept.plans[0].explanation.lower()
    # a user's a2a+p2p without a size: the search chooses the size, legal for the heads
    hier = Engine().search(_request("llama2-7b", 32, 8192, dict(tp=2, cp=8), {"cp_comm_type": "a2a+p2p"}))
    assert hier.plans[0].prediction.software["cp_a2a_size"] in (2, 4)


def test_torchtitan_compile_and_async_tp_are_chosen_unless_set() -> None:
    req = {"model": "llama3-8b", "cluster": {"gpu": "h100-sxm", "num_gpus": 16},
           "job": {"global_batch_size": 16, "seq_len": 8192},
           "parallel": {"tp": 2, "pp": 1, "cp": 1, "zero_stage": 3, "recompute": "none", "micro_batch_size": 1},
           "top": 1, "target": "torchtitan"}
    free = Engine().search(req)
    plan, model, cluster, job, par = _priced(free)
    cands = PROFILES["torchtitan"].knob_candidates(model, cluster, job, par, None)
    assert cands[0] == {"compile": False, "async_tp": False}  # the default first; async TP without compile dropped
    assert {"compile": False, "async_tp": True} not in cands
    preds = {json.dumps(c, sort_keys=True): estimate(model, cluster, job, par, target="torchtitan",
                                                     software=Software(**c)) for c in cands}
    priced = {k: p.step_time_s for k, p in preds.items()}
    assert len({p.peak_memory_gib for p in preds.values()}) == 1  # time-only knobs
    best = min(priced, key=lambda k: priced[k])
    got = {k: plan.prediction.software[k] for k in ("compile", "async_tp")}
    assert json.dumps(got, sort_keys=True) == best
    assert got == {"compile": True, "async_tp": True}  # what the cost model says: fused and overlapped
    kept = Engine().search({**req, "software": {"compile": False}})
    assert {k: kept.plans[0].prediction.software[k] for k in ("compile", "async_tp")} == {"compile": False,
                                                                                           "async_tp": False}


def test_knob_choice_is_deterministic() -> None:
    name, gpus, seq, pins, _ = CP_CASES[2]
    a = Engine().search({**_request(name, gpus, seq, pins), "top": 3, "parallel": {"tp": 2, "cp": 8}})
    b = Engine().search({**_request(name, gpus, seq, pins), "top": 3, "parallel": {"tp": 2, "cp": 8}})
    assert [p.model_dump() for p in a.plans] == [p.model_dump() for p in b.plans]


def test_a2a_p2p_rules_name_the_legal_sizes() -> None:
    from autoplan.catalog import build_cluster, load_model
    from cost_models.errors import ConfigError

    m, cluster = load_model("llama3-8b"), build_cluster("h100-sxm", 64)
    job = JobSpec(global_batch_size=8, seq_len=65536)
    par = ParallelConfig(tp=2, cp=8)  # 16 query / 4 KV heads per rank
    prof = PROFILES["megatron"]
    with pytest.raises(ConfigError, match=r"multiply to cp .*both levels > 1 \(cp_a2a_size=8\).*valid: 2, 4"):
        prof.check(m, cluster, job, par, prof.resolve(Software(cp_comm_type="a2a+p2p", cp_a2a_size=8), job, cluster,
                                                      par))
    bad = Software(cp_comm_type="a2a+p2p", cp_a2a_size=8)
    assert "valid: 2, 4" in prof.legal(m, cluster, job, par, prof.resolve(bad, job, cluster, par.model_copy(
        update={"cp": 16})))  # type: ignore[operator]
    with pytest.raises(ConfigError, match="cp_a2a_size=4 is the inner group of cp_comm_type=a2a\\+p2p"):
        prof.resolve(Software(cp_comm_type="p2p", cp_a2a_size=4), job, cluster, par)
    # default inner size: the largest inside one NVLink domain (8 GPUs, CP ranks tp = 2 apart): 4
    assert prof.resolve(Software(cp_comm_type="a2a+p2p"), job, cluster, par).cp_a2a_size == 4


def test_fsdp2_reshard_after_forward_is_searched_as_a_layout_of_its_own() -> None:
    """reshard_after_forward changes memory as well as time: each setting is a layout (Scorer.knob_variants) and
    the search keeps the cheapest that fits, priced by estimate; a user's setting is kept."""
    from autoplan.catalog import build_cluster

    req = {"model": "llama3-8b", "cluster": {"gpu": "h100-sxm", "num_gpus": 64},
           "job": {"global_batch_size": 1024, "seq_len": 8192},
           "parallel": {"tp": 2, "pp": 1, "micro_batch_size": 2, "recompute": "none"}, "top": 1, "target": "fsdp2"}
    found = Engine().search(req).plans[0]
    cluster = build_cluster("h100-sxm", 64)
    job, par = JobSpec(global_batch_size=1024, seq_len=8192), found.parallel
    opts = PROFILES["fsdp2"].layout_knob_options(cluster, job, par, {})
    assert opts[0] == {} and {"reshard_after_forward": False} in opts
    # the integer form (a node-local group) where the shard group spans nodes
    whole = PROFILES["fsdp2"].layout_knob_options(cluster, job, ParallelConfig(tp=2, pp=1, zero_stage=3), {})
    assert whole == [{}, {"reshard_after_forward": False}, {"reshard_after_forward": 8}]
    assert PROFILES["fsdp2"].layout_knob_options(cluster, job, ParallelConfig(tp=2, pp=2, zero_stage=3), {}) == [{}]
    eng = Engine()  # estimate on the cluster as fsdp2 runs on it (its efficiency set), like the search
    preds = [eng.estimate({"model": "llama3-8b", "cluster": req["cluster"], "job": req["job"], "target": "fsdp2",
                           "parallel": par.model_dump(exclude_none=True), "software": o}).prediction for o in opts]
    fit = [(p.composite_cost, i) for i, p in enumerate(preds) if p.fits]
    best = opts[min(fit)[1]]
    want = best.get("reshard_after_forward", True)
    assert found.prediction.software["reshard_after_forward"] == want
    assert found.prediction.step_time_s == pytest.approx(preds[min(fit)[1]].step_time_s, rel=1e-12)
    assert want is not True  # on this layout the cost model prefers keeping (part of) the gathered parameters
    assert len({p.peak_memory_gib for p in preds}) == len(opts)  # each setting holds different memory
    kept = Engine().search({**req, "software": {"reshard_after_forward": True}}).plans[0]
    assert kept.prediction.software["reshard_after_forward"] is True


def test_megatron_ep_a2a_overlap_is_searched_as_a_layout_of_its_own() -> None:
    """--overlap-moe-expert-parallel-comm changes each MoE layer's exposed all-to-all and, with a virtual pipeline,
    the combined 1F1B's pipeline sends (a step-level cost): each setting is a layout (Scorer.knob_variants), offered
    where ep > 1 and the user left it unset, dropped where Megatron refuses it; the plan is estimate's price of the
    cheaper legal setting, and a user's setting is kept."""
    from autoplan.catalog import build_cluster, load_model
    from search.score import Scorer
    from search.space import Layout

    prof, cluster = PROFILES["megatron"], build_cluster("h100-sxm", 16)
    job = JobSpec(global_batch_size=128, seq_len=4096)
    assert prof.layout_knob_options(cluster, job, ParallelConfig(tp=1, pp=1, ep=8), {}) == \
        [{}, {"moe_a2a_overlap": not cluster.efficiency.moe_a2a_overlap}]
    assert prof.layout_knob_options(cluster, job, ParallelConfig(tp=1, pp=1, ep=1), {}) == [{}]
    assert prof.layout_knob_options(cluster, job, ParallelConfig(tp=1, pp=1, ep=8), {"moe_a2a_overlap": False}) == [{}]
    sc = Scorer(load_model("qwen3-30b-a3b"), cluster, job)
    base = dict(tp=1, cp=1, dp=8, ep=8, micro_batch_size=1, m=16, recompute="none", zero_stage=1, hsdp_shard_size=None)
    plain = Layout(**base, pp=2, schedule="1f1b", vp=1)  # type: ignore[arg-type]
    assert sc.knob_variants(plain) == [plain]  # pp > 1 without a virtual pipeline: Megatron refuses the overlap
    chunked = Layout(**base, pp=2, schedule="interleaved", vp=2)  # type: ignore[arg-type]
    assert [v.knobs for v in sc.knob_variants(chunked)] == [(), (("moe_a2a_overlap", True),)]

    req = {"model": "qwen3-30b-a3b", "cluster": {"gpu": "h100-sxm", "num_gpus": 16},
           "job": {"global_batch_size": 128, "seq_len": 4096}, "parallel": {"tp": 1, "ep": 8, "pp": 1}, "top": 1}
    found = Engine().search(req).plans[0]
    eng, par = Engine(), found.parallel.model_dump(exclude_none=True)
    preds = {on: eng.estimate({"model": req["model"], "cluster": req["cluster"], "job": req["job"], "parallel": par,
                               "software": {"moe_a2a_overlap": on}}).prediction for on in (False, True)}
    want = min((p.composite_cost, on) for on, p in preds.items() if p.fits)[1]
    assert found.prediction.software["moe_a2a_overlap"] is want
    assert found.prediction.step_time_s == pytest.approx(preds[want].step_time_s, rel=1e-12)
    assert want is True and preds[True].step_time_s < preds[False].step_time_s  # ep 8: exposed all-to-alls hidden
    emitted = EmitPlan(load_model("qwen3-30b-a3b"), cluster, job, found.parallel,
                       software=priced_software(found.prediction.software))
    assert "--overlap-moe-expert-parallel-comm" in megatron_args(emitted)
    kept = Engine().search({**req, "software": {"moe_a2a_overlap": False}}).plans[0]
    assert not kept.prediction.software.get("moe_a2a_overlap")  # (the software view leaves a false one out)


@pytest.mark.parametrize("software", [dict(cp_comm_type="a2a+p2p", cp_a2a_size=3),
                                      dict(cp_comm_type="a2a+p2p", cp_a2a_size=8), dict(cp_comm_type="a2a")])
def test_cp_comm_valid_lists_are_what_estimate_accepts(software: dict[str, Any]) -> None:
    """llama3-8b tp 2 cp 16 (16 query / 4 KV heads per rank): every refused CP setting lists exactly the a2a+p2p
    inner sizes ``estimate`` accepts on the layout (the size rule and the head rule together)."""
    from autoplan import api
    from cost_models.errors import ConfigError

    def error(sw: dict[str, Any]) -> str | None:
        try:
            api.estimate({"kind": "estimate", "model": "llama3-8b", "cluster": {"gpu": "h100-sxm", "num_gpus": 64},
                          "job": {"global_batch_size": 64, "seq_len": 131072}, "parallel": {"tp": 2, "cp": 16},
                          "software": sw})
        except ConfigError as err:
            return str(err)
        return None

    msg = error(software)
    assert msg is not None and "; valid: " in msg
    listed = msg.split("; valid: ")[1].split(", ")
    sizes = [int(x.removeprefix("a2a+p2p (cp_a2a_size=").rstrip(")")) for x in listed
             if x.isdigit() or x.startswith("a2a+p2p (")]
    accepted = [a for a in range(2, 16) if error(dict(cp_comm_type="a2a+p2p", cp_a2a_size=a)) is None]
    assert sizes == accepted == [2, 4], msg
