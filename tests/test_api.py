"""Python API: the CLI's JSON, the planner's plans, errors as types, safe request files, engine caches."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest
from click.testing import CliRunner

import autoplan
from autoplan import api
from autoplan.cli import cli
from autoplan.errors import ConfigError, InfeasibleError, UserInputError
from autoplan.schema import EstimateRequest, SearchRequest, schema_for

EST = {"kind": "estimate", "model": "llama3-70b", "cluster": {"num_gpus": 1024},
       "job": {"global_batch_size": 512, "seq_len": 8192}, "parallel": {"tp": 8, "pp": 8}}
SEARCH = {"model": "llama3-8b", "cluster": {"num_gpus": 8}, "job": {"global_batch_size": 64}}


def test_estimate_is_the_cli_json_exactly() -> None:
    r = CliRunner().invoke(cli, ["estimate", "--model", "llama3-70b", "--gpus", "1024", "--tp", "8", "--pp", "8",
                                 "--global-batch-size", "512", "--seq-len", "8192", "--format", "json"])
    assert r.exit_code == 0, r.stderr
    result = autoplan.estimate(EST)
    assert json.dumps(result.model_dump(mode="json"), indent=2) == r.stdout.strip()
    assert result.version == autoplan.__version__
    jsonschema.validate(result.model_dump(mode="json"), schema_for("estimate"))


def test_request_models_dicts_and_run_agree() -> None:
    engine = api.Engine()
    a = engine.estimate(EST)
    b = engine.estimate(EstimateRequest.model_validate(EST))
    c = engine.run(EST)
    assert a.model_dump() == b.model_dump() == c.model_dump()
    d = {k: v for k, v in EST.items() if k != "kind"}
    assert engine.estimate(d).model_dump() == a.model_dump()  # kind defaults to the function's


def test_errors_are_typed() -> None:
    with pytest.raises(ConfigError, match="tp=16 does not divide num_kv_heads=8"):  # torchtitan splits KV heads
        autoplan.estimate({**EST, "target": "torchtitan", "parallel": {"tp": 16, "pp": 8}})
    with pytest.raises(autoplan.InputError, match=r"parallel.tp: Input should be greater than 0 \(got 0\)"):
        autoplan.estimate({**EST, "parallel": {"tp": 0}})
    with pytest.raises(autoplan.AutoplanError, match=r"cluster.num_gpus: Input should be a valid integer \(got True\)"):
        autoplan.estimate({**EST, "cluster": {"num_gpus": True}})
    with pytest.raises(UserInputError, match="call search"):
        autoplan.estimate({**EST, "kind": "search"})
    with pytest.raises(UserInputError, match="did you mean"):
        autoplan.estimate({**EST, "model": "llama3-7b"})


def test_search_returns_the_planners_plans() -> None:
    from search.planner import search as plan

    result = api.Engine().search(SEARCH)
    specs = autoplan.api.resolve(SearchRequest.model_validate(SEARCH))
    direct = plan(specs.model, specs.cluster, specs.job, target="megatron", top_k=3)
    assert [p.model_dump(exclude={"goodput"}) for p in result.plans] == [p.model_dump() for p in direct.plans]
    assert all(p.goodput is not None and 0 < p.goodput.goodput < 1 for p in result.plans)
    assert result.search.candidates == direct.candidates and result.search.pruned == direct.pruned
    assert result.version == autoplan.__version__ and len(result.plans) == 3
    jsonschema.validate(result.model_dump(mode="json"), schema_for("search"))


def test_search_pins_and_top() -> None:
    result = api.Engine().search({**SEARCH, "parallel": {"tp": 1, "zero_stage": 3}, "top": 2})
    assert len(result.plans) <= 2
    assert all(p.parallel.tp == 1 and p.parallel.zero_stage == 3 for p in result.plans)


def test_infeasible_search_raises_with_hint() -> None:
    with pytest.raises(InfeasibleError, match="smallest"):
        api.Engine().search({"model": "llama3-405b", "cluster": {"num_gpus": 8}, "job": {"global_batch_size": 64}})


def test_engine_caches_responses_and_failures() -> None:
    engine = api.Engine()
    first = engine.estimate({**EST, "id": "a"})
    assert engine.estimate({**EST, "id": "b"}) is first  # the id is not part of the key
    for _ in range(2):
        with pytest.raises(ConfigError):
            engine.estimate({**EST, "parallel": {"tp": 16}})
    stats = engine.stats()["responses"]
    assert stats["hits"] == 2 and stats["misses"] == 2


def test_request_files_are_parsed_safely(tmp_path: Path) -> None:
    good = tmp_path / "req.yaml"
    good.write_text("kind: estimate\nmodel: llama3-8b\ncluster: {num_gpus: 8}\njob: {global_batch_size: 8}\n")
    assert isinstance(autoplan.load_request(good), EstimateRequest)
    evil = tmp_path / "evil.yaml"
    evil.write_text("model: !!python/object/apply:os.system ['echo pwned > %s']\ncluster: {num_gpus: 8}\n"
                    % (tmp_path / "pwned"))
    with pytest.raises(UserInputError, match="invalid YAML"):
        autoplan.load_request(evil)
    assert not (tmp_path / "pwned").exists()


def test_files_can_be_refused(tmp_path: Path) -> None:
    spec = tmp_path / "m.json"
    spec.write_text(json.dumps({"num_layers": 2, "hidden_size": 256, "ffn_hidden_size": 512,
                                "num_attention_heads": 4, "num_kv_heads": 4, "vocab_size": 1000}))
    req = {**EST, "model": str(spec), "cluster": {"num_gpus": 8}, "job": {"global_batch_size": 8},
           "parallel": {"tp": 2}}
    assert api.Engine().estimate(req).model.spec.num_layers == 2
    closed = api.Engine(allow_files=False)
    with pytest.raises(UserInputError, match="not allowed"):
        closed.estimate(req)
    with pytest.raises(UserInputError, match="not allowed"):
        closed.estimate({**EST, "cluster": {"num_gpus": 1024, "profile": "/etc/hostname"}})
    with pytest.raises(UserInputError, match="did you mean"):  # a typo is still a typo
        closed.estimate({**EST, "model": "llama3-7b"})


def test_absurd_models_are_refused_before_any_work() -> None:
    spec = {"num_layers": 10**9, "hidden_size": 256, "ffn_hidden_size": 512, "num_attention_heads": 4,
            "num_kv_heads": 4, "vocab_size": 1000}
    with pytest.raises(UserInputError, match=r"num_layers \(1000000000\) is above the request limit"):
        autoplan.estimate({"model": spec, "cluster": {"num_gpus": 8}})
    with pytest.raises(autoplan.InputError, match="num_gpus"):
        autoplan.search({"model": "llama3-8b", "cluster": {"num_gpus": 2**40}})


def test_package_reexports() -> None:
    for name in ("search", "estimate", "run", "SearchResult", "Estimate", "json_schema", "__version__"):
        assert hasattr(autoplan, name)


# ---- --request FILE on estimate/search --------------------------------------------------------------
def _cli(*args: str) -> tuple[int, str, str]:
    r = CliRunner().invoke(cli, list(args))
    return r.exit_code, r.stdout, r.stderr


def test_estimate_request_file_equals_flags(tmp_path: Path) -> None:
    path = tmp_path / "req.yaml"
    path.write_text("model: llama3-70b\ncluster: {num_gpus: 1024}\njob: {global_batch_size: 512}\n"
                    "parallel: {tp: 8, pp: 8}\n")  # kind defaults to the command's
    code, from_file, err = _cli("estimate", "--request", str(path), "--format", "json")
    assert code == 0, err
    code, from_flags, _ = _cli("estimate", "--model", "llama3-70b", "--gpus", "1024", "--tp", "8", "--pp", "8",
                               "--global-batch-size", "512", "--format", "json")
    assert from_file == from_flags


def test_search_request_file_equals_flags(tmp_path: Path) -> None:
    path = tmp_path / "req.json"
    path.write_text(json.dumps({**SEARCH, "top": 2, "parallel": {"tp": 1}}))
    code, from_file, err = _cli("search", "--request", str(path), "--format", "json")
    assert code == 0, err
    code, from_flags, _ = _cli("search", "--model", "llama3-8b", "--gpus", "8", "--global-batch-size", "64",
                               "--top", "2", "--tp", "1", "--format", "json")
    a, b = json.loads(from_file), json.loads(from_flags)
    a["search"].pop("wall_time_s"), b["search"].pop("wall_time_s")
    assert a == b and len(a["plans"]) == 2


@pytest.mark.parametrize("extra, needle", [
    (["--tp", "4"], "--request replaces --tp"),
    (["--model", "llama3-8b"], "--request replaces --model"),
])
def test_request_file_and_flags_do_not_mix(tmp_path: Path, extra: list[str], needle: str) -> None:
    path = tmp_path / "req.json"
    path.write_text(json.dumps(EST))
    code, _, err = _cli("estimate", "--request", str(path), *extra)
    assert code == 2 and needle in err and err.strip().count("\n") == 0


def test_request_file_kind_must_match_the_command(tmp_path: Path) -> None:
    path = tmp_path / "req.json"
    path.write_text(json.dumps(EST))
    code, _, err = _cli("search", "--request", str(path))
    assert code == 2 and "run `autoplan estimate --request`" in err
    code, _, err = _cli("estimate", "--request", str(tmp_path / "missing.json"))
    assert code == 2 and "cannot read" in err


def test_searches_of_one_job_share_planner_subresults() -> None:
    """A second search of the same job (another target) reuses the worker's Scorer and answers exactly as a
    fresh engine does. ``any`` prices each target's layouts on that target's cluster: Megatron's Scorer is reused,
    torchtitan and fsdp2 (their own efficiency sets) get one each."""
    from autoplan.api import Engine

    base = {"model": "llama3-8b", "cluster": {"num_gpus": 64}, "job": {"global_batch_size": 256}}
    shared = Engine()
    shared.search({**base, "target": "megatron"})
    reused = shared.search({**base, "target": "any"})
    assert shared.stats()["scorers"] == {"hits": 1, "misses": 3, "size": 3}
    fresh = Engine().search({**base, "target": "any"})
    a, b = reused.model_dump(mode="json"), fresh.model_dump(mode="json")
    assert a["search"]["ilp_solves"] < b["search"]["ilp_solves"]  # Megatron's layer problems were solved already
    for key in ("wall_time_s", "ilp_solves", "ilp_cache_hits"):
        a["search"].pop(key)
        b["search"].pop(key)
    assert a == b


@pytest.mark.parametrize("path", [None, 5])
def test_load_request_of_no_path_is_a_user_error(path: object) -> None:
    """Not a raw TypeError from pathlib ("expected str, bytes or os.PathLike object, not NoneType")."""
    with pytest.raises(autoplan.UserInputError, match=f"a path must be a string, not {type(path).__name__}"):
        autoplan.load_request(path)  # type: ignore[arg-type]


def test_a_model_file_may_be_a_path_object(tmp_path: Path) -> None:
    """A pathlib.Path names the file as its text does (model and cluster profile), as ``--model PATH`` on the CLI."""
    hf = Path(__file__).parent / "data" / "hf" / "gpt2.json"
    req = {"model": hf, "cluster": {"num_gpus": 8}, "parallel": {"tp": 1}}
    assert autoplan.estimate(req) == autoplan.estimate({**req, "model": str(hf)})
    with pytest.raises(UserInputError, match=r"^model file '.*nonexistent.json' does not exist$"):
        autoplan.estimate({**req, "model": tmp_path / "nonexistent.json"})
    with pytest.raises(UserInputError, match=r"^cluster profile '.*nope.yaml' does not exist$"):
        autoplan.estimate({**req, "cluster": {"num_gpus": 8, "profile": tmp_path / "nope.yaml"}})


@pytest.mark.parametrize("request_", [Path("config.json"), "llama3-8b"])
def test_a_model_in_place_of_the_request_says_how_to_pass_it(request_: object) -> None:
    with pytest.raises(UserInputError) as err:
        autoplan.search(request_)  # type: ignore[arg-type]
    assert str(err.value) == (f"a request must be a mapping, got {type(request_).__name__}; a model goes in it as "
                              f'{{"model": "{request_}", "cluster": {{"num_gpus": ...}}}} and a request file is read '
                              "with autoplan.load_request(path)")
