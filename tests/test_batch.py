"""`autoplan batch`: statuses per line, input order, isolation, limits, determinism across workers."""

from __future__ import annotations

import io
import json
import multiprocessing
import os
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from click.testing import CliRunner

from autoplan import api
from autoplan.batch import BatchRun, Limits, Progress, read_lines, run_batch
from autoplan.batch import local as local_backend
from autoplan.batch.sample import SMALL_SEARCH_POOL, SampleLine, mixed_requests
from autoplan.cli import cli
from autoplan.errors import UserInputError
from autoplan.schema import schema_for

LINE_SCHEMA = jsonschema.Draft202012Validator(schema_for("batch_line"))
SUMMARY_SCHEMA = jsonschema.Draft202012Validator(schema_for("batch_summary"))


def small_mix() -> list[SampleLine]:
    """40 lines: every kind of broken line, one impossible search, cheap searches, random estimates."""
    return mixed_requests(40, seed=7, search_share=0.15, search_pool=SMALL_SEARCH_POOL, infeasible=2)


def deterministic(line: dict[str, Any]) -> dict[str, Any]:
    """A result line without the planner's wall time (the only field that varies run to run)."""
    out = json.loads(json.dumps(line))
    if out.get("result") and "search" in out["result"]:
        out["result"]["search"].pop("wall_time_s")
    return out


@pytest.fixture(scope="module")
def mix_file(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[SampleLine]]:
    lines = small_mix()
    path = tmp_path_factory.mktemp("batch") / "requests.jsonl"
    path.write_text("".join(s.text + "\n" for s in lines))
    return path, lines


@pytest.fixture(scope="module")
def cli_results(mix_file: tuple[Path, list[SampleLine]]) -> tuple[list[dict[str, Any]], str]:
    path, _ = mix_file
    out = path.parent / "results.jsonl"
    r = CliRunner().invoke(cli, ["batch", str(path), "-o", str(out), "--workers", "2", "--no-progress"])
    assert r.exit_code == 0, r.output
    return [json.loads(t) for t in out.read_text().splitlines()], r.stderr


def test_every_line_gets_its_status_in_order(mix_file, cli_results) -> None:  # type: ignore[no-untyped-def]
    _, lines = mix_file
    results, _ = cli_results
    assert len(results) == len(lines)
    assert [r["line"] for r in results] == list(range(1, len(lines) + 1))
    for sample, res in zip(lines, results):
        assert res["status"] == sample.expected, (sample.text, res.get("message"))
        data = _maybe_json(sample.text)
        if isinstance(data, dict) and isinstance(data.get("id"), str):
            assert res["id"] == data["id"]
        if res["status"] == "ok":
            assert res["result"]["version"] == res["version"]
            assert res["message"] is None
        else:
            assert res["result"] is None and res["message"] and "\n" not in res["message"]
            assert "Traceback" not in res["message"]
    statuses = {r["status"] for r in results}
    assert statuses == {"ok", "invalid", "infeasible"}
    assert {r["kind"] for r in results if r["status"] == "ok"} == {"search", "estimate"}


def test_every_output_line_validates_against_the_schema(cli_results) -> None:  # type: ignore[no-untyped-def]
    results, _ = cli_results
    for res in results:
        LINE_SCHEMA.validate(res)


def test_summary_on_stderr(cli_results) -> None:  # type: ignore[no-untyped-def]
    _, stderr = cli_results
    assert "40 requests" in stderr and "plans/s" in stderr and "cache hit rate" in stderr
    assert "ok " in stderr and "invalid 12" in stderr and "infeasible 2" in stderr


def test_batch_equals_individual_calls(mix_file, cli_results) -> None:  # type: ignore[no-untyped-def]
    _, lines = mix_file
    results, _ = cli_results
    engine = api.Engine()  # a fresh engine: no result comes from the batch's caches
    checked = 0
    for sample, res in zip(lines, results):
        if res["status"] != "ok":
            continue
        alone = engine.run(json.loads(sample.text)).model_dump(mode="json")
        assert deterministic({"result": alone}) == deterministic({"result": res["result"]})
        checked += 1
    assert checked == sum(s.expected == "ok" for s in lines)


def test_same_results_for_any_worker_count(mix_file, cli_results) -> None:  # type: ignore[no-untyped-def]
    _, lines = mix_file
    results, _ = cli_results
    one = run_batch([s.text for s in lines], workers=1)
    assert [deterministic(r.model_dump(mode="json")) for r in one] == [deterministic(r) for r in results]


def test_python_batch_api_and_stdin() -> None:
    reqs = [{"id": "a", "kind": "estimate", "model": "llama3-8b", "cluster": {"num_gpus": 8},
             "job": {"global_batch_size": 8}, "parallel": {"tp": 2}},
            {"id": "b", "kind": "estimate", "model": "llama3-8b", "cluster": {"num_gpus": 8},
             "parallel": {"tp": 3}}]
    out = run_batch(reqs)
    assert [(r.id, r.status) for r in out] == [("a", "ok"), ("b", "invalid")]
    stdin = "".join(json.dumps(r) + "\n" for r in reqs)
    r = CliRunner().invoke(cli, ["batch", "-", "--no-progress"], input=stdin)
    assert r.exit_code == 0
    assert [json.loads(t)["status"] for t in r.stdout.splitlines()] == ["ok", "invalid"]


# ---- limits ---------------------------------------------------------------------------------------
def test_long_line_is_invalid_and_the_batch_goes_on() -> None:
    text = (b'{"id": "big", "model": "' + b"x" * 5000 + b'", "cluster": {"num_gpus": 8}}\n'
            b'{"id": "ok", "kind": "estimate", "model": "llama3-8b", "cluster": {"num_gpus": 8}, '
            b'"job": {"global_batch_size": 8}}\n')
    lines = read_lines(io.BytesIO(text), Limits(max_line_bytes=1000))
    assert lines[0].refused and "longer than 1000 bytes" in lines[0].refused
    out = [json.loads(t) for _, _, t in BatchRun(lines).answers()]
    assert [o["status"] for o in out] == ["invalid", "ok"] and out[1]["id"] == "ok" and out[1]["line"] == 2


def test_too_many_lines_or_bytes_refuse_the_batch(tmp_path: Path) -> None:
    path = tmp_path / "many.jsonl"
    path.write_text('{"model": "llama3-8b", "cluster": {"num_gpus": 8}}\n' * 11)
    r = CliRunner().invoke(cli, ["batch", str(path), "--max-lines", "10"])
    assert r.exit_code == 2 and "more than 10 requests (--max-lines)" in r.stderr
    assert r.stdout == "" and r.stderr.strip().count("\n") == 0
    r = CliRunner().invoke(cli, ["batch", str(path), "--max-bytes", "100"])
    assert r.exit_code == 2 and "larger than 100 bytes" in r.stderr
    with pytest.raises(UserInputError):
        read_lines(io.BytesIO(b"{}\n" * 5), Limits(max_lines=4))


def test_requests_naming_files_can_be_refused(tmp_path: Path) -> None:
    line = json.dumps({"id": "f", "kind": "estimate", "model": "/etc/passwd", "cluster": {"num_gpus": 8}})
    path = tmp_path / "f.jsonl"
    path.write_text(line + "\n")
    r = CliRunner().invoke(cli, ["batch", str(path), "--no-files", "--no-progress"])
    res = json.loads(r.stdout)
    assert res["status"] == "invalid" and "not allowed" in res["message"]


# ---- isolation ------------------------------------------------------------------------------------
def _dies_on_crash(engine: api.Engine, line: Any) -> Any:
    if line.text and "CRASH" in line.text:
        os._exit(13)
    return _REAL_ANSWER(engine, line)


_REAL_ANSWER = local_backend.answer


@pytest.mark.skipif(multiprocessing.get_start_method() != "fork", reason="the patched worker needs fork")
def test_a_line_that_kills_its_worker_is_an_error_and_the_rest_succeed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(local_backend, "answer", _dies_on_crash)
    est = {"kind": "estimate", "model": "llama3-8b", "cluster": {"num_gpus": 8}}
    reqs = [{**est, "id": f"r{i}", "job": {"global_batch_size": 8 * (i + 1)}} for i in range(12)]
    reqs[5] = {**reqs[5], "id": "CRASH"}
    run = BatchRun(read_lines(io.BytesIO("".join(json.dumps(r) + "\n" for r in reqs).encode())), workers=2,
                   chunk_size=3)
    out = [json.loads(t) for _, _, t in run.answers()]
    assert [o["line"] for o in out] == list(range(1, 13))
    assert [o["status"] for o in out] == ["ok"] * 5 + ["error"] + ["ok"] * 6
    assert "worker died" in out[5]["message"]
    assert run.restarts >= 1


def test_duplicate_requests_are_planned_once() -> None:
    est = {"kind": "estimate", "model": "llama3-8b", "cluster": {"num_gpus": 8}, "job": {"global_batch_size": 8}}
    reqs = [{**est, "id": "a"}, {**est, "id": "b"}, {**est, "id": 7}, {**est, "parallel": {"tp": 3}, "id": "c"},
            {**est, "parallel": {"tp": 3}, "id": "d"}, est]
    run = BatchRun(read_lines(io.BytesIO("".join(json.dumps(r) + "\n" for r in reqs).encode())), workers=2)
    out = [json.loads(t) for _, _, t in run.answers()]
    assert [(o["id"], o["line"], o["status"]) for o in out] == [
        ("a", 1, "ok"), ("b", 2, "ok"), (None, 3, "invalid"), ("c", 4, "invalid"), ("d", 5, "invalid"),
        (None, 6, "ok")]
    assert out[0]["result"] == out[1]["result"] == out[5]["result"]
    assert run.duplicates == 3 and run.cache_stats()["duplicates"] == {"hits": 3, "misses": 3, "hit_rate": 0.5}


def test_progress_bar_renders() -> None:
    buf = io.StringIO()
    bar = Progress(4, buf, enabled=True)
    for status in ("ok", "ok", "invalid", "ok"):
        bar(0, status)
    bar.close()
    assert "4/4" in buf.getvalue() and "invalid 1" in buf.getvalue() and "#" in buf.getvalue()


def test_summary_validates() -> None:
    run = BatchRun(read_lines(io.BytesIO(b'{"kind": "estimate", "model": "llama3-8b", "cluster": {"num_gpus": 8},'
                                         b' "job": {"global_batch_size": 8}}\nnope\n')))
    list(run.answers())
    summary = run.summary()
    SUMMARY_SCHEMA.validate(summary.model_dump(mode="json"))
    assert summary.counts == {"ok": 1, "infeasible": 0, "invalid": 1, "error": 0}


def _maybe_json(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return None


def test_ray_backend_without_ray_is_one_clear_line(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    import sys
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray -> ImportError
    path = tmp_path / "r.jsonl"
    path.write_text('{"model": "llama3-8b", "cluster": {"num_gpus": 8}}\n')
    r = CliRunner().invoke(cli, ["batch", str(path), "--backend", "ray", "--no-progress"])
    assert r.exit_code == 2 and "pip install 'autoplan[ray]'" in r.stderr


def test_ray_address_without_the_ray_backend_is_refused(tmp_path: Path) -> None:
    """--address auto with the default local backend was silently ignored (the batch ran here)."""
    path = tmp_path / "in.jsonl"
    path.write_text(json.dumps({"id": "a", "kind": "estimate", "model": "llama3-8b", "cluster": {"num_gpus": 8},
                                "parallel": {"tp": 8, "pp": 1}}) + "\n")
    out = tmp_path / "out.jsonl"
    r = CliRunner().invoke(cli, ["batch", str(path), "--address", "auto", "-o", str(out), "--no-progress"])
    assert r.exit_code == 2 and "address 'auto' is a Ray cluster's; it needs backend 'ray'" in r.stderr, r.output
    assert not out.exists()
    with pytest.raises(UserInputError, match=r"backend 'dask' is not one autoplan runs; valid: local, ray"):
        BatchRun([], backend="dask")  # type: ignore[arg-type]


def test_a_reused_id_is_refused_on_its_line() -> None:
    """Output lines are matched to requests by id: a second request under one id was planned silently, so two
    answers carried the same id. The first line with an id is planned; a later one is answered invalid, the id
    echoed and the first line named; lines without an id, and equal requests under other ids, are unaffected."""
    est = {"kind": "estimate", "model": "llama3-8b", "cluster": {"num_gpus": 8}, "job": {"global_batch_size": 8}}
    reqs = [{**est, "id": "a"}, {**est, "id": "a", "parallel": {"tp": 2}}, {**est, "id": "b"}, {**est, "id": "a"},
            est, est, {**est, "id": "x" * 300}, {**est, "id": "x" * 256}]
    out = [json.loads(t) for _, _, t in BatchRun(read_lines(io.BytesIO(
        "".join(json.dumps(r) + "\n" for r in reqs).encode()))).answers()]
    assert [(o["id"], o["line"], o["status"]) for o in out] == [
        ("a", 1, "ok"), ("a", 2, "invalid"), ("b", 3, "ok"), ("a", 4, "invalid"), (None, 5, "ok"), (None, 6, "ok"),
        ("x" * 256, 7, "invalid"), ("x" * 256, 8, "ok")]  # an over-long id claims none (invalid for its length)
    assert out[1]["message"] == out[3]["message"] == ("id 'a' is already the id of line 1; each request of a batch "
                                                      "needs its own id")
    assert "at most 256 characters" in out[6]["message"]
    assert [o.status for o in run_batch([{**est, "id": "a"}, {**est, "id": "a"}])] == ["ok", "invalid"]
    r = CliRunner().invoke(cli, ["batch", "-", "--no-progress"],
                           input="".join(json.dumps({**est, "id": "a"}) + "\n" for _ in range(2)))
    assert r.exit_code == 0 and [json.loads(t)["status"] for t in r.stdout.splitlines()] == ["ok", "invalid"]
    assert "invalid 1" in r.stderr


def test_a_line_that_is_no_object_names_its_json_type() -> None:
    """``null`` was "got NoneType", ``[]`` "got list": the Python names of what the user wrote in JSON."""
    out = [json.loads(t) for _, _, t in BatchRun(read_lines(io.BytesIO(b"null\n[]\n\"x\"\n4.5\ntrue\n"))).answers()]
    assert [o["message"] for o in out] == [f"a request must be a JSON object, got {t}"
                                          for t in ("null", "array", "string", "number", "boolean")]
    assert all(o["status"] == "invalid" for o in out)
