"""`autoplan search` through click's CliRunner: table and JSON views, pins, infeasible jobs, --emit."""

from __future__ import annotations

import json

from click.testing import CliRunner

from autoplan.cli import cli
from autoplan.emit.plan import priced_software
from autoplan.schema import SearchResult
from cost_models.estimate import estimate
from cost_models.specs import JobSpec, ParallelConfig
from autoplan.catalog import build_cluster, load_model

SMALL = ["search", "--model", "llama3-8b", "--gpus", "16", "--global-batch-size", "64", "--seq-len", "4096"]


def _run(*args: str) -> tuple[int, str, str]:
    r = CliRunner(mix_stderr=False).invoke(cli, list(args)) if _has_mix() else CliRunner().invoke(cli, list(args))
    return r.exit_code, r.stdout, getattr(r, "stderr", "")


def _has_mix() -> bool:
    import inspect

    return "mix_stderr" in inspect.signature(CliRunner.__init__).parameters


def test_table_shows_job_plans_and_explanations() -> None:
    code, out, _ = _run(*SMALL)
    assert code == 0, out
    assert "global batch 64 x 4096 tokens, bf16" in out  # the assumed job
    assert "#1  dp=" in out and "#3  dp=" in out and "#4" not in out
    for field in ("step time", "throughput", "MFU", "peak memory", "memory (GiB)", "why"):
        assert field in out
    assert "searched" in out and "cut:" in out


def test_json_matches_the_schema_and_estimate() -> None:
    code, out, _ = _run(*SMALL, "--format", "json", "--top", "2")
    assert code == 0
    data = json.loads(out)
    SearchResult.model_validate(data)  # the published schema (autoplan schema)
    assert set(data) == {"version", "model", "cluster", "job", "plans", "search"}
    assert [p["rank"] for p in data["plans"]] == [1, 2]
    assert set(data["search"]) >= {"candidates", "pruned", "wall_time_s", "evaluated", "target"}
    assert isinstance(data["search"]["pruned"], dict)
    model, cluster = load_model("llama3-8b"), build_cluster("h100-sxm", 16)
    job = JobSpec(global_batch_size=64, seq_len=4096)
    for p in data["plans"]:
        par = ParallelConfig(**p["parallel"])
        sw = priced_software(p["prediction"]["software"])  # the knobs the search chose (issue 10)
        assert estimate(model, cluster, job, par, software=sw).model_dump(mode="json") == p["prediction"]
        assert p["explanation"]


def test_pins_are_kept() -> None:
    code, out, _ = _run(*SMALL, "--format", "json", "--tp", "2", "--pp", "2", "--zero", "0")
    assert code == 0, out
    for p in json.loads(out)["plans"]:
        assert (p["parallel"]["tp"], p["parallel"]["pp"], p["parallel"]["zero_stage"]) == (2, 2, 0)


def test_targets() -> None:
    code, out, _ = _run(*SMALL, "--format", "json", "--target", "torchtitan")
    assert code == 0
    assert {p["parallel"]["zero_stage"] for p in json.loads(out)["plans"]} <= {0, 3}


def test_infeasible_exits_3_with_closest_and_smallest_cluster() -> None:
    code, out, err = _run("search", "--model", "llama3-405b", "--gpus", "8", "--global-batch-size", "64")
    assert code == 3
    text = err or out
    assert "Infeasible" in text and "closest" in text and "smallest h100-sxm cluster with a plan" in text


def test_bad_pin_is_a_user_error_not_a_traceback() -> None:
    code, out, err = _run(*SMALL, "--tp", "3")
    assert code in (2, 3)
    assert "Traceback" not in (out + err)


def test_emit_writes_launch_files(tmp_path) -> None:  # type: ignore[no-untyped-def]
    code, out, err = _run(*SMALL, "--top", "1", "--emit", str(tmp_path / "out"))
    assert code == 0, out + err
    assert any((tmp_path / "out").iterdir())


def test_help_documents_job_defaults() -> None:
    code, out, _ = _run("search", "--help")
    assert code == 0
    assert "1024 x 8192" in out and "--top" in out and "--target" in out and "--emit" in out


def test_progress_appears_only_after_the_delay(capsys) -> None:  # type: ignore[no-untyped-def]
    from autoplan.cli.search_cmd import _Progress

    quiet = _Progress(delay_s=3600)
    quiet(1, 10)
    quiet.close()
    assert capsys.readouterr().err == ""
    loud = _Progress(delay_s=0)
    loud(5, 10)
    loud(10, 10)
    loud.close()
    assert "scoring" in capsys.readouterr().err


def test_plans_carry_the_ilp_op_shardings_and_solve_counts() -> None:
    code, out, _ = _run(*SMALL, "--top", "1", "--format", "json")
    assert code == 0, out
    data = json.loads(out)
    shard = data["plans"][0]["op_shardings"]["dense"]
    assert shard["q_proj"] == shard["k_proj"] == shard["gate_proj"]  # fused siblings share their node's mode
    tp = data["plans"][0]["parallel"]["tp"]
    assert shard["o_proj"] == ("row_sp" if tp > 1 else "R") and shard["attn_core"] == ("F" if tp > 1 else "R")
    assert data["search"]["ilp_solves"] + data["search"]["ilp_cache_hits"] >= 1  # solves may come from the cache


def test_every_command_is_found_by_its_lazily_imported_module() -> None:
    # autoplan.cli imports a command's module only when the command is looked up: the map must name the
    # module that defines each command, and every command defined must be in the map.
    import importlib
    import pkgutil

    import autoplan.cli as cli_pkg

    for info in pkgutil.iter_modules(cli_pkg.__path__):
        if info.name != "__main__":  # that one runs the CLI
            importlib.import_module(f"autoplan.cli.{info.name}")
    assert set(cli_pkg.cli.commands) == set(cli_pkg.COMMAND_MODULES)
    for name, module in cli_pkg.COMMAND_MODULES.items():
        assert cli_pkg.cli.commands[name].callback.__module__ == f"autoplan.cli.{module}"
