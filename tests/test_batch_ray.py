"""`--backend ray`: the same lines as the local backend, on a local Ray instance the test starts."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import jsonschema
import pytest
from click.testing import CliRunner

from autoplan.batch import run_batch
from autoplan.batch.sample import SMALL_SEARCH_POOL, mixed_requests
from autoplan.cli import cli
from autoplan.schema import schema_for

try:
    import ray
except ImportError:  # also a broken install: the rest of the suite does not need Ray
    pytest.skip("Ray not installed (pip install -e '.[ray]')", allow_module_level=True)


def deterministic(line: dict) -> dict:
    out = json.loads(json.dumps(line))
    if out.get("result") and "search" in out["result"]:
        out["result"]["search"].pop("wall_time_s")
    return out


@pytest.fixture(scope="module")
def ray_instance() -> Iterator[None]:
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    try:
        yield
    finally:
        ray.shutdown()


def test_ray_equals_local(ray_instance: None) -> None:
    lines = [s.text for s in mixed_requests(24, seed=3, search_share=0.1, search_pool=SMALL_SEARCH_POOL,
                                            infeasible=1)]
    on_ray = run_batch(lines, workers=2, backend="ray")
    local = run_batch(lines, workers=1)
    assert len(on_ray) == len(local)
    for a, b in zip(on_ray, local):
        assert deterministic(a.model_dump(mode="json")) == deterministic(b.model_dump(mode="json")), (a.line, a.status,
                                                                                                    a.message)
    assert {r.status for r in on_ray} == {"ok", "invalid", "infeasible"}
    validator = jsonschema.Draft202012Validator(schema_for("batch_line"))
    for r in on_ray:
        validator.validate(r.model_dump(mode="json"))


def test_cli_ray_backend(ray_instance: None, tmp_path: Path) -> None:
    path = tmp_path / "r.jsonl"
    path.write_text(json.dumps({"id": "x", "kind": "estimate", "model": "mixtral-8x7b", "cluster": {"num_gpus": 64},
                                "job": {"global_batch_size": 128}, "parallel": {"tp": 2, "ep": 8}}) + "\n")
    r = CliRunner().invoke(cli, ["batch", str(path), "--backend", "ray", "--workers", "2", "--no-progress"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["status"] == "ok" and "cache hit rate" in r.stderr


def test_more_workers_than_cpus_does_not_hang(ray_instance: None) -> None:
    est = {"kind": "estimate", "model": "llama3-8b", "cluster": {"num_gpus": 8}}
    reqs = [{**est, "id": f"r{i}", "job": {"global_batch_size": 8 * (i + 1)}} for i in range(6)]
    out = run_batch(reqs, workers=5, backend="ray")  # the test's Ray instance has 2 CPUs
    assert [r.status for r in out] == ["ok"] * 6
