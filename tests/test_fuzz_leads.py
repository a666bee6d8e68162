"""Leads of the s18 fuzzing pass on the user-facing surfaces (CLI, Python API, JSONL batch), each pinned:

1. a plan file written with a cluster profile (``--cluster``) reloads (``emit --plan``, ``compare FILE``) on that
   cluster, its profile's efficiency fields included, not on the catalog's;
2. list-valued inputs (``cuda_graph_scope``, ``recompute_modules``, ``calibrate --fit``) refuse a repeated name, the
   same rule on every surface;
3. a request's ``memory_headroom`` takes the CLI's forms (``6GiB``, ``10%``) through one parser."""

from __future__ import annotations

import json
import re
from pathlib import Path

import jsonschema
import pytest
from click.testing import CliRunner

from autoplan import api
from autoplan.cli import cli
from autoplan.emit import load_plan, price
from autoplan.errors import UserInputError

JOB = ["--model", "llama3-8b", "--gpus", "16", "--global-batch-size", "128", "--seq-len", "4096"]
ROOT = Path(__file__).resolve().parents[1]


def _profile(tmp_path: Path) -> Path:
    """A profile that moves the price: half the catalog's GEMM efficiency, a slower NIC, a 4-GPU NVLink domain."""
    path = tmp_path / "prof.yaml"
    path.write_text("gpu: h100-sxm\nefficiency: {gemm_max: 0.5, nic_bus: 0.6}\ninter_node_gbps: 100\n"
                    "nvlink_domain_size: 4\n")
    return path


@pytest.mark.parametrize("command", ["search", "estimate"])
def test_plan_file_reloads_on_its_cluster_profile(tmp_path: Path, command: str) -> None:
    prof = _profile(tmp_path)
    runner = CliRunner()
    pins = ["--tp", "2", "--pp", "2"] if command == "estimate" else []
    out = runner.invoke(cli, [command, *JOB, *pins, "--cluster", str(prof), "--format", "json"])
    assert out.exit_code == 0, out.output
    saved = json.loads(out.stdout)
    assert saved["cluster"]["efficiency"] == {"gemm_max": 0.5, "nic_bus": 0.6}
    assert saved["cluster"]["efficiency_basis"] == "profile"
    entry = saved["plans"][0] if command == "search" else saved
    found = entry["prediction"]["step_time_s"]
    path = tmp_path / "plan.json"
    path.write_text(out.stdout)
    prof.unlink()  # the plan file alone says the cluster: the profile may be gone

    target = entry.get("target") or "megatron"
    plan = load_plan(path, target=target)
    assert plan.cluster.efficiency.gemm_max == 0.5 and plan.cluster.efficiency.nic_bus == 0.6
    assert (plan.cluster.inter_node_gbps, plan.cluster.nvlink_domain_size) == (100, 4)
    assert price(plan, target).step_time_s == pytest.approx(found, rel=1e-12)
    # the profile matters here (else this test could not fail): on the catalog's efficiency the step is faster
    catalog = api.estimate({"model": "llama3-8b", "target": target, "job": saved["job"],
                            "cluster": {k: saved["cluster"][k] for k in ("num_gpus", "inter_node_gbps",
                                                                         "nvlink_domain_size")},
                            "parallel": entry["parallel"], "software": {}})
    assert catalog.prediction.step_time_s < 0.9 * found

    res = runner.invoke(cli, ["compare", str(path), str(path), "--format", "json"])
    assert res.exit_code == 0, res.output
    again = json.loads(res.stdout)["plans"][0]
    assert again["prediction"]["step_time_s"] == pytest.approx(found, rel=1e-12)
    assert again["cluster"]["efficiency"] == saved["cluster"]["efficiency"]
    catalog_plan = tmp_path / "catalog.json"
    catalog_plan.write_text(json.dumps(catalog.model_dump(mode="json")))
    both = runner.invoke(cli, ["compare", str(catalog_plan), str(path), "--format", "json"])
    assert both.exit_code == 0, both.output  # the explanation names the clusters' difference
    assert "Also differ in efficiency the catalog's vs gemm_max=0.5,nic_bus=0.6." in json.loads(both.stdout)[
        "differences"][0]
    emitted = runner.invoke(cli, ["emit", "--plan", str(path), "-o", str(tmp_path / "out")])
    assert emitted.exit_code == 0, emitted.output
    assert f"predicted: step {found:.3f} s" in emitted.output

    old = {**saved, "cluster": {k: v for k, v in saved["cluster"].items() if k != "efficiency"}}  # an older file
    path.write_text(json.dumps(old))
    refused = runner.invoke(cli, ["emit", "--plan", str(path), "-o", str(tmp_path / "old")])
    assert refused.exit_code == 2 and "does not record its efficiency" in refused.stderr, refused.output


def test_inline_efficiency_is_over_the_profile_and_checked(tmp_path: Path) -> None:
    prof = _profile(tmp_path)
    base = {"model": "llama3-8b", "parallel": {"tp": 2, "pp": 2}, "job": {"global_batch_size": 128, "seq_len": 4096}}
    with_file = api.estimate({**base, "cluster": {"num_gpus": 16, "profile": str(prof)}})
    inline = api.estimate({**base, "cluster": {"num_gpus": 16, "inter_node_gbps": 100, "nvlink_domain_size": 4,
                                               "efficiency": {"gemm_max": 0.5, "nic_bus": 0.6}}})
    assert inline.prediction == with_file.prediction and inline.cluster == with_file.cluster
    over = api.estimate({**base, "cluster": {"num_gpus": 16, "profile": str(prof), "efficiency": {"gemm_max": 0.7}}})
    assert over.cluster.efficiency == {"gemm_max": 0.7, "nic_bus": 0.6}
    assert over.prediction.step_time_s < with_file.prediction.step_time_s
    links_only = tmp_path / "links.yaml"  # a profile of links alone: recorded as {} (no efficiency set), not None
    links_only.write_text("gpu: h100-sxm\ninter_node_gbps: 100\n")
    rec = api.estimate({**base, "cluster": {"num_gpus": 16, "profile": str(links_only)}}).cluster
    assert (rec.efficiency, rec.efficiency_basis) == ({}, "profile")
    plain = api.estimate({**base, "cluster": {"num_gpus": 16}})
    empty = api.estimate({**base, "cluster": {"num_gpus": 16, "efficiency": {}}})  # sets nothing: still the catalog's
    assert empty.prediction == plain.prediction
    assert empty.cluster.efficiency_basis == plain.cluster.efficiency_basis != "profile"
    empty_file, plain_file = tmp_path / "empty.json", tmp_path / "plain.json"  # None and {} are the same cluster
    empty_file.write_text(json.dumps(empty.model_dump(mode="json")))
    plain_file.write_text(json.dumps(plain.model_dump(mode="json")))
    res = CliRunner().invoke(cli, ["compare", str(empty_file), str(plain_file), "--format", "json"])
    assert res.exit_code == 0, res.output
    assert "Also differ" not in json.loads(res.stdout)["differences"][0]
    with pytest.raises(UserInputError, match="gemm_mx"):
        api.estimate({**base, "cluster": {"num_gpus": 16, "efficiency": {"gemm_mx": 0.5}}})
    with pytest.raises(UserInputError, match="gemm_max"):
        api.estimate({**base, "cluster": {"num_gpus": 16, "efficiency": {"gemm_max": 2.0}}})


# ---- 2. a repeated name in a list-valued input -----------------------------------------------------------------
@pytest.mark.parametrize("args,needle", [
    (["estimate", *JOB, "--tp", "2", "--pp", "1", "--recompute-modules", "mlp,core_attn,mlp"],
     "'mlp' given twice; give each module once: mlp,core_attn"),
    (["estimate", *JOB, "--tp", "2", "--pp", "1", "--cuda-graph-impl", "transformer_engine", "--cuda-graph-scope",
      "attn,attn"], "'attn' given twice; give each scope once: attn"),
    # was "full_iteration captures everything and takes no other scope": there is no other scope
    (["estimate", *JOB, "--tp", "2", "--pp", "1", "--cuda-graph-impl", "local", "--cuda-graph-scope",
      "full_iteration,full_iteration,full_iteration"], "'full_iteration' given 3 times; give each scope once"),
    (["emit", "--target", "megatron", "-o", "OUT", *JOB, "--tp", "2", "--pp", "1", "--recompute-modules",
      "mlp mlp"], "'mlp' given twice"),
    (["calibrate", str(ROOT / "shared/calibration/published_runs.json"), "-o", "OUT", "--fit",
      "gemm_max,nic_bus,gemm_max"], "'gemm_max' given twice; give each parameter once: gemm_max,nic_bus"),
])
def test_cli_refuses_a_repeated_name(tmp_path: Path, args: list[str], needle: str) -> None:
    args = [str(tmp_path / "out") if a == "OUT" else a for a in args]
    res = CliRunner().invoke(cli, args)
    assert res.exit_code == 2, res.output
    assert needle in res.stderr and len(res.stderr.strip().splitlines()) == 1, res.stderr
    assert not (tmp_path / "out").exists()


def test_api_and_batch_refuse_a_repeated_name() -> None:
    base = {"model": "llama3-8b", "cluster": {"num_gpus": 8}}
    with pytest.raises(UserInputError, match=r"parallel\.recompute_modules: 'mlp' given twice"):
        api.estimate({**base, "parallel": {"tp": 2, "recompute_modules": ["mlp", "mlp"]}})
    with pytest.raises(UserInputError, match=r"software\.cuda_graph_scope: 'attn' given twice"):
        api.search({**base, "software": {"cuda_graph_impl": "transformer_engine", "cuda_graph_scope": ["attn", "attn"]}})
    line = {"kind": "estimate", **base, "parallel": {"tp": 2, "recompute_modules": ["moe_act", "moe_act"]}}
    out = api.run_line(api.Engine(), line, 1)
    assert out.status == "invalid" and "'moe_act' given twice" in (out.message or "")
    once = api.estimate({**base, "parallel": {"tp": 2, "recompute_modules": ["mlp", "core_attn"]}})
    assert once.parallel.recompute_modules == ("core_attn", "mlp")  # a set of distinct modules is still taken


# ---- 3. memory_headroom: the CLI's forms in every request ------------------------------------------------------
@pytest.mark.parametrize("text,number", [("6GiB", 6), (" 6 gib", 6), ("6", 6), ("10%", 0.1), ("0.1", 0.1), ("0", 0)])
def test_request_headroom_takes_the_cli_forms(text: str, number: float) -> None:
    base = {"model": "llama3-8b", "parallel": {"tp": 2}, "job": {"global_batch_size": 128, "seq_len": 4096}}
    as_text = api.estimate({**base, "cluster": {"num_gpus": 8, "memory_headroom": text}})
    as_number = api.estimate({**base, "cluster": {"num_gpus": 8, "memory_headroom": number}})
    assert as_text.prediction.memory_limit_gib == as_number.prediction.memory_limit_gib
    cli_out = CliRunner().invoke(cli, ["estimate", "--model", "llama3-8b", "--gpus", "8", "--tp", "2", "--pp",
                                       "1", "--global-batch-size", "128", "--seq-len", "4096", "--memory-headroom", text,
                                       "--format", "json"])
    assert cli_out.exit_code == 0, cli_out.output
    assert json.loads(cli_out.stdout)["prediction"]["memory_limit_gib"] == as_text.prediction.memory_limit_gib
    scaled = [api.scale({"model": "llama3-8b", "gpus": [8], "cluster": {"memory_headroom": h},
                         "job": {"global_batch_size": 128, "seq_len": 4096}}).rows for h in (text, number)]
    assert scaled[0] == scaled[1]  # scale's cluster shape reads the same field


@pytest.mark.parametrize("text,needle", [
    ("abc", "'abc' is neither GiB (6, 6GiB) nor a fraction of HBM (0.1, 10%)"),
    ("100%", "'100%' must be at least 0% and below 100% of HBM"),
    ("-inf GiB", "'-inf GiB' is not a finite amount"),
    ("-1", "'-1' must be at least 0"),
    ("1e400", "'1e400' is not a finite amount"),
    ("१२", "'१२' is neither GiB"),  # Devanagari digits: float() reads them (the CLI took them as 12)
    # was 50% of HBM: a number below 1 is a fraction, so 0.5GiB is refused, not misread
    ("0.5GiB", "'0.5GiB' is below 1 GiB, which autoplan reads as a fraction of HBM"),
])
def test_bad_headroom_is_one_error_everywhere(text: str, needle: str) -> None:
    with pytest.raises(UserInputError, match=re.escape(f"cluster.memory_headroom: {needle}")):
        api.estimate({"model": "llama3-8b", "cluster": {"num_gpus": 8, "memory_headroom": text}, "parallel": {"tp": 2}})
    res = CliRunner().invoke(cli, ["estimate", "--model", "llama3-8b", "--gpus", "8", "--tp", "2", "--pp", "1",
                                   "--memory-headroom", text])
    assert res.exit_code == 2 and needle in res.stderr, res.output


def test_headroom_text_is_bounded_and_its_pattern_unambiguous() -> None:
    """A request's text reaches the parser unchecked (``serve`` takes 1 MiB bodies): a long one is refused by its
    length, and the pattern itself fails in linear steps (each character has one place to go: the first pattern
    took quadratic time, 17 s on 16,000 digits and an 'x')."""
    from autoplan.request import _HEADROOM_TEXT, HEADROOM_TEXT_MAX, headroom_from_text

    with pytest.raises(ValueError, match=f"longer than {HEADROOM_TEXT_MAX} characters"):
        headroom_from_text("1" * 16000 + "x")
    pattern = re.compile(_HEADROOM_TEXT)
    for text in ("1" * 4000 + "x", "1" + " " * 4000 + "x", "1" * 4000 + "%x", "1" * 2000 + " " * 2000 + "x"):
        assert pattern.match(text) is None  # a backtracking blow-up would hang here
    assert headroom_from_text("+6") == 6 and headroom_from_text("6 %") == pytest.approx(0.06)


def test_schema_describes_the_headroom_forms() -> None:
    res = CliRunner().invoke(cli, ["schema", "request"])
    assert res.exit_code == 0, res.output
    schema = json.loads(res.stdout)
    field = schema["$defs"]["ClusterRequest"]["properties"]["memory_headroom"]
    kinds = {f.get("type") for f in field["anyOf"]}
    assert [f["maxLength"] for f in field["anyOf"] if f.get("type") == "string"] == [64]
    assert kinds == {"number", "string", "null"} and "ge" not in field
    line = {"kind": "estimate", "model": "llama3-8b", "cluster": {"num_gpus": 8, "memory_headroom": "6GiB"}}
    jsonschema.validate(line, schema)  # the schema takes what the request takes ...
    with pytest.raises(jsonschema.ValidationError):  # ... and refuses the text the parser refuses
        jsonschema.validate({**line, "cluster": {"num_gpus": 8, "memory_headroom": "6 GB"}}, schema)


@pytest.mark.parametrize(("cluster", "says"), [
    ({"efficiency_basis": "Profile"}, "cluster.efficiency_basis='Profile' is not one of fitted, prior, profile"),
    ({"efficiency_basis": None}, "cluster.efficiency_basis=None is not one of fitted, prior, profile"),
    ({"efficiency_basis": ["profile"]}, "cluster.efficiency_basis=['profile'] is not one of fitted, prior, profile"),
])
def test_a_plan_files_efficiency_basis_is_checked(tmp_path: Path, cluster: dict, says: str) -> None:
    """``cluster.efficiency_basis`` says where the efficiencies came from (schema.ClusterRecord: fitted, prior or a
    cluster profile); a file that said anything else was reloaded without a word (only 'profile' was read). Now one
    line names the value and the choices."""
    base = {"model": "llama3-8b", "parallel": {"tp": 2, "pp": 2}, "cluster": {"num_gpus": 16},
            "job": {"global_batch_size": 128, "seq_len": 4096}}
    saved = api.estimate(base).model_dump(mode="json")
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(saved))
    load_plan(path, target="megatron")  # as written: loads
    path.write_text(json.dumps({**saved, "cluster": {**saved["cluster"], **cluster}}))
    with pytest.raises(UserInputError, match=re.escape(says)):
        load_plan(path, target="megatron")
    res = CliRunner().invoke(cli, ["compare", str(path), str(path)])
    assert res.exit_code == 2 and says in res.stderr and len(res.stderr.strip().splitlines()) == 1, res.output
