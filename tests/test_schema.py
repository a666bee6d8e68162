"""`autoplan schema`: a valid JSON Schema that accepts the documented requests and every response shape."""

from __future__ import annotations

import json

import jsonschema
import pytest
from click.testing import CliRunner

import autoplan
from autoplan.cli import cli
from autoplan.schema import json_schema, schema_for

REQUESTS = [
    {"model": "llama3-8b", "cluster": {"num_gpus": 8}},
    {"id": "job-1", "kind": "search", "model": "llama3-70b",
     "cluster": {"gpu": "h100-sxm", "num_gpus": 1024, "gpus_per_node": 8, "inter_node_gbps": 400},
     "job": {"global_batch_size": 512, "seq_len": 8192, "precision": "bf16"}, "parallel": {"tp": 8},
     "top": 5, "target": "torchtitan"},
    {"id": "e", "kind": "estimate", "model": {"name": "tiny", "num_layers": 2, "hidden_size": 256,
                                              "ffn_hidden_size": 512, "num_attention_heads": 4, "num_kv_heads": 4,
                                              "vocab_size": 1000},
     "cluster": {"num_gpus": 8}, "parallel": {"tp": 2, "pp": 2, "recompute": "full"}},
]
BAD_REQUESTS = [
    {"model": "llama3-8b"},                                               # no cluster
    {"model": "llama3-8b", "cluster": {"num_gpus": 8}, "kind": "plan"},   # unknown kind
    {"model": "llama3-8b", "cluster": {"num_gpus": 8}, "surprise": 1},    # unknown field
    {"model": "llama3-8b", "cluster": {"num_gpus": 0}},                   # out of range
    {"model": "llama3-8b", "cluster": {"num_gpus": 8}, "kind": "estimate", "top": 3},  # search-only option
]


def test_cli_prints_a_valid_schema() -> None:
    r = CliRunner().invoke(cli, ["schema"])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    jsonschema.Draft202012Validator.check_schema(doc)
    assert doc["version"] == autoplan.__version__
    assert set(doc["responses"]) == {"estimate", "search", "batch_line", "batch_summary", "scale"}
    part = json.loads(CliRunner().invoke(cli, ["schema", "request"]).stdout)
    assert part == schema_for("request")


@pytest.mark.parametrize("request_", REQUESTS)
def test_documented_requests_validate(request_: dict) -> None:
    jsonschema.validate(request_, schema_for("request"))
    autoplan.parse_request(request_)  # and pydantic agrees


@pytest.mark.parametrize("request_", BAD_REQUESTS)
def test_bad_requests_fail_both_validators(request_: dict) -> None:
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(request_, schema_for("request"))
    with pytest.raises(ValueError):
        autoplan.parse_request(request_)


def test_every_response_has_a_version() -> None:
    doc = json_schema()
    for name in doc["responses"]:
        assert "version" in schema_for(name)["properties"], name


def test_scale_request_and_response_schema() -> None:
    req = {"model": "llama3-8b", "gpus": [16, 32], "job": {"global_batch_size": 128, "seq_len": 4096}}
    jsonschema.validate(req, schema_for("scale_request"))
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({**req, "gpus": []}, schema_for("scale_request"))
    result = autoplan.api.Engine().scale(req)
    jsonschema.validate(result.model_dump(mode="json"), schema_for("scale"))
