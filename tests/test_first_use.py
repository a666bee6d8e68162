"""Issue 14's first-use reproductions, one regression each (outputs that say what they mean)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import jsonschema
import pytest
from click.testing import CliRunner

from autoplan.cli import cli
from autoplan.schema import schema_for


def _cli(*args: str) -> tuple[int, str, str]:
    r = CliRunner().invoke(cli, list(args))
    return r.exit_code, r.stdout, r.stderr


def test_emit_refuses_a_layout_that_does_not_fit(tmp_path: Path) -> None:
    out = tmp_path / "x"
    code, stdout, err = _cli("emit", "--target", "megatron", "--model", "llama3-70b", "--gpus", "1024", "-o", str(out))
    assert code == 3 and "does not fit" in err and re.search(r"GiB over the \d+ GiB limit", err) and not out.exists()
    code, stdout, err = _cli("emit", "--target", "megatron", "--model", "llama3-70b", "--gpus", "1024", "-o",
                             str(out), "--allow-over-memory")
    assert code == 0 and "DOES NOT FIT" in stdout and "WARNING" in (out / "README.txt").read_text()
    code, stdout, _ = _cli("emit", "--target", "megatron", "--model", "llama3-70b", "--gpus", "1024", "--tp", "8",
                           "--pp", "8", "-o", str(tmp_path / "y"))
    assert code == 0 and "(fits)" in stdout and "predicted: step" in (tmp_path / "y" / "README.txt").read_text()


def test_search_emit_error_keeps_the_search_result(tmp_path: Path) -> None:
    # ZeRO-0 without CP (torchtitan: experts within tp, Megatron runs it too), so another target can emit plan #1
    code, stdout, err = _cli("search", "--model", "mixtral-8x7b", "--gpus", "64", "--target", "torchtitan",
                             "--zero", "0", "--cp", "1", "--top", "1", "--format", "json", "--emit", str(tmp_path / "d"))
    assert code == 2
    data = json.loads(stdout)
    assert data["plans"] and "does not ship mixtral" in data["emitted"]["error"]
    assert "can be emitted for --target megatron" in err and "fsdp2" not in err.split("does not ship")[1]
    lines = err.strip().splitlines()  # a progress line may come first (searches over a second)
    assert lines[-1].startswith("Error: --emit") and all(x.startswith("scoring") for x in lines[:-1])


def test_gb200_tp_rule_message_and_readme_agree() -> None:
    code, _, err = _cli("search", "--model", "gpt3-175b", "--gpus", "1152", "--gpu", "gb200", "--tp", "16")
    assert code == 2 and "tp=16 must divide the NVLink domain of 72 GPUs" in err and "--nvlink-domain-size 64" in err
    code, _, err = _cli("estimate", "--model", "gpt3-175b", "--gpus", "1152", "--gpu", "gb200", "--tp", "16",
                        "--pp", "8")
    assert code == 2 and "must divide the NVLink domain of 72" in err
    code, stdout, _ = _cli("search", "--model", "gpt3-175b", "--gpus", "1152", "--gpu", "gb200", "--tp", "16",
                           "--nvlink-domain-size", "64", "--top", "1")
    assert code == 0 and "tp=16" in stdout
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    assert "tp must divide the NVLink domain" in readme


def test_gpus_per_node_shrinks_a_node_scoped_nvlink_domain() -> None:
    code, stdout, _ = _cli("estimate", "--model", "llama3-8b", "--gpus", "64", "--gpus-per-node", "4", "--tp", "4",
                           "--pp", "1")
    assert code == 0 and "(4/node, NVLink domain 4," in stdout
    code, _, err = _cli("estimate", "--model", "llama3-8b", "--gpus", "64", "--gpus-per-node", "4", "--tp", "8",
                        "--pp", "1")
    assert code == 2 and "tp=8 must divide the NVLink domain of 4" in err
    code, stdout, err = _cli("estimate", "--model", "llama3-8b", "--gpus", "64", "--gpu", "gb200", "--gpus-per-node",
                             "2", "--tp", "1", "--pp", "1")
    # a rack-scale domain is not a node's: the 64-GPU job sits in one 72-GPU rack (catalog.cluster.job_nvlink_domain)
    assert code == 0 and "NVLink domain 64 of each 72-GPU rack" in stdout


@pytest.mark.parametrize("num_gpus, domain", [
    (8, 8), (64, 64), (72, 72),  # within one rack: all of the job's GPUs share it
    (256, 64),   # 64 nodes: Slurm --segment 16 (largest divisor of 64 that fits 18 nodes)
    (288, 72),   # 72 nodes: segment 18, whole racks
    (320, 64),   # 80 nodes: segment 16
    (1152, 72),  # 288 nodes: segment 18
])
def test_job_nvlink_domain_follows_nemo_segment_rule(num_gpus: int, domain: int) -> None:
    from autoplan.catalog.cluster import build_cluster
    assert build_cluster("gb200", num_gpus).nvlink_domain_size == domain


def test_search_pins_exit_2_like_estimate() -> None:
    assert _cli("search", "--model", "llama3-8b", "--gpus", "64", "--tp", "3")[0] == 2
    code, _, err = _cli("search", "--model", "mixtral-8x7b", "--gpus", "64", "--ep", "16")
    assert code == 2 and "keeps the pins" in err
    code, stdout, _ = _cli("search", "--model", "llama3-8b", "--gpus", "64", "--pp", "4", "--first-stage-layers", "5",
                           "--top", "1")
    assert code == 0 and "layers per stage [5, 9, 9, 9]" in stdout
    code, _, err = _cli("search", "--model", "llama3-8b", "--gpus", "64", "--pp", "4", "--first-stage-layers", "6")
    assert code == 2 and "each must get the same number of layers" in err and "valid: first=" in err


def test_output_nits() -> None:
    code, stdout, _ = _cli("estimate", "--model", "llama3-8b", "--gpus", "8", "--tp", "8", "--pp", "1",
                           "--global-batch-size", "1")
    assert code == 0 and "(1 micro-batch," in stdout
    code, stdout, _ = _cli("estimate", "--model", "llama3-8b", "--gpus", "8", "--tp", "8", "--pp", "1",
                           "--precision", "fp8")
    assert code == 0 and "of the bf16 peak" in stdout
    code, stdout, _ = _cli("estimate", "--model", "llama3-8b", "--gpus", "8", "--gpu", "b200", "--tp", "8", "--pp", "1")
    assert code == 0 and "caution: b200 efficiencies are priors" in stdout
    code, stdout, _ = _cli("estimate", "--model", "llama3-8b", "--gpus", "8", "--gpu", "b200", "--tp", "8", "--pp",
                           "1", "--format", "json")
    assert json.loads(stdout)["cluster"]["efficiency_basis"] == "prior"
    code, stdout, _ = _cli("search", "--help")
    assert "[searched]" in stdout and "[1f1b]" not in stdout


def test_index_is_one_based_like_the_table(tmp_path: Path) -> None:
    code, stdout, _ = _cli("search", "--model", "llama3-8b", "--gpus", "64", "--top", "2", "--format", "json")
    plan = tmp_path / "plan.json"
    plan.write_text(stdout)
    second = json.loads(stdout)["plans"][1]["parallel"]
    code, out, _ = _cli("emit", "--target", "megatron", "--plan", str(plan), "--index", "2", "-o", str(tmp_path / "o"))
    assert code == 0, out
    args = (tmp_path / "o" / "megatron_args.txt").read_text()
    assert f"--tensor-model-parallel-size\n{second['tp']}" in args or f"--tensor-model-parallel-size {second['tp']}" \
        in args
    code, _, err = _cli("emit", "--target", "megatron", "--plan", str(plan), "--index", "3", "-o", str(tmp_path / "p"))
    assert code == 2 and "valid: 1..2" in err


def test_calibrate_runs_schema_is_published() -> None:
    code, stdout, _ = _cli("schema", "calibrate_run")
    schema = json.loads(stdout)
    run = {"model": "llama3-70b", "cluster": {"num_gpus": 256}, "parallel": {"tp": 8, "pp": 4},
           "measured_step_time_s": 6.4}
    jsonschema.validate(run, schema)
    assert schema == schema_for("calibrate_run")
    try:
        jsonschema.validate({**run, "measured_step_time_s": 0}, schema)
    except jsonschema.ValidationError:
        pass
    else:
        raise AssertionError("a zero step time passed the runs schema")


def test_hsdp_without_zero3_is_priced_as_megatron_runs_it_and_refused_elsewhere() -> None:
    """``--hsdp 4 --zero 1``: Megatron runs it (the distributed optimizer in dp*cp / 4 instances,
    --num-distributed-optimizer-instances), so the optimizer state is sharded over 4 ranks, not 8; torchtitan
    and the fsdp2 target have no ZeRO-1 and refuse it with their rule."""
    base = ["estimate", "--model", "llama3-8b", "--gpus", "64", "--tp", "8", "--pp", "1", "--zero", "1",
            "--format", "json"]
    code, out, err = _cli(*base, "--hsdp", "4")
    assert code == 0, err
    grouped = json.loads(out)["prediction"]["memory_gib"]["optimizer"]
    whole = json.loads(_cli(*base)[1])["prediction"]["memory_gib"]["optimizer"]
    assert abs(grouped - 2 * whole) < 1e-6 * whole, (grouped, whole)
    for target, rule in (("torchtitan", "no ZeRO-1/2"), ("fsdp2", "always runs fully_shard")):
        code, out, err = _cli(*base, "--hsdp", "4", "--target", target)
        assert code == 2 and rule in err and len(err.strip().splitlines()) == 1, err
    code, out, err = _cli(*base[:-4], "--zero", "0", "--hsdp", "4")
    assert code == 2 and "num-distributed-optimizer-instances" in err, err


@pytest.mark.parametrize("target, zero, plain, valid", [
    ("megatron", "1", "zero_stage=0",
     "zero_stage=0 with hsdp_shard_size unset, hsdp_shard_size=2, hsdp_shard_size=4, hsdp_shard_size=8"),
    ("torchtitan", "3", "zero_stage=0",
     "zero_stage=0 with hsdp_shard_size unset, hsdp_shard_size=2, hsdp_shard_size=4, hsdp_shard_size=8"),
    ("fsdp2", "3", "which fsdp2 does not run: it always shards",
     "hsdp_shard_size=2, hsdp_shard_size=4, hsdp_shard_size=8"),
])
def test_hsdp_of_one_rank_is_refused_as_plain_data_parallelism(target: str, zero: str, plain: str,
                                                               valid: str) -> None:
    """``--hsdp 1`` on dp 16: one-rank shard groups shard nothing and all-reduce whole gradients over 16 replicas,
    ZeRO-0 (Megatron's dp*cp one-rank optimizer instances, torchtitan's dp_shard 1 x dp_replicate 16, FSDP2's (16, 1)
    mesh): refused with the rule and the nearest valid choices; it was priced as a one-rank shard group. On one GPU
    the group of 1 is the whole dp*cp group and still runs as the plain layout (``whole_group_as_plain``)."""
    base = ["estimate", "--model", "llama3-8b", "--tp", "1", "--pp", "1", "--zero", zero, "--target", target]
    code, out, err = _cli(*base, "--gpus", "16", "--hsdp", "1")
    assert code == 2 and err.strip() == (
        "Error: hsdp_shard_size=1 shards nothing: one-rank shard groups replicated over dp*cp = 16 ranks are plain "
        f"data parallelism, {plain}; valid: {valid}, hsdp_shard_size unset"), err
    code, out, err = _cli(*base, "--gpus", "1", "--hsdp", "1")
    assert code == 0 and "runs_as=hsdp_shard_size=1 is the whole dp*cp group" in out, err


@pytest.mark.parametrize("target", ["megatron", "torchtitan"])
def test_hsdp_of_one_rank_under_zero0_says_drop_it(target: str) -> None:
    """``--zero 0 --hsdp 1`` names the one way out (leave hsdp unset); it used to suggest a ZeRO stage whose error
    then suggested zero 0 back (reviewer). A group size that does not divide dp*cp no longer lists 1 as valid."""
    base = ["estimate", "--model", "llama3-8b", "--tp", "1", "--pp", "1", "--gpus", "16", "--target", target]
    code, out, err = _cli(*base, "--zero", "0", "--hsdp", "1")
    assert code == 2 and err.strip() == (
        "Error: hsdp_shard_size=1 shards nothing: one-rank shard groups replicated over dp*cp = 16 ranks are plain "
        "data parallelism, which zero_stage=0 runs without it; valid: hsdp_shard_size unset"), err
    code, out, err = _cli(*base, "--zero", "1" if target == "megatron" else "3", "--hsdp", "3")
    assert code == 2 and "must divide dp*cp = 16; valid: 2, 4, 8, 16" in err, err


@pytest.mark.parametrize("target,zero,muon", [("megatron", None, False), ("megatron", "0", False),
                                              ("megatron", None, True), ("torchtitan", None, False),
                                              ("torchtitan", "0", False), ("fsdp2", None, False)])
def test_search_with_hsdp_of_one_rank_gives_estimates_rule(target: str, zero: str | None, muon: bool) -> None:
    """``search --hsdp 1`` with pins (tp 8, pp 2 on 64 GPUs: dp*cp = 4) says the one-rank rule that estimate says for
    the same flags (``TargetProfile.one_rank_group_error``), one line, exit 2; it said the generic "no layout keeps
    hsdp_shard_size=1; valid: 2, 4" (and under zero 0 Megatron's group-sharding rule instead). With Muon, Megatron's
    unset ZeRO stage is 0 (``default_zero_stage`` reads the user's knobs): the search said the zero-1 form of the rule
    and offered hsdp_shard_size=2, which Muon cannot run."""
    flags = ["--model", "llama3-8b", "--gpus", "64", "--tp", "8", "--pp", "2", "--hsdp", "1", "--target", target,
             *(["--zero", zero] if zero else []), *(["--optimizer", "muon"] if muon else [])]
    code, out, err = _cli("search", *flags)
    e_code, _, e_err = _cli("estimate", *flags)
    assert code == e_code == 2 and err.strip() == e_err.strip(), (err, e_err)
    assert err.count("\n") == 1 and "shards nothing: one-rank shard groups replicated over dp*cp = 4" in err
    assert "Traceback" not in err and "no layout keeps" not in err


@pytest.mark.parametrize("extra", [(), ("--hsdp", "1")])
def test_search_with_a_zero_stage_the_pipeline_pin_refuses_gives_estimates_rule(extra: tuple[str, ...]) -> None:
    """``search --zero 3 --pp 2`` (Megatron: torch FSDP2 refuses pipelining) says the target rule estimate says for the
    same flags, one line, exit 2; it said "no layout keeps pp=2; valid: 1" (and with ``--hsdp 1`` "no layout keeps
    zero_stage=3; valid: 1"), blaming a pin without the reason."""
    flags = ["--model", "llama3-8b", "--gpus", "16", "--tp", "1", "--pp", "2", "--zero", "3", *extra]
    code, out, err = _cli("search", *flags)
    e_code, _, e_err = _cli("estimate", *flags)
    assert code == e_code == 2 and err.strip() == e_err.strip(), (err, e_err)
    assert err.count("\n") == 1 and "no layout keeps" not in err and "Traceback" not in err
    if not extra:
        assert "zero_stage=3 with pp=2" in err and "valid: zero_stage=1, pp=1" in err
    code, _, err = _cli("search", "--model", "llama3-8b", "--gpus", "16", "--pp", "2", "--zero", "3")
    assert code == 2 and "zero_stage=3 with pp=2" in err, err  # tp left to the search: the same rule


def test_top_beside_request_overrides_the_file(tmp_path: Path) -> None:
    """--top shapes the output, so it may be given with --request (the file's "top" is replaced); a job flag
    beside --request is still refused (the file holds the job)."""
    path = tmp_path / "req.json"
    path.write_text(json.dumps({"model": "llama3-8b", "cluster": {"num_gpus": 8}, "top": 1,
                                "job": {"global_batch_size": 64, "seq_len": 2048}}))
    code, out, err = _cli("search", "--request", str(path), "--top", "2", "--format", "json")
    assert code == 0 and len(json.loads(out)["plans"]) == 2, err
    code, out, err = _cli("search", "--request", str(path), "--format", "json")
    assert code == 0 and len(json.loads(out)["plans"]) == 1, err
    code, out, err = _cli("search", "--request", str(path), "--gpus", "16")
    assert code == 2 and "--request replaces --gpus" in err


def test_output_flags_have_one_spelling_everywhere(tmp_path: Path) -> None:
    """emit, batch and calibrate each take -o, --out and --output."""
    for command in ("emit", "batch", "calibrate"):
        code, out, err = _cli(command, "--help")
        assert "-o, --out" in out.replace("--output, --out", "--out, --output") and "--output" in out, command
    code, out, err = _cli("emit", "--target", "megatron", "--model", "llama3-8b", "--gpus", "8", "--tp", "8",
                          "--global-batch-size", "16", "--seq-len", "2048", "--output", str(tmp_path / "e"))
    assert code == 0 and any((tmp_path / "e").iterdir()), err
    lines = tmp_path / "in.jsonl"
    lines.write_text('{"model": "llama3-8b", "cluster": {"num_gpus": 8}, "job": {"global_batch_size": 16}}\n')
    code, out, err = _cli("batch", str(lines), "--out", str(tmp_path / "out.jsonl"))
    assert code == 0 and json.loads((tmp_path / "out.jsonl").read_text())["status"] == "ok", err
