"""The shared validation layer (autoplan.inputs) and the issue-14 reproductions it fixes, one test each."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

import autoplan
from autoplan.cli import cli
from autoplan.catalog import load_model
from autoplan.errors import UserInputError
from autoplan.inputs import MAX_FILE_BYTES, check_tree, parse_json, parse_yaml, read_mapping

EST = ["estimate", "--gpus", "8", "--tp", "1", "--pp", "1"]


def _cli(*args: str) -> tuple[int, str, str]:  # (exit code, stderr, stdout)
    r = CliRunner().invoke(cli, list(args))
    return r.exit_code, r.stderr, r.stdout


def _one_line_error(code: int, err: str, out: str = "", expected: int = 2) -> str:
    assert code == expected, err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    return err.strip()


def test_binary_utf16_and_special_model_files(tmp_path: Path) -> None:
    binary = tmp_path / "garbage.json"
    binary.write_bytes(bytes(range(200, 256)) * 4)
    assert "is not UTF-8 text" in _one_line_error(*_cli(*EST, "--model", str(binary)))
    utf16 = tmp_path / "u16.json"
    utf16.write_text('{"num_layers": 2}', encoding="utf-16")
    assert "looks like UTF-16" in _one_line_error(*_cli(*EST, "--model", str(utf16)))
    fifo = tmp_path / "pipe.yaml"
    os.mkfifo(fifo)
    assert "not a regular file" in _one_line_error(*_cli(*EST, "--model", str(fifo)))
    assert "not a regular file" in _one_line_error(*_cli(*EST, "--model", "llama3-8b", "--cluster", str(fifo)))
    assert "no such user" in _one_line_error(*_cli(*EST, "--model", "~no-such-user-xyz/m.json"))
    assert "longer than" in _one_line_error(*_cli(*EST, "--model", "x" * 5000 + ".json"))


@pytest.mark.parametrize("name", ["0" * 40 + "\x80İĳ" * 120, "y" * 300, "dir/" + "z" * 256 + ".json",
                                  "a\udc80\ud800"])
def test_a_name_the_file_system_cannot_hold_is_a_user_error(name: str) -> None:
    """Under 1024 characters but over NAME_MAX bytes in one component (a serve fuzz case: 'File name too long', an
    internal error), or not encodable at all: refused by name, as any bad model source."""
    with pytest.raises(UserInputError, match="longer than 255 bytes|not encodable"):
        load_model(name)


def test_oversized_file_is_refused_before_parsing(tmp_path: Path) -> None:
    big = tmp_path / "big.yaml"
    with open(big, "wb") as f:
        f.truncate(MAX_FILE_BYTES + 1)
    with pytest.raises(UserInputError, match="the limit is"):
        read_mapping(big)


def test_yaml_alias_bomb_is_bounded(tmp_path: Path) -> None:
    lines = ['a: &a ["x","x","x","x","x","x","x","x","x"]']
    for i in range(1, 9):
        prev, cur = chr(ord("a") + i - 1), chr(ord("a") + i)
        lines.append(f"{cur}: &{cur} [" + ",".join([f"*{prev}"] * 9) + "]")
    bomb = tmp_path / "bomb.yaml"
    bomb.write_text("\n".join(lines) + "\nmodel: llama3-8b\n")
    assert bomb.stat().st_size < 500
    err = _one_line_error(*_cli("search", "--request", str(bomb)))
    assert "more than" in err and "values" in err
    many = "\n".join(["a: &a 1", *[f"k{i}: *a" for i in range(300)]])
    with pytest.raises(UserInputError, match="aliases"):
        parse_yaml(many)


@pytest.mark.parametrize("text, why", [
    ('{"a": NaN}', "not a number"), ('{"a": 1e400}', "out of range"), ('{"a": Infinity}', "not a number"),
    ('{"a": ' + "9" * 40 + "}", "digits"), ("[" * 5000 + "]" * 5000, "nested"),
])
def test_json_refuses_non_finite_huge_and_deep(text: str, why: str) -> None:
    with pytest.raises(UserInputError, match=why):
        parse_json(text)


def test_duplicate_keys_are_refused(tmp_path: Path) -> None:
    """A key given twice (a spec edited in two places) was silently read as its last value."""
    spec = tmp_path / "m.yaml"
    spec.write_text("num_layers: 8\nhidden_size: 1024\nffn_hidden_size: 4096\nnum_attention_heads: 16\n"
                    "num_kv_heads: 4\nvocab_size: 32000\nnum_layers: 9\n")
    err = _one_line_error(*_cli(*EST, "--model", str(spec)))
    assert "key 'num_layers' appears twice" in err and "(line 7)" in err, err
    with pytest.raises(UserInputError, match="key 'tp' appears twice in one object"):
        parse_json('{"parallel": {"tp": 8, "tp": 4}}', "request")
    with pytest.raises(UserInputError, match="key 'b' appears twice"):
        parse_yaml("a:\n  b: 1\n  b: 2\n")
    # a YAML merge key may restate what it merges (the mapping's own value wins), as before
    assert parse_yaml("a: &x {b: 1}\nc:\n  <<: *x\n  b: 2\n") == {"a": {"b": 1}, "c": {"b": 2}}
    # ... also where a merged mapping with its own override is merged before it is built itself (PyYAML copies the
    # merged keys into a merge source in place): read as safe_load reads it, no false duplicate
    for text in ("x:\n  i: &i\n    <<: {k: 1}\n    k: 2\ny:\n  <<: *i\n",
                 "a:\n  <<: &b\n    <<: {x: 1}\n    x: 2\n  y: 3\nc: *b\n"):
        assert parse_yaml(text) == yaml.safe_load(text)
    with pytest.raises(UserInputError, match="key 'y' appears twice"):
        parse_yaml("b: &b {x: 1}\nc:\n  <<: *b\n  y: 2\n  y: 3\n")


@pytest.mark.parametrize(("change", "needle"), [
    ({"model": None}, "model: must be a catalog name (see `autoplan models`), a model file path (str or "
                      "pathlib.Path) or a mapping of model fields (got None)"),
    ({"model": ["llama3-8b"]}, "model: must be a catalog name (see `autoplan models`), a model file path (str or "
                               "pathlib.Path) or a mapping of model fields, not a list"),
    ({"model": b"llama3-8b"}, "model: must be a catalog name (see `autoplan models`), a model file path (str or "
                              "pathlib.Path) or a mapping of model fields (got b'llama3-8b')"),
    ({"cluster": "h100"}, "cluster: must be an object (a mapping of fields) (got 'h100')"),
    ({"parallel": "tp=8"}, "parallel: must be an object (a mapping of fields) (got 'tp=8')"),
])
def test_type_errors_read_in_the_request_terms(change: dict, needle: str) -> None:
    """Not pydantic's union branches ("model.str: ...; model.dict[str,any]: ...") or our class names ("a valid
    dictionary or instance of ClusterRequestBounded")."""
    req = {"model": "llama3-8b", "cluster": {"num_gpus": 8}, "parallel": {"tp": 8, "pp": 1}, **change}
    with pytest.raises(UserInputError) as err:
        autoplan.estimate(req)
    assert str(err.value) == needle


def test_tree_checks() -> None:
    with pytest.raises(UserInputError, match="surrogate"):
        check_tree({"id": "\ud800"})
    with pytest.raises(UserInputError, match="not a finite number"):
        check_tree({"x": [float("nan")]})
    with pytest.raises(UserInputError, match="out of range"):
        check_tree({"x": 2**60})
    with pytest.raises(UserInputError, match="not a string"):
        check_tree({1: 2})


@pytest.mark.parametrize("cluster, needle", [
    ({"num_gpus": True}, "valid integer (got True)"), ({"num_gpus": 8.9}, "valid integer (got 8.9)"),
    ({"num_gpus": 8, "inter_node_gbps": float("inf")}, "finite number"),
    ({"num_gpus": 8, "nvlink_domain_size": 2**62}, "out of range"),
    ({"num_gpus": 8, "nvlink_domain_size": 2**40}, "less than or equal to 1048576"),
])
def test_strict_request_types(cluster: dict, needle: str) -> None:
    with pytest.raises(autoplan.InputError) as info:
        autoplan.search({"model": "llama3-8b", "cluster": cluster})
    assert needle in str(info.value)


def test_strict_model_spec_types() -> None:
    spec = {"num_layers": 2, "hidden_size": 256, "ffn_hidden_size": 512, "num_attention_heads": 4,
            "num_kv_heads": 4, "vocab_size": 1000}
    for bad, needle in (({"num_layers": True}, "num_layers"), ({"tied_embeddings": "false"}, "tied_embeddings"),
                        ({"hidden_size": 256.5}, "hidden_size")):
        with pytest.raises(autoplan.InputError, match=needle):
            autoplan.estimate({"model": {**spec, **bad}, "cluster": {"num_gpus": 8}})


def test_integral_floats_are_integers_as_json_schema_reads_them(tmp_path: Path) -> None:
    """``autoplan schema`` declares integer fields; JSON Schema's integer is any number with a zero fractional
    part. The API (and ``serve``, which validates through the same function), the CLI's --request and the
    schema agree: 64.0 is 64; 8.9 and true are refused by all of them."""
    import json

    import jsonschema

    from autoplan.schema import schema_for

    req = {"kind": "search", "model": "llama3-8b", "cluster": {"num_gpus": 8.0},
           "job": {"global_batch_size": 64.0, "seq_len": 2048.0}, "parallel": {"tp": 2.0}, "top": 1.0}
    schema = schema_for("request")
    jsonschema.validate(req, schema)
    r = autoplan.search(req)
    assert (r.cluster.num_gpus, r.job.global_batch_size, r.plans[0].parallel.tp) == (8, 64, 2)
    path = tmp_path / "req.json"
    path.write_text(json.dumps(req))
    code, err, out = _cli("search", "--request", str(path), "--format", "json")
    assert code == 0 and json.loads(out)["cluster"]["num_gpus"] == 8, err
    try:  # the HTTP API's handlers validate a body with serve._as (the same strict layer)
        from autoplan.serve import _as as http_body
        from autoplan.schema import SearchRequest
    except ImportError:  # the serve extra (fastapi) is not installed
        http_body = None
    if http_body is not None:
        assert http_body(req, SearchRequest).cluster.num_gpus == 8
    for bad in (8.9, True, 2.0**60):
        wrong = {**req, "cluster": {"num_gpus": bad}}
        if http_body is not None:
            with pytest.raises(autoplan.InputError, match="cluster.num_gpus"):
                http_body(wrong, SearchRequest)
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(wrong, schema)
        with pytest.raises(autoplan.InputError, match="cluster.num_gpus"):
            autoplan.search(wrong)
        path.write_text(json.dumps(wrong))
        assert "cluster.num_gpus" in _one_line_error(*_cli("search", "--request", str(path)))


def test_errors_stay_one_line_whatever_they_quote() -> None:
    """User text inside a message (a GPU name with a newline) cannot split it or forge a second line."""
    with pytest.raises(autoplan.InputError) as info:
        autoplan.search({"model": "llama3-8b", "cluster": {"num_gpus": 8, "gpu": "h100\nError: forged\x1b[2J"}})
    text = str(info.value)
    assert "\n" not in text and "\x1b" not in text and "unknown GPU 'h100\\nError: forged\\x1b[2J'" in text
    err = _one_line_error(*_cli("search", "--model", "llama3-8b", "--gpus", "8", "--gpu", "h100\nforged"))
    assert "h100\\nforged" in err


def test_empty_model_names_the_catalog() -> None:
    for model in ("", "  "):
        with pytest.raises(autoplan.InputError, match="model must not be empty; catalog names: .*llama3-8b"):
            autoplan.search({"model": model, "cluster": {"num_gpus": 8}})
    err = _one_line_error(*_cli("search", "--model", "", "--gpus", "8"))
    assert "model must not be empty; catalog names:" in err and "file" not in err.split(";")[0]


def test_error_hierarchy_is_exported() -> None:
    assert issubclass(autoplan.InputError, autoplan.AutoplanError)
    assert issubclass(autoplan.InfeasibleError, autoplan.AutoplanError)
    assert issubclass(autoplan.UserInputError, autoplan.InputError)


def test_missing_gpus_and_usage_errors_are_one_line() -> None:
    assert "Missing option '--gpus'" in _one_line_error(*_cli("search", "--model", "llama3-8b"))
    assert "No such command" in _one_line_error(*_cli("frobnicate"))


def test_empty_model_name_is_refused(tmp_path: Path) -> None:
    """``name: ''`` in a spec printed every table and plan file with a blank model (omit it for the file stem)."""
    spec = tmp_path / "m.yaml"
    spec.write_text("name: ''\nnum_layers: 2\nhidden_size: 64\nffn_hidden_size: 128\nnum_attention_heads: 4\n"
                    "num_kv_heads: 4\nvocab_size: 100\n")
    err = _one_line_error(*_cli(*EST, "--model", str(spec)))
    assert "name: String should have at least 1 character (got '')" in err, err
    spec.write_text("\n".join(spec.read_text().splitlines()[1:]) + "\n")
    assert autoplan.estimate({"model": str(spec), "cluster": {"num_gpus": 8}, "job": {"global_batch_size": 8},
                              "parallel": {"tp": 1, "pp": 1}}).model.name == "m"


@pytest.mark.parametrize(("change", "needle"), [
    ({"software": {"tp_comm_overlapp": True}}, "software.tp_comm_overlapp: unknown field (did you mean tp_comm_overlap?)"),
    ({"job": {"seq_length": 4096}}, "job.seq_length: unknown field (did you mean seq_len?)"),
    ({"failures": {"mtbf": 3}}, "failures.mtbf: unknown field (did you mean mtbf_hours?)"),  # a prefix of the name
    ({"parallel": {"tpp": 2}}, "parallel.tpp: unknown field (did you mean tp or pp?)"),
    ({"xyzzy": 1}, "xyzzy: unknown field"),  # nothing near: no guess
])
def test_an_unknown_field_names_the_nearest_known_ones(change: dict, needle: str) -> None:
    """A typo in a request field (``tp_comm_overlapp``) said only "unknown field"; the CLI's flags say "Did you
    mean"; a request names the nearest fields of the object it sits in."""
    with pytest.raises(UserInputError) as err:
        autoplan.search({"model": "llama3-8b", "cluster": {"num_gpus": 8}, **change})
    assert str(err.value) == needle
