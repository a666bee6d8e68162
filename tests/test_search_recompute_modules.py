"""`autoplan search --recompute-modules`: Megatron's selective-recompute modules as a search pin.

The pin holds every plan to recompute 'selective' with exactly those modules; the search prices each layout with
them as ``estimate`` does (``Scorer.score`` == ``estimate``, the one cost model, ``cost_models.recompute``); the
flag, the request field and the refusals are estimate's own rules; the emitted plan carries the modules."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from autoplan import api
from autoplan.catalog import build_cluster, load_model
from autoplan.cli import cli
from cost_models.errors import ConfigError
from cost_models.estimate import estimate
from cost_models.recompute import module_errors
from cost_models.specs import RECOMPUTE_MODULES, JobSpec, ModelSpec, ParallelConfig
from cost_models.targets import Software
from cost_models.validate import stage_layers
from search.planner import _time_lower_bound, default_split, search, to_parallel
from search.score import Scorer
from search.space import Tally, enumerate_layouts

from test_planner import _check_split_lower_bound  # noqa: E402  (tests/ is on the path, as benchmark_modules)

DSV3 = ("mla_up_proj", "moe_act", "layernorm")  # Megatron-Bridge's DeepSeek-V3 recipes (the task's example)
DS_SEARCH = ["search", "--model", "deepseek-v3", "--gpus", "256", "--global-batch-size", "256", "--seq-len", "4096"]


def _run(*args: str) -> tuple[int, str]:
    """(exit code, stdout) on success, (exit code, stderr) on an error."""
    r = CliRunner().invoke(cli, list(args))
    return r.exit_code, r.stdout if r.exit_code == 0 else r.stderr


def _score_vs_estimate(model: ModelSpec, cluster, job: JobSpec, modules: tuple[str, ...], draw) -> None:  # type: ignore[no-untyped-def]
    """Scorer.score == estimate (step time, peak memory, cost) on layouts of a search pinned to ``modules``."""
    modules = tuple(m for m in RECOMPUTE_MODULES if m in modules)  # Megatron's order, as the pins give them
    pins = {"recompute": "selective", "recompute_modules": modules}
    layouts = list(enumerate_layouts(model, cluster, job, "megatron", pins, Tally()))
    assert layouts and all(lay.recompute == "selective" and lay.recompute_modules == modules for lay in layouts)
    scorer = Scorer(model, cluster, job)
    for lay in draw(layouts):
        par = to_parallel(model, lay, default_split(model, lay))
        assert par.recompute == "selective" and par.recompute_modules == modules
        layers = tuple(stage_layers(model, par))
        fs = scorer.score(lay, layers)
        pred = estimate(model, cluster, job, par, target="megatron", software=Software(**scorer.chosen_knobs(lay)),
                        check=False)
        assert fs.step_time_s == pytest.approx(pred.step_time_s, rel=1e-9)
        assert fs.peak_memory_bytes / 2**30 == pytest.approx(pred.peak_memory_gib, rel=1e-9)
        assert fs.composite_cost == pytest.approx(pred.composite_cost, rel=1e-9)
        assert scorer.memory_lower_bound(lay) <= fs.peak_memory_bytes * (1 + 1e-12)
        # the planner's bounds stay below what it prices (branch and bound skips nothing it should keep)
        assert _time_lower_bound(lay, scorer) <= fs.step_time_s * (1 + 1e-12)
        _check_split_lower_bound(scorer, lay)


@pytest.mark.parametrize("modules", [DSV3, ("moe", "mla_up_proj"), ("core_attn", "shared_experts")])
def test_deepseek_v3_scores_equal_estimate_with_the_modules(modules: tuple[str, ...]) -> None:
    """MLA, MoE after three dense layers, MTP: the modules change recompute time (the up-projections, norms and
    expert activation re-run; ``moe`` the dispatch and combine too) and memory (what they drop; ``moe`` and
    ``shared_experts`` a block re-run's transient on the stages whose layers have it)."""
    model, cluster = load_model("deepseek-v3"), build_cluster("h100-sxm", 256, target="megatron")
    job = JobSpec(global_batch_size=256, seq_len=4096)
    plain = Scorer(model, cluster, job)
    rng = random.Random(0)
    _score_vs_estimate(model, cluster, job, modules, lambda lays: rng.sample(lays, 8))
    # the modules are priced, not ignored: the same layout without them costs otherwise
    lay = next(iter(enumerate_layouts(model, cluster, job, "megatron",
                                      {"recompute": "selective", "recompute_modules": modules, "pp": 4}, Tally())))
    bare = lay.__class__(**{**lay.__dict__, "recompute_modules": None})
    layers = tuple(stage_layers(model, ParallelConfig(**lay.parallel_kwargs())))
    assert plain.score(lay, layers).step_time_s != pytest.approx(plain.score(bare, layers).step_time_s, rel=1e-6)


@st.composite
def _tiny_moe(draw):  # type: ignore[no-untyped-def]
    heads = draw(st.sampled_from([4, 8]))
    d = 64
    return ModelSpec(name="tiny", num_layers=draw(st.integers(4, 8)), hidden_size=heads * d,
                     ffn_hidden_size=heads * d * 2, num_attention_heads=heads, num_kv_heads=heads,
                     vocab_size=32000, num_experts=8, moe_top_k=2, first_dense_layers=draw(st.integers(0, 2)),
                     num_shared_experts=draw(st.integers(0, 1)))


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_tiny_moe(), st.sampled_from([8, 16]), st.data())
def test_scores_equal_estimate_on_mixed_dense_and_moe_stacks(model: ModelSpec, gpus: int, data) -> None:  # type: ignore[no-untyped-def]
    """Dense and MoE layers in one stack, interleaved splits: a block module's re-run transient is the largest over
    the kinds a stage (an interleaved rank: any of its chunks) holds, as ``memory.stage_memory`` prices it."""
    valid = [m for m in RECOMPUTE_MODULES
             if module_errors(model, ParallelConfig(recompute_modules=(m,)), None) is None]
    drawn = data.draw(st.sets(st.sampled_from(valid), min_size=1))
    modules = tuple(m for m in RECOMPUTE_MODULES if m in drawn)
    cluster, job = build_cluster("h100-sxm", gpus, target="megatron"), JobSpec(global_batch_size=32, seq_len=2048)
    _score_vs_estimate(model, cluster, job, modules,
                       lambda lays: data.draw(st.lists(st.sampled_from(lays), min_size=1, max_size=6)))


def test_cli_pins_every_plan_to_the_modules_and_emit_carries_them(tmp_path: Path) -> None:
    code, out = _run(*DS_SEARCH, "--recompute-modules", "mla_up_proj,moe_act,layernorm", "--format", "json")
    assert code == 0, out
    result = json.loads(out)
    assert result["plans"]
    for p in result["plans"]:  # Megatron's order (ParallelConfig's canonical form)
        assert p["parallel"]["recompute"] == "selective"
        assert p["parallel"]["recompute_modules"] == ["moe_act", "layernorm", "mla_up_proj"]
    plan = tmp_path / "plan.json"
    plan.write_text(out)
    from autoplan.emit.megatron import parse_megatron_args

    res = CliRunner().invoke(cli, ["emit", "--plan", str(plan), "-o", str(tmp_path / "emit")])
    assert res.exit_code == 0, res.output
    ns = parse_megatron_args((tmp_path / "emit" / "megatron_args.txt").read_text().split())
    assert ns.recompute_granularity == "selective"
    assert ns.recompute_modules == ["moe_act", "layernorm", "mla_up_proj"]


def test_table_names_the_modules() -> None:
    code, out = _run("search", "--model", "llama3-8b", "--gpus", "8", "--global-batch-size", "64", "--seq-len", "4096",
                     "--recompute-modules", "layernorm,core_attn")
    assert code == 0, out
    assert out.count("recompute=selective recompute_modules=core_attn,layernorm") == 3


def test_request_api_and_determinism() -> None:
    """The JSON request's parallel.recompute_modules (batch lines are requests): the same plans as the flag, and the
    same request twice on fresh engines gives the same plans."""
    req = {"model": "llama3-8b", "cluster": {"num_gpus": 8}, "job": {"global_batch_size": 64, "seq_len": 4096},
           "parallel": {"recompute_modules": ["layernorm", "mlp"]}}
    a = api.Engine().search(req)
    b = api.Engine().search(json.loads(json.dumps(req)))
    assert [p.parallel for p in a.plans] == [p.parallel for p in b.plans]
    assert [p.prediction for p in a.plans] == [p.prediction for p in b.plans]
    assert all(p.parallel.recompute_modules == ("layernorm", "mlp") for p in a.plans)
    # priced as estimate prices the plan (what users see)
    model, cluster = load_model("llama3-8b"), build_cluster("h100-sxm", 8, target="megatron")
    p = a.plans[0]
    assert p.prediction == estimate(model, cluster, JobSpec(global_batch_size=64, seq_len=4096), p.parallel,
                                    target="megatron", software=_priced(p))


def _priced(plan) -> Software:  # type: ignore[no-untyped-def]
    from autoplan.emit.plan import priced_software

    return priced_software(plan.prediction.software)


def test_bad_module_is_one_line_naming_the_valid_ones() -> None:
    code, out = _run("search", "--model", "llama3-8b", "--gpus", "8", "--recompute-modules", "layernorm,attn")
    assert code == 2
    line = out.strip()
    assert "\n" not in line and "Traceback" not in line
    assert "--recompute-modules" in line and "'attn' is not a Megatron recompute module" in line
    assert f"valid: {', '.join(RECOMPUTE_MODULES)}" in line and "nearest: core_attn" in line
    # estimate's rule, word for word (one check: cost_models.specs.recompute_module_names_error)
    _, est = _run("estimate", "--model", "llama3-8b", "--gpus", "8", "--tp", "1", "--pp", "1",
                  "--recompute-modules", "layernorm,attn")
    assert line.split(" (see ")[0] == est.strip().split(" (see ")[0]


@pytest.mark.parametrize("target", ["torchtitan", "fsdp2"])
def test_a_target_without_the_modules_refuses_them_as_estimate(target: str) -> None:
    code, out = _run("search", "--model", "llama3-8b", "--gpus", "8", "--target", target,
                     "--recompute-modules", "core_attn")
    assert code == 2 and "\n" not in out.strip()
    _, est = _run("estimate", "--model", "llama3-8b", "--gpus", "8", "--tp", "1", "--pp", "1", "--target", target,
                  "--recompute-modules", "core_attn")
    assert out.strip() == est.strip()
    assert f"recompute_modules: {target} has no such setting" in out and "valid: target megatron" in out


def test_any_searches_only_the_targets_that_run_the_modules() -> None:
    res = api.search({"model": "llama3-8b", "cluster": {"num_gpus": 8}, "target": "any",
                      "job": {"global_batch_size": 64, "seq_len": 4096}, "parallel": {"recompute_modules": ["mlp"]}})
    assert {p.target for p in res.plans} == {"megatron"}
    assert all(p.parallel.recompute_modules == ("mlp",) for p in res.plans)


def test_a_module_the_model_lacks_is_estimates_error() -> None:
    model, cluster = load_model("llama3-8b"), build_cluster("h100-sxm", 8)
    with pytest.raises(ConfigError) as err:
        search(model, cluster, JobSpec(global_batch_size=64, seq_len=4096),
               pins={"recompute": "selective", "recompute_modules": ("moe_act",)})
    assert "llama3-8b has no experts" in str(err.value) and "valid: core_attn, layernorm, mlp" in str(err.value)


def test_no_layout_keeping_a_module_pin_names_the_ladders_sets() -> None:
    """Where no layout keeps the pins and ``recompute_modules`` is the pin to blame, the error names the value, the
    constraint and, as its valid choices, the module sets the search prices: the target's ladder
    (``Scorer.module_ladder``; ``_pin_choices`` enumerated without it and said "relax the pins"). The CLI refuses a
    module the model or target cannot run earlier, with the Megatron rule (tests above), and a module pin alone cuts
    no layout, so ``_infeasible`` is driven directly as the search calls it when no layout is left."""
    from search.planner import _infeasible, _pin_choices, target_scorers

    model, cluster = load_model("deepseek-v3"), build_cluster("h100-sxm", 256, target="megatron")
    job = JobSpec(global_batch_size=256, seq_len=4096)
    scorers = target_scorers(model, cluster, job, "megatron", None, None)
    sets = [r for r in scorers["megatron"].module_ladder("megatron").sets if r != ("core_attn",)]
    pins = {"recompute_modules": ("shared_experts",)}
    key, valid = _pin_choices(model, cluster, job, "megatron", pins, scorers)
    assert key == "recompute_modules" and len(sets) >= 3 and sorted(valid) == sorted(sets)
    err = _infeasible(model, cluster, job, "megatron", pins, [], scorers, False, Tally())
    assert isinstance(err, ConfigError) and sorted(err.valid or []) == sorted(sets)
    assert "no layout keeps recompute_modules=('shared_experts',)" in str(err)
    assert f"valid: {', '.join(str(v) for v in err.valid or [])}" in str(err)


def test_pin_rules_are_parallel_configs() -> None:
    """'' recomputes nothing (recompute none, as estimate reads it); modules with full recompute are refused."""
    from autoplan.schema import ParallelPins

    assert ParallelPins(recompute_modules=[]).given() == {"recompute": "none"}
    assert ParallelPins(recompute_modules=["mlp", "core_attn"]).given() == {
        "recompute": "selective", "recompute_modules": ("core_attn", "mlp")}
    code, out = _run("search", "--model", "llama3-8b", "--gpus", "8", "--recompute", "full",
                     "--recompute-modules", "core_attn")
    assert code == 2 and "Megatron recomputes modules only under --recompute-granularity selective" in out
