"""A property-based fuzzer driven by the server's OpenAPI document (schemathesis): no request gets a 5xx.

Every operation of ``/openapi.json`` gets hypothesis-generated cases (valid and schema-shaped invalid bodies)
sent to the real server over HTTP. 504 (past the per-request time limit) is the designed answer for a job that
plans too long; every other 5xx fails."""

from __future__ import annotations

import pytest

pytest.importorskip("fastapi")
schemathesis = pytest.importorskip("schemathesis")

from hypothesis import HealthCheck, given, settings  # noqa: E402

from tests.serve_util import running_server  # noqa: E402

EXAMPLES = 30  # per operation


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

            @given(case=op.as_strategy())
            @settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck), database=None)
            def check(case):  # type: ignore[no-untyped-def]
                response = case.call(timeout=60)
                seen[response.status_code] = seen.get(response.status_code, 0) + 1
                assert response.status_code < 500 or response.status_code == 504, \
                    (op.label, response.status_code, response.text[:300])

            check()
        total = sum(sum(c.values()) for c in calls.values())
        print(f"fuzzer: {total} calls over {len(calls)} operations: {calls}")
        assert len(calls) >= 7 and total >= 7 * 5
