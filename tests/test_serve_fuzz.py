"""A property-based fuzzer driven by the server's OpenAPI document (schemathesis): no request gets a 5xx.

Every operation of ``/openapi.json`` gets hypothesis-generated cases (valid and schema-shaped invalid bodies)
sent to the real server over HTTP. 504 (past the per-request time limit) is the designed answer for a job that
plans too long; every other 5xx fails."""

from __future__ import annotations

import os

import pytest

pytest.importorskip("fastapi")
schemathesis = pytest.importorskip("schemathesis")

from hypothesis import HealthCheck, given, settings  # noqa: E402

from tests.serve_util import running_server  # noqa: E402

EXAMPLES = int(os.environ.get("AUTOPLAN_FUZZ_EXAMPLES", "25"))  # per operation and mode (schema-valid, -violating)


@schemathesis.serializer("application/x-ndjson")
def _ndjson(ctx, value):  # type: ignore[no-untyped-def]
    """/v1/batch's body: the generated array as one JSON document per line."""
    del ctx
    import json
    items = value if isinstance(value, list) else [value]
    return "".join(json.dumps(v) + "\n" for v in items).encode("utf-8")


def test_no_server_errors():
    with running_server("--workers", "2", "--time-limit", "20") as url:
        schema = schemathesis.openapi.from_url(url + "/openapi.json")
        calls: dict[str, dict[int, int]] = {}
        for result in schema.get_all_operations():
            op = result.ok()
            seen = calls.setdefault(op.label, {})
            modes = list(schemathesis.GenerationMode) if op.method.upper() == "POST" else [None]
            for mode in modes:
                _fuzz(op, mode, seen)
        total = sum(sum(c.values()) for c in calls.values())
        print(f"fuzzer: {total} calls over {len(calls)} operations: {calls}")
        assert len(calls) >= 7 and total >= 4 * 2 * 10


def _fuzz(op, mode, seen):  # type: ignore[no-untyped-def]
    strategy = op.as_strategy() if mode is None else op.as_strategy(generation_mode=mode)

    @given(case=strategy)
    @settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck), database=None)
    def check(case):  # type: ignore[no-untyped-def]
        response = case.call(timeout=60)
        seen[response.status_code] = seen.get(response.status_code, 0) + 1
        assert response.status_code < 500 or response.status_code == 504, \
            (op.label, response.status_code, response.text[:300])

    check()


def test_planner_requests_never_5xx():
    """Schema-valid bodies rarely name a real model, so the planner itself is fuzzed here: catalog models,
    GPU counts, batches, sequence lengths and pins drawn at random, sent over HTTP to search and estimate."""
    import httpx
    from hypothesis import strategies as st

    from autoplan.catalog import gpu_names, model_names

    pins = st.fixed_dictionaries({}, optional={k: st.sampled_from([1, 2, 3, 4, 8, 16]) for k in ("tp", "pp", "cp")})
    body = st.fixed_dictionaries({
        "kind": st.sampled_from(["search", "estimate"]),
        "model": st.sampled_from(model_names()),
        "cluster": st.fixed_dictionaries({"num_gpus": st.sampled_from([1, 2, 8, 12, 64, 100, 512, 4096])},
                                         optional={"gpu": st.sampled_from(gpu_names())}),
        "job": st.fixed_dictionaries({}, optional={"global_batch_size": st.integers(1, 4096),
                                                   "seq_len": st.sampled_from([1, 1000, 4096, 8192, 131072])}),
        "parallel": pins,
    })
    seen: dict[int, int] = {}
    with running_server("--workers", "2", "--time-limit", "20") as url:
        @given(req=body)
        @settings(max_examples=max(10, EXAMPLES), deadline=None, suppress_health_check=list(HealthCheck),
                  database=None)
        def check(req):  # type: ignore[no-untyped-def]
            r = httpx.post(f"{url}/v1/{req['kind']}", json=req, timeout=120)
            seen[r.status_code] = seen.get(r.status_code, 0) + 1
            assert r.status_code in (200, 422, 504), (req, r.status_code, r.text[:300])
            if r.status_code == 200:
                assert r.json()["status"] in ("ok", "infeasible")
            elif r.status_code == 422:
                msg = r.json()["message"]
                assert msg and "\n" not in msg and "Traceback" not in msg

        check()
    print(f"planner fuzz: {sum(seen.values())} calls: {seen}")
    assert seen.get(200, 0) > 0
