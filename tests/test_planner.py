"""The outer search: equals exhaustive enumeration on small spaces, every plan obeys the hard
constraints, the fast scorer equals ``estimate``, infeasible jobs explain themselves."""

from __future__ import annotations

import ast
import pathlib

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from autoplan.catalog import build_cluster, load_model
from autoplan.emit.plan import priced_software
from cost_models.errors import InfeasibleError
from cost_models.estimate import estimate
from cost_models.specs import JobSpec, ModelSpec, ParallelConfig
from cost_models.pipeline_split import candidates
from cost_models.targets import PROFILES, Software
from cost_models.validate import check_parallel, stage_layers
from search.exhaustive import exhaustive_search
from search.planner import search
from search.score import Scorer
from search.space import ANY_TARGETS, Tally, enumerate_layouts, module_ladder_for

ROOT = pathlib.Path(__file__).resolve().parents[1]


@st.composite
def tiny_models(draw):  # type: ignore[no-untyped-def]
    heads = draw(st.sampled_from([4, 8]))
    kv = draw(st.sampled_from([h for h in (1, 2, 4, 8) if heads % h == 0]))
    d = draw(st.sampled_from([32, 64]))
    moe = draw(st.booleans())
    kw: dict = {}
    if moe:
        kw = dict(num_experts=draw(st.sampled_from([4, 8])), moe_top_k=2,
                  first_dense_layers=draw(st.integers(0, 1)))
    return ModelSpec(name="tiny", num_layers=draw(st.integers(2, 7)), hidden_size=heads * d,
                     ffn_hidden_size=heads * d * draw(st.sampled_from([2, 3, 4])), num_attention_heads=heads,
                     num_kv_heads=kv, vocab_size=draw(st.sampled_from([1000, 32000])),
                     tied_embeddings=draw(st.booleans()), **kw)


@st.composite
def jobs(draw):  # type: ignore[no-untyped-def]
    gpu = draw(st.sampled_from(["a100-40g", "h100-sxm", "gb200"]))  # gb200: 4 per node, NVLink domain 72
    n = draw(st.sampled_from([1, 2, 4, 8, 16]))
    cluster = build_cluster(gpu, n)
    job = JobSpec(global_batch_size=draw(st.sampled_from([4, 8, 16, 32])),
                  seq_len=draw(st.sampled_from([1024, 2048, 4096])))
    return cluster, job


def _check_plan_constraints(model, cluster, job, plan, target="megatron") -> None:  # type: ignore[no-untyped-def]
    from search.space import kv_replication

    par, pred = plan.parallel, plan.prediction
    ran = pred.software["target"]  # the framework the plan runs on (a search over ``any`` picks one per plan)
    if target != "any":
        assert ran == target
    rep = kv_replication(ran)  # Megatron / fsdp2 replicate KV heads when tp is a multiple of them
    # raises on any broken hard constraint, by the rules of the plan's own target (fsdp2's DTensor sequence
    # parallelism shards unevenly: TargetProfile.sp_split_error)
    check_parallel(model, cluster, job, par, allow_kv_replication=rep, profile=PROFILES[ran])
    dp = pred.dp
    assert dp * par.tp * par.pp * par.cp == cluster.num_gpus
    g = model.num_kv_heads
    assert g % par.tp == 0 or (rep and par.tp % g == 0)
    assert par.tp <= cluster.nvlink_domain_size and cluster.nvlink_domain_size % par.tp == 0
    layers = stage_layers(model, par)
    assert pred.layers_per_stage == layers and sum(layers) == model.num_layers and min(layers) >= 1
    assert len(layers) == par.pp
    assert job.global_batch_size % (par.micro_batch_size * dp) == 0
    assert pred.fits and pred.peak_memory_gib <= pred.memory_limit_gib
    if model.is_moe:
        # expert-TP 1: the tp·cp·dp ranks of a stage re-cut as ep × edp (Megatron's MoE parallel folding)
        assert model.num_experts % par.ep == 0 and (par.tp * dp * par.cp) % par.ep == 0
    # what users see is estimate's, exactly, as the plan's target runs it
    assert pred == estimate(model, cluster, job, par, target=pred.software["target"],
                            software=priced_software(pred.software))  # with the knobs the search chose


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(tiny_models(), jobs(), st.sampled_from(["megatron", "torchtitan", "any"]))
def test_search_equals_exhaustive_and_plans_obey_constraints(model, cj, target) -> None:  # type: ignore[no-untyped-def]
    cluster, job = cj
    ref = exhaustive_search(model, cluster, job, target)
    if ref is None:
        with pytest.raises(InfeasibleError):
            search(model, cluster, job, target=target, find_smallest_cluster=False)
        return
    res = search(model, cluster, job, target=target, top_k=3, find_smallest_cluster=False)
    assert res.plans[0].prediction.composite_cost == pytest.approx(ref.prediction.composite_cost, rel=1e-9)
    costs = [p.prediction.composite_cost for p in res.plans]
    assert costs == sorted(costs)
    for p in res.plans:
        _check_plan_constraints(model, cluster, job, p, target)


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(tiny_models(), jobs(), st.data())
def test_fast_scorer_equals_estimate(model, cj, data) -> None:  # type: ignore[no-untyped-def]
    cluster, job = cj
    ladders = {t: module_ladder_for(model, cluster, job, t) for t in ANY_TARGETS}  # the module sets searched too
    layouts = list(enumerate_layouts(model, cluster, job, "any", {}, Tally(), ladders))
    if not layouts:
        return
    scorer = Scorer(model, cluster, job)
    for lay in data.draw(st.lists(st.sampled_from(layouts), min_size=1, max_size=8)):
        from search.planner import default_split, to_parallel

        par = to_parallel(model, lay, default_split(model, lay))  # an explicit layout where no flag split exists
        layers = tuple(stage_layers(model, par))
        fs = scorer.score(lay, layers)
        pred = estimate(model, cluster, job, par, target=lay.target,  # any: every layout has the target that runs it
                        software=Software(**scorer.chosen_knobs(lay)))  # with the knobs the search chose for it
        assert fs.step_time_s == pytest.approx(pred.step_time_s, rel=1e-9)
        assert fs.peak_memory_bytes / 2**30 == pytest.approx(pred.peak_memory_gib, rel=1e-9)
        assert fs.composite_cost == pytest.approx(pred.composite_cost, rel=1e-9)
        assert fs.fits == pred.fits
        assert scorer.memory_lower_bound(lay) <= fs.peak_memory_bytes * (1 + 1e-12)
        # the search cuts on the state bound before it bounds the step time: it may never exceed the memory bound
        assert scorer.state_lower_bound(lay) <= scorer.memory_lower_bound(lay)


def _check_split_lower_bound(scorer: Scorer, lay) -> None:  # type: ignore[no-untyped-def]
    from cost_models.pipeline import pipeline_time_s
    from search.planner import _split, _split_lower_bound

    low, true = scorer.tables(lay, lower=True), scorer.tables(lay)
    for name in ("time", "act"):
        assert (np.diff(getattr(low, name)) <= np.diff(getattr(true, name)) * (1 + 1e-12)).all()
    assert low.last_time <= true.last_time and low.last_act <= true.last_act and low.first_time <= true.first_time
    layers = _split(lay, scorer, {})
    if layers is None:
        return
    bound = _split_lower_bound(lay, scorer)
    assert bound <= scorer.score(lay, layers).step_time_s
    if lay.pp > 1 and lay.vp == 1:  # the stage DP's bound: pipeline + fill alone
        bounds = np.concatenate([[0], np.cumsum(layers)])
        t = true.time[bounds[1:]] - true.time[bounds[:-1]]
        t[-1] += true.last_time
        t[0] += true.first_time  # FSDP2's copies / accumulation for the embedding (Scorer.fsdp_time_pieces)
        assert bound <= pipeline_time_s(list(t), lay.m, lay.schedule, lay.vp) + scorer.p2p_fill_s(lay)  # type: ignore[arg-type]


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(tiny_models(), jobs(), st.sampled_from(["megatron", "torchtitan", "any"]), st.data())
def test_split_lower_bound_is_below_what_the_split_costs(model, cj, target, data) -> None:  # type: ignore[no-untyped-def]
    # The planner skips a layout's ILP solve when this bound already loses: it must never exceed the step time
    # of the split _split returns, and the floor tables must sit below the ILP's, entry by entry.
    cluster, job = cj
    layouts = list(enumerate_layouts(model, cluster, job, target, {}, Tally()))
    if not layouts:
        return
    scorer = Scorer(model, cluster, job)
    for lay in data.draw(st.lists(st.sampled_from(layouts), min_size=1, max_size=8)):
        _check_split_lower_bound(scorer, lay)


@pytest.mark.parametrize("first_dense", [0, 2])
def test_split_lower_bound_reads_an_interleaved_ranks_chunks(first_dense: int) -> None:
    """pp 2, vp 2 over 4 layers: rank 0 holds layers 0 and 2, rank 1 layers 1 and 3. With two dense layers first,
    a bound that priced rank r as the contiguous layers [2r, 2r + 2) put both MoE layers on rank 1 and exceeded the
    step time of the very split it bounds (0.094 s vs 0.055 s), so branch and bound could skip the layout."""
    from search.space import Layout

    model = ModelSpec(name="tiny", num_layers=4, hidden_size=256, ffn_hidden_size=512, num_attention_heads=4,
                      num_kv_heads=4, vocab_size=32000, num_experts=8, moe_top_k=2, first_dense_layers=first_dense)
    cluster, job = build_cluster("h100-sxm", 8, target="megatron"), JobSpec(global_batch_size=32, seq_len=2048)
    lay = Layout(tp=1, cp=1, pp=2, dp=4, ep=1, micro_batch_size=1, m=8, recompute="selective", zero_stage=1,
                 hsdp_shard_size=None, schedule="interleaved", vp=2)
    _check_split_lower_bound(Scorer(model, cluster, job), lay)


def test_stage_dp_objective_is_pipeline_time_for_the_schedules_the_bound_trusts() -> None:
    # _split_lower_bound uses the stage DP's α·Σt + (m − α)·max t as pipeline_time_s for ALPHA_SCHEDULES only.
    from cost_models.pipeline import pipeline_time_s
    from search.planner import ALPHA_SCHEDULES
    from search.score import schedule_alpha

    rng = np.random.default_rng(7)
    for schedule in ALPHA_SCHEDULES:
        for _ in range(50):
            p = int(rng.integers(2, 9))
            vp = int(rng.choice([2, 4])) if schedule == "interleaved" else 1
            m, t = int(rng.integers(p, 4 * p + 1)), list(rng.random(p))
            a = schedule_alpha(schedule, vp)
            assert pipeline_time_s(t, m, schedule, vp) == pytest.approx(a * sum(t) + (m - a) * max(t), rel=1e-12)


@pytest.mark.parametrize("name,gpus,target", [("llama3-8b", 64, "any"), ("mixtral-8x7b", 64, "megatron")])
def test_split_lower_bound_on_catalog_models(name: str, gpus: int, target: str) -> None:
    # Real layer shapes: interleaved (vp > 1), pp = 1 and stage-DP layouts, MoE, the any target's floors.
    model, cluster, job = load_model(name), build_cluster("h100-sxm", gpus), JobSpec(global_batch_size=128)
    layouts = list(enumerate_layouts(model, cluster, job, target, {}, Tally()))  # type: ignore[arg-type]
    rng = np.random.default_rng(0)
    picked = [layouts[i] for i in rng.choice(len(layouts), size=min(40, len(layouts)), replace=False)]
    # and the first of each kind the sample may miss: pp = 1, and an explicit layout (no flag split at its vp)
    picked += [next(lay for lay in layouts if lay.pp == 1)]
    picked += [lay for lay in layouts if lay.vp > 1 and not candidates(model.num_layers, lay.pp, lay.vp)][:1]
    assert {lay.vp > 1 for lay in picked} == {True, False} and any(lay.pp == 1 for lay in picked)
    scorer = Scorer(model, cluster, job)
    for lay in picked:
        _check_split_lower_bound(scorer, lay)


def test_showcase_llama70b_is_fast_deterministic_and_valid() -> None:
    model, cluster, job = load_model("llama3-70b"), build_cluster("h100-sxm", 1024), JobSpec()
    a = search(model, cluster, job)
    b = search(model, cluster, job)
    assert [p.parallel for p in a.plans] == [p.parallel for p in b.plans]
    assert len(a.plans) == 3 and a.candidates > 1000 and a.evaluated < a.candidates
    assert {"memory_lower_bound", "bound"} <= set(a.pruned)
    for p in a.plans:
        _check_plan_constraints(model, cluster, job, p)
        assert p.explanation and "Binds" in p.explanation


def test_long_context_chooses_context_parallelism() -> None:
    model, cluster = load_model("llama3-405b"), build_cluster("h100-sxm", 16384)
    job = JobSpec(seq_len=131072)
    res = search(model, cluster, job, top_k=2)
    assert all(p.parallel.cp > 1 for p in res.plans)
    for p in res.plans:
        _check_plan_constraints(model, cluster, job, p)


def test_moe_uses_expert_parallelism_and_pins_are_honoured() -> None:
    model, cluster, job = load_model("mixtral-8x22b"), build_cluster("h100-sxm", 256), JobSpec()
    res = search(model, cluster, job, pins={"tp": 4, "zero_stage": 1}, top_k=2)
    for p in res.plans:
        assert p.parallel.tp == 4 and p.parallel.zero_stage == 1
        _check_plan_constraints(model, cluster, job, p)
    assert res.pruned.get("pin", 0) > 0


def test_torchtitan_target_uses_fsdp() -> None:
    model, cluster, job = load_model("llama3-8b"), build_cluster("h100-sxm", 64), JobSpec(global_batch_size=256)
    res = search(model, cluster, job, target="torchtitan", top_k=2)
    assert all(p.parallel.zero_stage == 3 for p in res.plans)


def test_gb200_may_use_the_72_gpu_domain() -> None:
    model, cluster, job = load_model("mixtral-8x22b"), build_cluster("gb200", 288), JobSpec()
    res = search(model, cluster, job, top_k=3)
    for p in res.plans:
        _check_plan_constraints(model, cluster, job, p)


def test_infeasible_names_closest_and_smallest_cluster() -> None:
    model, job = load_model("llama3-70b"), JobSpec(global_batch_size=64)
    cluster = build_cluster("h100-sxm", 8)
    with pytest.raises(InfeasibleError) as info:
        search(model, cluster, job)
    err = info.value
    assert "closest" in str(err) and "GiB" in str(err)
    assert err.hint is not None and "GPUs" in err.hint
    n = int(err.hint.split(": ")[1].split()[0])
    assert n > 8
    search(model, build_cluster("h100-sxm", n), job, top_k=1)  # that many GPUs does have a plan
    if n // 2 > 8:
        with pytest.raises(InfeasibleError):
            search(model, build_cluster("h100-sxm", n // 2), job, find_smallest_cluster=False)


@pytest.mark.parametrize("name,gpus", [("llama3-70b", 8), ("deepseek-v3", 64), ("mixtral-8x7b", 8)])
def test_state_cut_layouts_leave_the_closest_candidates_as_bounding_all_would(name: str, gpus: int) -> None:
    # Layouts cut on their model state are memory-bounded only until no later one can be among the closest the
    # infeasible error names: the CLOSEST_CANDIDATES least (memory bound, key) must be those of bounding them all.
    from search.planner import CLOSEST_CANDIDATES, _closest_over_state, _searched_layouts, target_scorers

    model, cluster, job = load_model(name), build_cluster("h100-sxm", gpus), JobSpec(global_batch_size=64)
    scorers = target_scorers(model, cluster, job, "megatron", None, None)
    sc = scorers["megatron"]
    layouts = _searched_layouts(model, cluster, job, {}, scorers, Tally())
    over = [lay for lay in layouts if sc.as_run(lay).state_lower_bound(lay) > sc.limit_bytes]
    assert len(over) > CLOSEST_CANDIDATES  # the cut has something to skip
    cut = set(over)
    rest = [(sc.as_run(lay).memory_lower_bound(lay), lay.sort_key(), lay) for lay in layouts if lay not in cut]
    every = sorted(rest + [(sc.as_run(lay).memory_lower_bound(lay), lay.sort_key(), lay) for lay in over],
                   key=lambda x: (x[0], x[1]))
    some = sorted(rest + _closest_over_state(over, scorers, rest), key=lambda x: (x[0], x[1]))
    assert [x[:2] for x in some[:CLOSEST_CANDIDATES]] == [x[:2] for x in every[:CLOSEST_CANDIDATES]]
    for lay in over:  # and the state bound is below the memory bound it stands in for
        assert sc.as_run(lay).state_lower_bound(lay) <= sc.as_run(lay).memory_lower_bound(lay)


def test_smallest_cluster_hint_tries_the_module_ladder() -> None:
    """The hint prices the layouts the search would: with only selective recompute left (a pin), what fits 16 GPUs
    is a larger set of Megatron's modules from the ladder (``Scorer.module_ladder``), so the hint says 16, not the
    32 that Megatron's default modules alone need."""
    model, job, pins = load_model("llama3-70b"), JobSpec(global_batch_size=64), {"recompute": "selective"}
    with pytest.raises(InfeasibleError) as info:
        search(model, build_cluster("h100-sxm", 8), job, pins=pins)
    assert info.value.hint is not None
    n = int(info.value.hint.split(": ")[1].split()[0])
    plan = search(model, build_cluster("h100-sxm", n), job, pins=pins, top_k=1).plans[0]
    assert plan.parallel.recompute_modules is not None  # a ladder set, not Megatron's default
    with pytest.raises(InfeasibleError):  # and the next smaller size the hint tries has none
        search(model, build_cluster("h100-sxm", n // 2), job, pins=pins, find_smallest_cluster=False)


def test_search_package_never_prints_nor_imports_autoplan() -> None:
    for path in (ROOT / "search").glob("*.py"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "print":
                pytest.fail(f"{path.name} prints")
            if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "autoplan":
                pytest.fail(f"{path.name} imports autoplan")
            if isinstance(node, ast.Import) and any(a.name.split(".")[0] == "autoplan" for a in node.names):
                pytest.fail(f"{path.name} imports autoplan")


def test_progress_callback_reaches_the_end() -> None:
    seen: list[tuple[int, int]] = []
    model, cluster, job = load_model("llama3-8b"), build_cluster("h100-sxm", 8), JobSpec()
    search(model, cluster, job, progress=lambda d, t: seen.append((d, t)))
    assert seen and seen[-1][0] == seen[-1][1]


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(["llama3-8b", "mixtral-8x7b", "qwen3-235b-a22b", "llama2-13b", "gpt3-175b"]),
       st.sampled_from([("h100-sxm", 8), ("h100-sxm", 64), ("a100-80g", 256), ("gb200", 144), ("h200", 512)]),
       st.sampled_from([2048, 8192, 32768]), st.sampled_from([256, 1024]),
       st.sampled_from(["megatron", "torchtitan", "any"]))
def test_catalog_models_plans_obey_constraints(name, hw, seq, batch, target) -> None:  # type: ignore[no-untyped-def]
    model, cluster = load_model(name), build_cluster(hw[0], hw[1])
    job = JobSpec(global_batch_size=batch, seq_len=seq)
    try:
        res = search(model, cluster, job, target=target, top_k=2, find_smallest_cluster=False)
    except InfeasibleError as err:
        assert "closest" in str(err) or "hard constraints" in str(err)
        return
    assert 1 <= len(res.plans) <= 2
    for p in res.plans:
        _check_plan_constraints(model, cluster, job, p, target)
        if target == "megatron":
            assert p.parallel.schedule != "zb-h1" and (p.parallel.zero_stage != 3 or p.parallel.pp == 1)
        if target == "torchtitan":
            assert p.parallel.zero_stage in (0, 3)


@pytest.mark.parametrize("name,n", [("llama3-70b", 1024), ("llama3-8b", 64)])
def test_layer_costs_agree_with_the_intra_op_ilp_for_the_megatron_pattern(name: str, n: int) -> None:
    """The stage DP prices a layer with cost_models.layer_cost (what estimate uses). For a dense layer on each
    chosen plan's stage mesh the intra-op ILP (target megatron, priced by the same cost_models functions per
    op) proves the uniform Megatron pattern optimal: the same time to 1e-9."""
    import numpy as np

    from search.intra_op import IntraOpRequest, solve_layer
    from search.mesh import LogicalMesh
    from search.space import Layout

    model, cluster, job = load_model(name), build_cluster("h100-sxm", n), JobSpec()
    res = search(model, cluster, job, top_k=2)
    scorer = Scorer(model, cluster, job)
    for p in res.plans:
        par, dp, m = p.parallel, p.prediction.dp, p.prediction.num_microbatches
        lay = Layout(par.tp, par.cp, par.pp, dp, par.ep, par.micro_batch_size, m, par.recompute, par.zero_stage,
                     par.hsdp_shard_size, par.schedule, par.vp)
        # less what the knobs the search chose change (0 at the defaults: the ILP prices without a runtime)
        per_layer = (float(np.diff(scorer.layer_pieces(lay)[0])[0])
                     - scorer.knob_delta_s(lay, "dense"))
        mesh = LogicalMesh.from_degrees(cluster, dp=dp, tp=par.tp, cp=par.cp, ep=par.ep)
        ilp = solve_layer(model, mesh, IntraOpRequest(kind="dense", seq_len=job.seq_len,
                                                      micro_batch_size=par.micro_batch_size,
                                                      recompute=par.recompute, target="megatron",
                                                      num_microbatches=m, sequence_parallel=True))
        assert ilp.time_per_microbatch_s == pytest.approx(per_layer, rel=1e-9)


def test_sequence_parallel_pin_is_priced_like_estimate() -> None:
    model, cluster, job = load_model("llama3-8b"), build_cluster("h100-sxm", 16), JobSpec(global_batch_size=64)
    res = search(model, cluster, job, pins={"sequence_parallel": False, "tp": 2}, top_k=2)
    for p in res.plans:
        assert p.parallel.sequence_parallel is False and p.parallel.tp == 2
        _check_plan_constraints(model, cluster, job, p)
    scorer = Scorer(model, cluster, job)
    for lay in list(enumerate_layouts(model, cluster, job, "any", {"sequence_parallel": False}, Tally()))[::37]:
        from search.planner import default_split, to_parallel

        layers = default_split(model, lay)
        fs, pred = scorer.score(lay, layers), estimate(model, cluster, job, to_parallel(model, lay, layers),
                                                   target=lay.target, software=Software(**scorer.chosen_knobs(lay)))
        assert fs.step_time_s == pytest.approx(pred.step_time_s, rel=1e-9)
        assert fs.peak_memory_bytes / 2**30 == pytest.approx(pred.peak_memory_gib, rel=1e-9)


def test_explanation_parts_add_up_to_the_step_and_name_the_differences() -> None:
    from search.explain import explain, step_parts

    model, cluster, job = load_model("llama3-70b"), build_cluster("h100-sxm", 1024), JobSpec()
    res = search(model, cluster, job, top_k=3)
    for p in res.plans:
        assert sum(step_parts(p.prediction).values()) == pytest.approx(p.prediction.step_time_s, rel=1e-9)
    a, b = res.plans[0], res.plans[1]
    text = explain(a.parallel, a.prediction, b.parallel, b.prediction, cluster)
    assert text == a.explanation
    assert f"{a.prediction.step_time_s:.4g} s vs {b.prediction.step_time_s:.4g} s" in text
    for field in ("tp", "pp", "cp", "zero", "vp"):
        if getattr(a.parallel, {"zero": "zero_stage"}.get(field, field)) != getattr(
                b.parallel, {"zero": "zero_stage"}.get(field, field)):
            assert f"{field} " in text.split("layouts differ in")[1]


def test_ilp_solves_are_counted_apart_from_cache_hits() -> None:
    """The intra-op ILP prices every decoder layer kind on the path; a second search of the same job (another
    target) reuses the solutions its layouts share."""
    model, cluster, job = load_model("mixtral-8x7b"), build_cluster("h100-sxm", 64), JobSpec(global_batch_size=256)
    scorer = Scorer(model, cluster, job)
    first = search(model, cluster, job, scorer=scorer, top_k=1)
    assert first.ilp_solves >= 2 and first.ilp_cache_hits >= 1
    assert set(first.plans[0].op_shardings) == {"dense", "moe"} if any(
        not model.is_moe_layer(i) for i in range(model.num_layers)) else {"moe"}
    again = search(model, cluster, job, scorer=scorer, top_k=1)
    assert again.ilp_solves == 0 and again.ilp_cache_hits >= 1
    assert again.plans[0].parallel == first.plans[0].parallel


@pytest.mark.parametrize("ep", [1, 8])
def test_search_prices_the_moe_host_wait_as_estimate(ep: int) -> None:
    """The stage DP's layer times (the intra-op ILP's answer) carry the host-bound wait of MoE layers whose experts
    the host issues (megatron's fitted moe_host_s_per_layer / _per_expert), as ``estimate`` does: with 32 local
    experts it binds."""
    from search.space import Layout

    model, cluster = load_model("gpt-oss-20b"), build_cluster("h100-sxm", 8, target="megatron")
    job = JobSpec(global_batch_size=64, seq_len=1024, precision="bf16")
    lay = Layout(tp=1, cp=1, pp=1, dp=8, ep=ep, micro_batch_size=1, m=8, recompute="none", zero_stage=1,
                 hsdp_shard_size=None, schedule="1f1b", vp=1)
    scorer = Scorer(model, cluster, job)
    fs = scorer.score(lay, (model.num_layers,))
    pred = estimate(model, cluster, job, ParallelConfig(**lay.parallel_kwargs()), target="megatron",
                    software=Software(**scorer.chosen_knobs(lay)))
    assert cluster.efficiency.moe_host_s_per_expert > 0
    # 32 local experts: host-bound (about half the step); 4: the device's work covers all but the forward's issue
    # after the dispatcher's sync (ep_comm.host_bound_s; the per-layer term with it, about an eighth)
    assert (pred.time.host_bound_s > 0.3 * pred.step_time_s) == (ep == 1)
    assert fs.step_time_s == pytest.approx(pred.step_time_s, rel=1e-9)


@pytest.mark.parametrize("target, zero", [("megatron", 1), ("torchtitan", 3)])
@pytest.mark.parametrize("recompute", ["none", "full"])
def test_search_prices_the_moe_all_to_alls_full_recompute_reruns(target: str, zero: int, recompute: str) -> None:
    """Full recompute re-runs each MoE layer's forward dispatch and combine (``recompute.ep_forward_repeats``):
    the intra-op ILP's EP all-to-alls count the forward's twice, as ``estimate`` prices them, so the Scorer's step
    time is ``estimate``'s (it was below it by the re-run's exposed time)."""
    from search.space import Layout

    model, cluster = load_model("mixtral-8x7b"), build_cluster("h100-sxm", 16, target=target)
    job = JobSpec(global_batch_size=256, seq_len=4096)
    par = ParallelConfig(tp=1, ep=8, pp=1, zero_stage=zero, micro_batch_size=1, recompute=recompute)
    lay = Layout(tp=1, cp=1, pp=1, dp=16, ep=8, micro_batch_size=1, m=16, recompute=recompute,
                 zero_stage=zero, hsdp_shard_size=None, schedule="1f1b", vp=1, sequence_parallel=False, target=target)
    scorer = Scorer(model, cluster, job)
    fs = scorer.score(lay, (model.num_layers,))
    pred = estimate(model, cluster, job, par, target=target, software=Software(**scorer.chosen_knobs(lay)), check=False)
    assert pred.num_microbatches == lay.m
    assert pred.time.exposed_comm_s["ep"] > 0
    assert fs.step_time_s == pytest.approx(pred.step_time_s, rel=1e-9)


def test_pin_no_layout_keeps_names_why() -> None:
    """--ep on a dense model and --cp the search never tries say why (were "no layout keeps ep=2; valid: 1")."""
    from cost_models.errors import ConfigError

    model, cluster = load_model("llama3-8b"), build_cluster("h100-sxm", 8)
    with pytest.raises(ConfigError, match=r"no layout keeps ep=2 \(ep needs a MoE model; llama3-8b is dense\); "
                                          r"valid: 1$"):
        search(model, cluster, JobSpec(global_batch_size=8, seq_len=1024), pins={"ep": 2})
    with pytest.raises(ConfigError, match=r"no layout keeps cp=8 \(the search tries cp=8 only where seq_len is "
                                          r"divisible by 2\*cp = 16 and each CP rank holds at least 1024 tokens: "
                                          r"seq_len=1000\); valid: 1$"):
        search(model, cluster, JobSpec(global_batch_size=8, seq_len=1000), pins={"cp": 8})


@pytest.mark.parametrize("name, gpus, job, target", [
    # FSDP2's units on one stage: torchtitan (ep > 1) and fsdp2 near the 76 GiB limit (tp2 ep2 selective: 76.13 GiB)
    ("glm-4.5-air", 32, JobSpec(global_batch_size=64, seq_len=4096), "any"),
    # Megatron-LM's --use-torch-fsdp2 (pp 1, ep 1): the reviewer's layouts, far over the limit
    ("deepseek-v3", 256, JobSpec(global_batch_size=1024, seq_len=4096), "megatron"),
    # ... where its layouts fit: the MTP projection and norms in the root unit (Runtime.fsdp_mtp_unit "root")
    ("glm-4.5-air", 64, JobSpec(global_batch_size=64, seq_len=4096), "megatron"),
    # a hybrid stack: its Mamba layers in the root unit, the others their own units (Runtime.fsdp_root_kinds)
    ("nemotron-h-8b", 64, JobSpec(global_batch_size=64, seq_len=4096), "megatron"),
])
def test_zero3_scorer_memory_holds_the_mtp_unit_as_estimate(name, gpus, job, target) -> None:  # type: ignore[no-untyped-def]
    """ZeRO-3 with MTP: the last stage's gathered unit is the largest of its layers' and the MTP module's
    (``memory.stage_params``' ``largest_layer``, ``mtp.mtp_stage_params`` under the runtime's ``fsdp_mtp_unit``;
    Megatron's root unit holding eh_proj and the norms: ``memory.zero3_head_unit_bytes``); the Scorer's range table
    holds it too, so its peak and fit equal ``estimate``'s (before: low by per_largest x eh_proj, 0.84 GiB at
    deepseek-v3 tp1)."""
    from search.planner import default_split, to_parallel

    model, cluster = load_model(name), build_cluster("h100-sxm", gpus)
    scorer = Scorer(model, cluster, job)
    near = 0
    lays = [lay for lay in enumerate_layouts(model, cluster, job, target, {"zero_stage": 3}, Tally())
            if lay.tp <= 2 and lay.cp == 1]
    assert lays
    for lay in lays:
        layers = default_split(model, lay)
        fs = scorer.score(lay, layers)
        pred = estimate(model, cluster, job, to_parallel(model, lay, layers), target=lay.target,
                        software=Software(**scorer.chosen_knobs(lay)))
        assert fs.peak_memory_bytes / 2**30 == pytest.approx(pred.peak_memory_gib, rel=1e-9), lay
        assert fs.fits == pred.fits, lay
        near += abs(pred.peak_memory_gib - pred.memory_limit_gib) < 0.5
    assert near or target != "any"  # glm-4.5-air on 32 GPUs: a layout within 0.5 GiB of the limit is among them
