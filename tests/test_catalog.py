"""Catalog lookups, spec files, cluster building and the `models` / `hardware` commands."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from autoplan.catalog import (
    build_cluster,
    efficiency_for,
    gpu_names,
    load_gpu,
    load_model,
    model_aliases,
    model_names,
)
from autoplan.errors import ConfigError, UserInputError

HF = Path(__file__).parent / "data" / "hf"
SPECS = Path(__file__).parent / "data" / "specs"


# ---- models -----------------------------------------------------------------------------------


def test_model_names_sorted_without_aliases() -> None:
    names = model_names()
    assert names == sorted(names)
    assert {"llama3-8b", "llama3-70b", "llama3-405b", "mixtral-8x7b", "deepseek-v3"} <= set(names)
    assert not set(model_aliases()) & set(names)
    assert all(load_model(n).name == n for n in names)


@pytest.mark.parametrize(
    ("name", "public"),
    [("llama3-8b", 8.03e9), ("llama3-70b", 70.55e9), ("llama3-405b", 405.85e9)],
)
def test_llama3_params_match_public_counts(name: str, public: float) -> None:
    # Meta's model cards / HF parameter counts; the catalog is exact to the rounding shown (< 0.01%).
    assert load_model(name).num_params == pytest.approx(public, rel=1e-3)


@pytest.mark.parametrize("source", ["llama3.1-405b", "LLAMA3.1-405B", "Llama3-405B", "  llama3-405b "])
def test_alias_and_case_insensitive_lookup(source: str) -> None:
    assert load_model(source) is load_model("llama3-405b")  # resolved to the cached catalog entry


def test_llama3_and_llama31_are_distinct_models() -> None:
    """Same shapes, different RoPE: 3.1 scales frequencies (factor 8 over 8192 tokens), 3.0 does not."""
    v30, v31 = load_model("llama3-8b"), load_model("llama3.1-8b")
    assert v30.num_params == v31.num_params and v30.arch.rope_theta == v31.arch.rope_theta == 500000.0
    assert v30.arch.rope_scaling is None
    assert v31.arch.rope_scaling is not None and v31.arch.rope_scaling.factor == 8.0


def test_unknown_model_suggests_close_names() -> None:
    with pytest.raises(UserInputError) as info:
        load_model("llama3-7b")
    msg = str(info.value)
    assert msg.startswith("unknown model 'llama3-7b'; did you mean: ")
    assert "llama3-8b" in msg and "llama3-70b" in msg and msg.endswith("? (see 'autoplan models')")
    assert info.value.valid == model_names()
    assert isinstance(info.value, ConfigError)


def test_unknown_model_without_close_match() -> None:
    with pytest.raises(UserInputError, match=r"^unknown model 'zzz' \(see 'autoplan models'\)$"):
        load_model("zzz")


@pytest.mark.parametrize(
    ("source", "pattern"),
    [
        ("no/such/model.yaml", r"model file 'no/such/model.yaml' does not exist"),
        ("missing.json", r"model file 'missing.json' does not exist"),
        ("", r"model must not be empty; catalog names: .*llama3-8b"),
    ],
)
def test_missing_model_sources(source: str, pattern: str) -> None:
    with pytest.raises(UserInputError, match=pattern):
        load_model(source)


@pytest.mark.parametrize(("hub_id", "close"), [
    ("meta-llama/Meta-Llama-3-70B", "llama3-70b, llama3.1-70b, llama2-70b"),
    ("deepseek-ai/DeepSeek-V3", "deepseek-v3, deepseek-v3.2"),
    ("Qwen/Qwen3-235B-A22B", "qwen3-235b-a22b, qwen3-30b-a3b, qwen3-8b"),
    ("Qwen/Qwen3-30B-A3B", "qwen3-30b-a3b, qwen3-235b-a22b, qwen3-next-80b-a3b"),
])
def test_hub_id_names_the_config_and_the_catalog_entry(hub_id: str, close: str) -> None:
    """A Hugging Face Hub id (what a new user types first) said only "model file '...' does not exist"."""
    with pytest.raises(UserInputError) as info:
        load_model(hub_id)
    assert str(info.value) == (f"model '{hub_id}' is no file here and looks like a Hugging Face Hub id (autoplan "
                               "does not download): pass its config.json (or the folder holding it), or a catalog "
                               f"name; did you mean: {close}? (see 'autoplan models')")
    assert info.value.valid == close.split(", ")


def test_folder_without_config(tmp_path: Path) -> None:
    with pytest.raises(UserInputError, match=r"model folder '.*' has no config.json"):
        load_model(str(tmp_path))


# ---- own spec files ---------------------------------------------------------------------------

TINY = {"num_layers": 4, "hidden_size": 256, "ffn_hidden_size": 1024, "num_attention_heads": 8,
        "num_kv_heads": 2, "vocab_size": 32000}


def test_yaml_spec_file_name_defaults_to_stem(tmp_path: Path) -> None:
    path = tmp_path / "tiny-llama.yaml"
    path.write_text(yaml.safe_dump(TINY))
    spec = load_model(str(path))
    assert spec.name == "tiny-llama" and spec.num_kv_heads == 2


def test_shipped_spec_fixtures() -> None:
    yml = load_model(str(SPECS / "tiny-moe.yml"))
    assert (yml.name, yml.num_experts, yml.moe_top_k) == ("tiny-moe", 8, 2)
    js = load_model(SPECS / "custom-dense.json")  # Path accepted too
    assert js.name == "my-dense-1b" and not js.is_moe


def test_json_spec_file_and_dict(tmp_path: Path) -> None:
    path = tmp_path / "spec.json"
    path.write_text(json.dumps(TINY | {"name": "tiny"}))
    assert load_model(str(path)).name == "tiny"
    assert load_model(TINY).name == "custom"
    assert load_model(TINY | {"name": "x"}) == load_model(str(path)).model_copy(update={"name": "x"})


@pytest.mark.parametrize(
    ("fields", "pattern"),
    [
        ({"num_layers": -1}, r"num_layers: Input should be greater than 0 \(got -1\)"),
        ({"num_expert": 8}, r"num_expert: unknown field"),
        ({"norm": "batchnorm"}, r"norm: Input should be 'rmsnorm' or 'layernorm' \(got 'batchnorm'\)"),
        ({"num_kv_heads": 3}, r"num_attention_heads \(8\) must be a multiple of num_kv_heads \(3\)"),
        ({"vocab_size": None}, r"vocab_size: "),
    ],
)
def test_invalid_spec_file_values_are_one_line(tmp_path: Path, fields: dict, pattern: str) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(TINY | fields))
    with pytest.raises(UserInputError, match=rf"^invalid model spec '.*bad.yaml': .*{pattern}") as info:
        load_model(str(path))
    assert "\n" not in str(info.value) and "pydantic" not in str(info.value)


def test_spec_missing_field(tmp_path: Path) -> None:
    path = tmp_path / "short.yaml"
    path.write_text(yaml.safe_dump({k: v for k, v in TINY.items() if k != "hidden_size"}))
    with pytest.raises(UserInputError, match=r"hidden_size: required field missing"):
        load_model(str(path))


def test_malformed_spec_files(tmp_path: Path) -> None:
    bad_yaml = tmp_path / "a.yaml"
    bad_yaml.write_text("num_layers: [1, 2\nhidden_size: 3\n")
    with pytest.raises(UserInputError, match=r"invalid YAML in '.*a.yaml': .*\(line \d+\)"):
        load_model(str(bad_yaml))
    a_list = tmp_path / "b.yaml"
    a_list.write_text("- 1\n- 2\n")
    with pytest.raises(UserInputError, match=r"'.*b.yaml' must contain a mapping of fields, got array"):
        load_model(str(a_list))
    no_tags = tmp_path / "c.yaml"
    no_tags.write_text("!!python/object/apply:os.system ['true']\n")
    with pytest.raises(UserInputError, match=r"invalid YAML"):  # safe_load only
        load_model(str(no_tags))


def test_yaml_with_hf_keys_is_still_a_spec(tmp_path: Path) -> None:
    path = tmp_path / "odd.yaml"
    path.write_text(yaml.safe_dump(TINY | {"model_type": "llama"}))
    with pytest.raises(UserInputError, match=r"model_type: unknown field"):
        load_model(str(path))


# ---- GPUs, efficiency, clusters ---------------------------------------------------------------


def test_gpus() -> None:
    names = gpu_names()
    assert names == sorted(names) and {"a100-80g", "h100-sxm", "b200", "gb200", "mi300x"} <= set(names)
    assert load_gpu("H100-SXM") is load_gpu("h100-sxm")
    assert load_gpu("h100-sxm").name == "h100-sxm"


def test_unknown_gpu_suggests() -> None:
    with pytest.raises(UserInputError, match=r"^unknown GPU 'h100'; did you mean: h100-sxm, .*\(see 'autoplan hardware'\)$"):
        load_gpu("h100")


def test_efficiency_for() -> None:
    assert efficiency_for("hopper").gemm_max > 0
    assert efficiency_for("Hopper") is efficiency_for("hopper")
    with pytest.raises(UserInputError, match=r"generation .kepler.; valid: ampere, blackwell, cdna3, cdna4, hopper, volta"):
        efficiency_for("kepler")


def test_build_cluster_defaults_from_catalog() -> None:
    c = build_cluster("h100-sxm", 64)
    gpu = load_gpu("h100-sxm")
    assert (c.gpus_per_node, c.nvlink_domain_size, c.inter_node_gbps) == (8, 8, gpu.nic_gbps)
    assert c.efficiency == efficiency_for("hopper") and c.num_nodes == 8


def test_build_cluster_smaller_than_a_node_and_overrides() -> None:
    small = build_cluster("a100-80g", 4)
    assert (small.num_gpus, small.gpus_per_node, small.num_nodes) == (4, 8, 1)
    c = build_cluster("h100-sxm", 32, gpus_per_node=4, inter_node_gbps=200, nvlink_domain_size=4)
    assert (c.gpus_per_node, c.inter_node_gbps, c.nvlink_domain_size) == (4, 200, 4)
    nvl72 = build_cluster("gb200", 72)
    assert (nvl72.nvlink_domain_size, nvl72.gpus_per_node) == (72, 4)


@pytest.mark.parametrize(
    ("kwargs", "pattern"),
    [
        ({"num_gpus": 12}, r"num_gpus \(12\) must be a multiple of gpus_per_node \(8\); valid: num_gpus=8, "
                           r"num_gpus=16 \(or a gpus_per_node that divides 12\)"),
        ({"num_gpus": 8, "gpus_per_node": 3}, r"valid: num_gpus=6, num_gpus=9"),
        ({"num_gpus": 0}, r"num_gpus \(0\) must be a positive integer"),
        ({"num_gpus": 16, "nvlink_domain_size": 3},
         r"nvlink_domain_size \(3\) and gpus_per_node \(8\) must divide one another; valid: 1, 2, 4, 8 or a "
         r"multiple of 8"),
        ({"num_gpus": 16, "inter_node_gbps": -1}, r"inter_node_gbps: Input should be greater than 0"),
    ],
)
def test_build_cluster_errors(kwargs: dict, pattern: str) -> None:
    with pytest.raises(UserInputError, match=pattern):
        build_cluster("h100-sxm", **kwargs)


def _profile(tmp_path: Path, data: dict) -> str:
    path = tmp_path / "profile.yaml"
    path.write_text(yaml.safe_dump(data))
    return str(path)


def test_profile_overrides_catalog_and_kwargs_override_profile(tmp_path: Path) -> None:
    prof = _profile(tmp_path, {"gpu": "h100-sxm", "efficiency": {"gemm_max": 0.7}, "inter_node_gbps": 200,
                               "gpus_per_node": 4})
    c = build_cluster("h100-sxm", 16, profile=prof)
    assert c.efficiency.gemm_max == 0.7
    assert c.efficiency.link_bus == efficiency_for("hopper").link_bus  # untouched fields keep the catalog's
    assert (c.inter_node_gbps, c.gpus_per_node) == (200, 4)
    assert build_cluster("h100-sxm", 16, profile=prof, inter_node_gbps=800).inter_node_gbps == 800


@pytest.mark.parametrize(
    ("data", "pattern"),
    [
        ({"gpu": "a100-80g"}, r"cluster profile '.*' is for GPU 'a100-80g', not 'h100-sxm'"),
        ({"gpu": "h100-sxm", "efficiency": {"gemm_max": 1.5}}, r"gemm_max: Input should be less than or equal to 1"),
        ({"gpu": "h100-sxm", "efficiency": {"speed": 1}}, r"speed: unknown field"),
        ({"gpu": "h100-sxm", "nodes": 2}, r"invalid cluster profile '.*': nodes: unknown field"),
        ({"efficiency": {}}, r"gpu: required field missing"),
        ({"gpu": "h100"}, r"unknown GPU 'h100'"),
        # the size of the cluster is the request's, not the profile's (was "num_gpus: unknown field")
        ({"gpu": "h100-sxm", "num_gpus": 8}, r"^cluster profile '.*': num_gpus is not a profile field \(a profile "
         r"describes the GPU and its links, not how many\); give the count with --gpus \(a request's "
         r"cluster.num_gpus\)$"),
    ],
)
def test_bad_profiles(tmp_path: Path, data: dict, pattern: str) -> None:
    with pytest.raises(UserInputError, match=pattern):
        build_cluster("h100-sxm", 8, profile=_profile(tmp_path, data))


def test_missing_profile() -> None:
    with pytest.raises(UserInputError, match=r"cluster profile 'nope.yaml' does not exist"):
        build_cluster("h100-sxm", 8, profile="nope.yaml")


# ---- CLI --------------------------------------------------------------------------------------


@pytest.fixture
def run():
    from autoplan.cli import cli

    runner = CliRunner()
    return lambda *args: runner.invoke(cli, list(args))


def test_models_table(run) -> None:
    res = run("models")
    assert res.exit_code == 0, res.output
    lines = res.output.splitlines()
    assert lines[0].split()[:3] == ["model", "params", "(B)"]
    listed = [line.split()[0] for line in lines[2 : 2 + len(model_names())]]
    assert listed == model_names()
    assert "llama3.1-405b -> llama3-405b" in res.output
    assert any(line.startswith("llama3-8b") and " 8.03 " in line and "32/8" in line for line in lines)


def test_models_json_and_sources(run) -> None:
    res = run("models", "--format", "json")
    assert res.exit_code == 0, res.output
    records = json.loads(res.output)["models"]
    assert [r["name"] for r in records] == model_names()
    llama = next(r for r in records if r["name"] == "llama3-8b")
    assert llama["num_params"] == load_model("llama3-8b").num_params
    big = next(r for r in records if r["name"] == "llama3-405b")
    assert "llama3.1-405b" in big["aliases"]
    res = run("models", str(HF / "gpt2.json"), "deepseek-v3", "--format", "json")
    assert [r["name"] for r in json.loads(res.output)["models"]] == ["gpt2", "deepseek-v3"]


def test_models_unknown_source(run) -> None:
    res = run("models", "llama3-7b")
    assert res.exit_code == 2
    assert "unknown model 'llama3-7b'; did you mean: " in res.output
    # one line, one pointer (was "Invalid value for MODEL: ... (see 'autoplan models') (see 'autoplan models --help')")
    assert res.output.count("(see '") == 1 and "Invalid value for MODEL" not in res.output, res.output


def test_hardware(run) -> None:
    res = run("hardware")
    assert res.exit_code == 0, res.output
    rows = res.output.splitlines()[2:]
    assert [r.split()[0] for r in rows] == gpu_names()
    assert any(r.split()[:4] == ["h100-sxm", "hopper", "989", "1979"] for r in rows)
    data = json.loads(run("hardware", "--format", "json").output)["gpus"]
    assert [g["name"] for g in data] == gpu_names() and data[0]["hbm_gib"] > 0
