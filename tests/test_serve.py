"""`autoplan serve`: the real server on a free port, over HTTP."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
httpx = pytest.importorskip("httpx")

from click.testing import CliRunner  # noqa: E402

from autoplan.cli import cli  # noqa: E402
from autoplan.schema import json_schema  # noqa: E402
from tests.serve_util import running_server  # noqa: E402

SEARCH = {"id": "s1", "model": "llama3-8b", "cluster": {"num_gpus": 16},
          "job": {"global_batch_size": 128, "seq_len": 4096}, "top": 2}


@pytest.fixture(scope="module")
def url():
    with running_server("--workers", "2", "--max-batch-lines", "50", "--max-body-bytes", "65536") as u:
        yield u


def test_health_models_hardware(url):
    h = httpx.get(url + "/healthz").json()
    assert h["status"] == "ok" and h["workers"] == 2
    names = [m["name"] for m in httpx.get(url + "/v1/models").json()["models"]]
    assert "llama3-70b" in names
    gpus = [g["name"] for g in httpx.get(url + "/v1/hardware").json()["gpus"]]
    assert "h100-sxm" in gpus


def test_search_estimate_scale_match_the_api(url):
    from autoplan import api

    r = httpx.post(url + "/v1/search", json=SEARCH, timeout=120)
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["status"] == "ok" and body["id"] == "s1"
    local = api.Engine().search({k: v for k, v in SEARCH.items()})
    got = [(p["parallel"], p["prediction"]["step_time_s"]) for p in body["result"]["plans"]]
    assert got == [(p.parallel.model_dump(mode="json"), p.prediction.step_time_s) for p in local.plans]
    est = httpx.post(url + "/v1/estimate", json={**SEARCH, "kind": "estimate", "parallel": {"tp": 2}, "top": None},
                     timeout=60)
    assert est.status_code == 422  # top is a search-only field
    est = httpx.post(url + "/v1/estimate", json={"model": "llama3-8b", "cluster": {"num_gpus": 16},
                                                 "parallel": {"tp": 2}}, timeout=60)
    assert est.status_code == 200 and est.json()["result"]["goodput"]["goodput"] > 0
    sc = httpx.post(url + "/v1/scale", json={"model": "llama3-8b", "gpus": [16, 32],
                                             "job": {"global_batch_size": 128, "seq_len": 4096}}, timeout=120)
    assert sc.status_code == 200 and [r["num_gpus"] for r in sc.json()["result"]["rows"]] == [16, 32]


def test_bad_request_is_4xx_with_the_cli_message(url):
    bad = {"model": "llama3-7b", "cluster": {"num_gpus": 8}}
    r = httpx.post(url + "/v1/search", json=bad, timeout=60)
    assert r.status_code == 422 and r.json()["status"] == "invalid"
    cli_out = CliRunner().invoke(cli, ["search", "--model", "llama3-7b", "--gpus", "8"])
    assert cli_out.exit_code == 2
    assert cli_out.output.strip() == "Error: " + r.json()["message"]
    r = httpx.post(url + "/v1/search", json={"model": "llama3-8b", "cluster": {"num_gpus": 0}}, timeout=60)
    assert r.status_code == 422 and "cluster.num_gpus" in r.json()["message"]
    r = httpx.post(url + "/v1/search", content=b"{not json", timeout=60)
    assert r.status_code == 400 and r.json()["message"].startswith("invalid JSON in the request body")
    r = httpx.post(url + "/v1/search", content=b"x" * 70000, timeout=60)
    assert r.status_code == 413 and "65536" in r.json()["message"]


def test_infeasible_is_200_with_the_hint(url):
    r = httpx.post(url + "/v1/search", json={"model": "llama3-405b", "cluster": {"num_gpus": 8}}, timeout=300)
    assert r.status_code == 200
    body = r.json()
    assert body["status"] == "infeasible" and body["result"] is None
    assert "fits" in body["message"] and "smallest" in body["hint"]


def test_batch_streams_lines_in_order(url):
    lines = []
    for i in range(12):
        if i == 5:
            lines.append("this is not json")
        elif i % 3 == 0:
            lines.append(json.dumps({"id": f"e{i}", "kind": "estimate", "model": "llama3-8b",
                                     "cluster": {"num_gpus": 8}, "parallel": {"tp": 1 + i % 2}}))
        else:
            lines.append(json.dumps({"id": f"s{i}", "model": "llama3-8b", "cluster": {"num_gpus": 8 * (1 + i % 2)},
                                     "top": 1}))
    with httpx.stream("POST", url + "/v1/batch", content="\n".join(lines) + "\n", timeout=300) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("application/x-ndjson")
        out = [json.loads(x) for x in r.iter_lines() if x.strip()]
    assert [o["line"] for o in out] == list(range(1, 13))
    assert out[5]["status"] == "invalid" and out[5]["message"].startswith("not valid JSON")
    assert all(o["status"] == "ok" for i, o in enumerate(out) if i != 5)
    assert [o["id"] for o in out if o["id"]] == [json.loads(x)["id"] for i, x in enumerate(lines) if i != 5]
    too_many = "\n".join([lines[0]] * 51)
    r = httpx.post(url + "/v1/batch", content=too_many, timeout=60)
    assert r.status_code == 413 and "50" in r.json()["message"]


def test_openapi_comes_from_the_schema_models(url):
    doc = httpx.get(url + "/openapi.json").json()
    assert {"/v1/search", "/v1/estimate", "/v1/scale", "/v1/batch", "/v1/models", "/v1/hardware",
            "/healthz"} <= set(doc["paths"])
    ours = json_schema()["$defs"]
    comps = doc["components"]["schemas"]
    for name in ("SearchRequest", "EstimateRequest", "ScaleRequest"):
        assert json.dumps(comps[name], sort_keys=True).replace("#/components/schemas/", "#/$defs/") == \
            json.dumps(ours[name], sort_keys=True)


def test_time_limit_gives_504():
    with running_server("--time-limit", "0.05") as u:
        r = httpx.post(u + "/v1/search", json={"model": "llama3-405b", "cluster": {"num_gpus": 16384}}, timeout=120)
        assert r.status_code == 504 and "time limit of 0.05 s" in r.json()["message"]
        assert httpx.get(u + "/healthz").status_code == 200


def test_serve_on_an_address_it_cannot_listen_on_is_one_line() -> None:
    """A port in use or an unknown host: exit 2 with one line (uvicorn logged it and exited 3, autoplan's
    'infeasible')."""
    import socket

    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        r = CliRunner().invoke(cli, ["serve", "--port", str(port)])
    assert r.exit_code == 2 and f"cannot listen on 127.0.0.1:{port}: Address already in use" in r.stderr, r.output
    r = CliRunner().invoke(cli, ["serve", "--host", "no-such-host.invalid", "--port", "8123"])
    assert r.exit_code == 2 and "cannot listen on no-such-host.invalid:8123" in r.stderr, r.output
