"""A new user's pass over the face (CLI): each bug found by trying autoplan as documented, one regression each."""

from __future__ import annotations

import importlib.util
import json
import re

import pytest
from click.testing import CliRunner

from autoplan.cli import cli


def _cli(*args: str) -> tuple[int, str, str]:
    r = CliRunner().invoke(cli, list(args))
    return r.exit_code, r.stdout, r.stderr


@pytest.mark.parametrize("target,valid", [("torchtitan", "valid: 0, 3"), ("fsdp2", "valid: 3")])
def test_search_zero_pin_the_target_refuses_names_its_rule_like_estimate(target: str, valid: str) -> None:
    """``search --zero 2 --target torchtitan`` said only "no parallel layout ... keeps the pins; relax the pins";
    estimate names the framework rule and the stages it runs. Search now gives that line."""
    code, _, err = _cli("search", "--model", "llama3-8b", "--gpus", "8", "--zero", "2", "--target", target)
    est = _cli("estimate", "--model", "llama3-8b", "--gpus", "8", "--tp", "1", "--pp", "1", "--zero", "2",
               "--target", target)
    assert code == 2 and est[0] == 2
    assert err.strip().splitlines()[-1] == est[2].strip().splitlines()[-1]
    assert valid in err and "Traceback" not in err


def test_scale_any_names_the_target_of_each_row() -> None:
    """``scale --target any`` printed 'tp1 pp2 cp1 zero2' with no word of which framework runs it (search names it)."""
    code, out, err = _cli("scale", "--model", "llama3-8b", "--gpus", "8,16", "--target", "any")
    assert code == 0, err
    rows = [line for line in out.splitlines() if line.split()[:1] in (["8"], ["16"])]
    assert len(rows) == 2 and all(re.search(r"\[(megatron|torchtitan|fsdp2)\] tp\d", r) for r in rows), out
    code, out, _ = _cli("scale", "--model", "llama3-8b", "--gpus", "8", "--target", "megatron")
    assert code == 0 and "[megatron]" not in out


def test_readme_error_examples_are_what_the_cli_prints() -> None:
    """Every ``$ autoplan ...`` example in the README followed by an ``Error:`` line prints exactly that line."""
    import shlex
    from pathlib import Path

    text = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    pairs = re.findall(r"^\$ autoplan (.+)\n(Error: .+)$", text, flags=re.M)
    assert len(pairs) >= 2
    for cmd, shown in pairs:
        code, _, err = _cli(*shlex.split(cmd))
        assert code == 2 and err.strip().splitlines()[-1] == shown, (cmd, err)


def test_a_gpu_count_no_layout_divides_names_the_nearest_counts_that_do() -> None:
    """``search --model llama3-8b --gpus 1000`` (no dp divides the batch of 1024 with tp·pp·cp absorbing 1000's
    factor 125) said only "relax the pins or change the global batch size / GPU count"; it names the nearest
    GPU counts that have a layout."""
    code, _, err = _cli("search", "--model", "llama3-8b", "--gpus", "1000")
    assert code == 3 and "Traceback" not in err
    near = [int(x) for x in re.findall(r"(\d+) GPUs", err.split("nearest GPU counts with a layout:")[1].split(";")[0])]
    assert len(near) == 2 and near[0] < 1000 < near[1]
    for n in near:  # each one really has a plan
        assert _cli("search", "--model", "llama3-8b", "--gpus", str(n), "--top", "1")[0] == 0


def test_a_pin_no_layout_keeps_names_the_values_that_work() -> None:
    """``search --mbs 8 --global-batch-size 4`` said "keeps the pins ...; relax the pins" with no valid value."""
    code, _, err = _cli("search", "--model", "llama3-8b", "--gpus", "8", "--global-batch-size", "4", "--mbs", "8")
    assert code == 2 and "Traceback" not in err
    valid = [int(x) for x in err.strip().splitlines()[-1].split("; valid: ")[1].split(", ")]
    assert valid and 8 not in valid and all(4 % v == 0 for v in valid)
    for v in valid[:1] + valid[-1:]:  # each value named really gives plans
        assert _cli("search", "--model", "llama3-8b", "--gpus", "8", "--global-batch-size", "4", "--mbs", str(v),
                    "--top", "1")[0] == 0


def test_emit_and_validate_a_plan_file_write_for_the_target_the_plan_names(tmp_path) -> None:
    """``search --target any/torchtitan --format json > plan.json`` then ``emit --plan plan.json``: the plan names
    its target (plans[i].target), yet emit and validate demanded --target. They now default to it."""
    code, out, _ = _cli("search", "--model", "llama3-8b", "--gpus", "16", "--target", "torchtitan", "--top", "1",
                        "--format", "json")
    assert code == 0
    plan = tmp_path / "plan.json"
    plan.write_text(out)
    code, out, err = _cli("emit", "--plan", str(plan), "-o", str(tmp_path / "e"))
    assert code == 0, err
    assert "files for torchtitan" in out and (tmp_path / "e" / "torchtitan_overrides.txt").exists()
    if importlib.util.find_spec("torchtitan") is None:
        pytest.skip("validate needs the validate extra (torchtitan)")
    code, out, err = _cli("validate", "--plan", str(plan))
    assert code in (0, 1) and "validate --target torchtitan" in out, err
    assert "activation_checkpoint=none" in out and "NoneType" not in out  # AC off was printed as "NoneType"
    code, _, err = _cli("emit", "--model", "llama3-8b", "--gpus", "16", "--tp", "2", "--pp", "1", "-o",
                        str(tmp_path / "f"))
    assert code == 2 and "Missing option '--target'" in err and "megatron, torchtitan, fsdp2" in err


def test_compare_headers_tell_the_rank_from_the_search_index() -> None:
    """``compare '#1' '#2'`` headed its columns "#1 #1" and "#2 #2": rank and search index looked alike."""
    code, out, err = _cli("compare", "#1", "#2", "--model", "llama3-8b", "--gpus", "16", "--target", "torchtitan")
    assert code == 0, err
    head = out.splitlines()[0]
    assert "search #1" in head and "search #2" in head and "#1 #1" not in head


def test_scale_takes_the_knob_flags_search_takes() -> None:
    """``scale --target torchtitan --no-compile`` was "No such option '--compile'": scale could not plan a job with
    the knobs its search takes. Each size's plan is now search's plan with those knobs."""
    import json

    code, out, err = _cli("scale", "--model", "llama3-8b", "--gpus", "8,16", "--target", "torchtitan", "--no-compile",
                          "--format", "json")
    assert code == 0, err
    rows = json.loads(out)["rows"]
    for row in rows:
        assert row["plan"]["prediction"]["software"]["compile"] is False
        code, s_out, _ = _cli("search", "--model", "llama3-8b", "--gpus", str(row["num_gpus"]), "--target",
                              "torchtitan", "--no-compile", "--top", "1", "--format", "json")
        assert code == 0
        assert json.loads(s_out)["plans"][0]["prediction"]["step_time_s"] == row["step_time_s"]
    code, _, err = _cli("scale", "--model", "llama3-8b", "--gpus", "8", "--target", "megatron", "--compile")
    assert code == 2 and "megatron has no knob compile" in err


def test_compare_takes_the_knob_flags_for_searched_and_degree_plans() -> None:
    """``compare ... --target torchtitan --no-compile`` was "No such option": two layouts could not be compared under
    the knobs the user runs. #K plans come from search with the knobs, degree plans are estimated with them."""
    import json

    args = ["--model", "llama3-8b", "--gpus", "16", "--target", "torchtitan", "--format", "json"]
    code, out, err = _cli("compare", "#1", "tp=2,pp=1", *args, "--no-compile")
    assert code == 0, err
    plans = json.loads(out)["plans"]
    assert all(p["prediction"]["software"]["compile"] is False for p in plans)
    code, e_out, _ = _cli("estimate", "--model", "llama3-8b", "--gpus", "16", "--tp", "2", "--pp", "1", "--target",
                          "torchtitan", "--no-compile", "--format", "json")
    assert code == 0 and json.loads(e_out)["prediction"]["step_time_s"] == plans[1]["prediction"]["step_time_s"]
    code, _, err = _cli("compare", "tp=2,pp=1", "tp=1,pp=1", "--model", "llama3-8b", "--gpus", "8", "--target",
                        "fsdp2", "--async-tp")
    assert code == 2 and "fsdp2 has no knob async_tp" in err


def test_zero_help_says_what_each_stage_is_on_each_target() -> None:
    """``--zero`` help read "0 DDP, 1 distributed optimizer, 2, 3 FSDP": stage 2 unexplained, and torchtitan/fsdp2
    (which default to 3 and refuse 1/2) not mentioned."""
    code, out, _ = _cli("estimate", "--help")
    text = " ".join(out.split())
    assert code == 0 and "2 Megatron-FSDP optim_grads" in text and "torchtitan 0 replicate, 3 FSDP2" in text


@pytest.mark.parametrize("pins,line", [
    (["--vp", "2"], "Error: vp=2 virtual stages per pipeline rank (the interleaved schedule) need pp > 1; valid: "
                    "vp=1, or pp >= 2"),
    (["--schedule", "interleaved"], "Error: schedule 'interleaved' needs pp > 1; valid: schedule 1f1b, or pp >= 2"),
])
@pytest.mark.parametrize("target", ["megatron", "any"])
def test_search_interleaving_on_one_pipeline_rank_says_the_rule_as_estimate_does(pins: list[str], line: str,
                                                                                 target: str) -> None:
    """``search --pp 1 --vp 2`` said "no layout keeps pp=1; valid: 2, 4, ..." (as if pp were the mistake); it says
    vp > 1 needs pp > 1, the line estimate gives ("invalid parallel: ..." there)."""
    code, _, err = _cli("search", "--model", "llama3-70b", "--gpus", "64", "--pp", "1", *pins, "--target", target)
    assert code == 2 and err.strip().splitlines() == [line], err
    code, _, err = _cli("estimate", "--model", "llama3-70b", "--gpus", "64", "--tp", "8", "--pp", "1", *pins)
    assert code == 2 and err.strip().splitlines() == [line.replace("Error: ", "Error: invalid parallel: ")], err


@pytest.mark.parametrize("pins,line", [
    (["--vp", "2", "--schedule", "1f1b"],
     "vp=2 virtual stages per pipeline rank run the interleaved schedule (megatron-core picks it whenever a virtual "
     "pipeline size is set, schedules.py:144-148), not schedule '1f1b'; valid: schedule interleaved (or omit it), or "
     "vp=1"),
    (["--vp", "1", "--schedule", "interleaved"],
     "schedule 'interleaved' needs vp >= 2 virtual stages per pipeline rank (Megatron "
     "--num-virtual-stages-per-pipeline-rank); pass vp (e.g. --vp 2), or schedule '1f1b'"),
])
def test_vp_and_schedule_that_contradict_are_one_rule_in_search_and_estimate(pins: list[str], line: str) -> None:
    """``estimate --vp 2 --schedule 1f1b`` silently priced the interleaved schedule while ``search`` with the same
    pins said "no layout keeps vp=2; valid: 1". Megatron has no schedule flag: a virtual pipeline size is the
    interleaved schedule. Both now refuse the contradiction with that rule; vp 2 alone still means interleaved."""
    code, _, err = _cli("search", "--model", "llama3-8b", "--gpus", "64", "--tp", "1", "--pp", "4", *pins)
    assert code == 2 and err.strip().splitlines() == [f"Error: {line}"], err
    code, _, err = _cli("estimate", "--model", "llama3-8b", "--gpus", "64", "--tp", "1", "--pp", "4", *pins)
    assert code == 2 and err.strip().splitlines() == [f"Error: invalid parallel: {line}"], err
    code, out, err = _cli("estimate", "--model", "llama3-8b", "--gpus", "64", "--tp", "1", "--pp", "4", "--vp", "2",
                          "--format", "json")
    assert code == 0 and '"schedule": "interleaved"' in out, err


@pytest.mark.parametrize("target", ["megatron", "torchtitan"])
def test_an_hsdp_pin_no_layout_keeps_names_the_shard_sizes_that_work(target: str) -> None:
    """``search --model llama3-70b --gpus 1024 --hsdp 3`` said "relax the pins" with no valid value (Megatron's search
    offers no HSDP group unpinned); it names the shard sizes a pin can take, and each one named gives plans
    (Megatron: the distributed optimizer's instances, which estimate accepts and the search did not try)."""
    code, _, err = _cli("search", "--model", "llama3-8b", "--gpus", "64", "--hsdp", "3", "--target", target)
    line = err.strip().splitlines()[-1]
    assert code == 2 and "no layout keeps hsdp_shard_size=3; valid: " in line, err
    valid = [int(x) for x in line.split("; valid: ")[1].split(", ")]
    assert valid == [2, 4, 8, 16, 32, 64]  # every divisor of dp*cp above 1 (tp=1 pp=1: dp*cp = 64)
    for v in (2, 16):
        code, out, err = _cli("search", "--model", "llama3-8b", "--gpus", "64", "--hsdp", str(v), "--target", target,
                              "--top", "1")
        assert code == 0 and f"hsdp={v}" in out, err
    code, out, err = _cli("search", "--model", "llama3-70b", "--gpus", "1024", "--hsdp", "3", "--tp", "8", "--pp", "4")
    assert code == 2 and err.strip().endswith("no layout keeps hsdp_shard_size=3; valid: 2, 4, 8, 16, 32"), err


@pytest.mark.parametrize("args,why", [
    (["--model", "mixtral-8x7b", "--seq-len", "1001", "--tp", "8"],
     "no layout keeps tp=8 (MoE with tp > 1 runs sequence parallelism: sequence_parallel with tp=8 splits the 1001 "
     "tokens of a CP rank over tp: seq_len/cp must be divisible by tp (megatron-core 0.16.1 "
     "tensor_parallel/mappings.py:69-70)); valid: 1"),
    # torchtitan's own rule (was the internal "no torchtitan strategy for expert_gate_proj+expert_up_proj on tp8")
    (["--model", "mixtral-8x7b", "--seq-len", "1001", "--tp", "8", "--target", "torchtitan"],
     "no layout keeps tp=8 (MoE with tp > 1 runs sequence parallelism: sequence_parallel with tp=8 needs "
     "seq_len=1001 divisible by tp = 8 (torchtitan 0.3.0 torchtitan/trainer.py:306-315, "
     "parallelism.enable_sequence_parallel)); valid: 1"),
    # an expert-parallel pin: the target's expert rule (was "no layout keeps ep=64; valid: 1, 2, 4, 8")
    (["--model", "olmoe-1b-7b", "--ep", "64"],
     "no layout keeps ep=64 (ep=64 must divide tp*cp*dp = 1*1*8 = 8: megatron cuts the expert layers' ep x edp from "
     "those ranks of a pipeline stage (Megatron-LM megatron/core/parallel_state.py@55ac7082:786-806: the expert "
     "RankGenerator needs world_size % (expert_tensor_parallel_size*ep*pp) == 0, with expert_tensor_parallel_size "
     "1)); valid: 1, 2, 4, 8"),
    (["--model", "olmoe-1b-7b", "--ep", "3"],
     "no layout keeps ep=3 (ep=3 does not divide num_experts=64 (Megatron-LM megatron/training/arguments.py@55ac7082:"
     "1025-1028)); valid: 1, 2, 4, 8"),
    (["--model", "llama3-8b", "--global-batch-size", "3", "--pp", "4"],
     "no layout keeps pp=4 (a pipeline of pp=4 needs at least 4 micro-batches; global_batch_size=3 makes at most 3); "
     "valid: 1, 2"),
])
def test_a_pin_no_layout_keeps_says_the_rule_it_breaks(args: list[str], why: str) -> None:
    """``--tp 8`` on an MoE model whose sequence tp does not divide, or ``--pp 4`` with a batch of 3, said only
    "no layout keeps tp=8; valid: 1": the valid value without the reason."""
    code, _, err = _cli("search", "--gpus", "8", *args)
    assert code == 2 and err.strip().splitlines()[-1].endswith(why), err


@pytest.mark.parametrize("target,plain", [("megatron", "ZeRO-1"), ("torchtitan", "FSDP (zero_stage=3)"),
                                          ("fsdp2", "FSDP (zero_stage=3)")])
def test_an_hsdp_group_of_all_dp_ranks_runs_as_the_plain_sharding(target: str, plain: str) -> None:
    """``search --hsdp 8`` where dp*cp = 8 returned plans labelled hsdp=8 with no replica groups. Every target runs
    one shard group of all dp*cp ranks as its plain ZeRO/FSDP (torchtitan dp_replicate=1, Megatron one
    distributed-optimizer instance, fsdp2 a 1-D mesh): the plan says that, with a note; estimate notes it too."""
    code, out, err = _cli("search", "--model", "llama3-8b", "--gpus", "16", "--tp", "2", "--pp", "1", "--hsdp", "8",
                          "--target", target, "--top", "2", "--format", "json")
    assert code == 0, err
    plans = json.loads(out)["plans"]
    assert plans and all(p["parallel"].get("hsdp_shard_size") is None for p in plans), plans
    note = (f"hsdp_shard_size=8 is the whole dp*cp group (one shard group, no replicas): {target} runs it as plain "
            f"{plain} over dp*cp = 8 (")
    assert all(p["prediction"]["software"]["runs_as"].startswith(note) for p in plans)
    zero = "1" if target == "megatron" else "3"
    code, out, err = _cli("estimate", "--model", "llama3-8b", "--gpus", "16", "--tp", "2", "--pp", "1", "--hsdp", "8",
                          "--zero", zero, "--target", target, "--format", "json")
    assert code == 0 and json.loads(out)["prediction"]["software"]["runs_as"].startswith(note), err


@pytest.mark.parametrize("target,line", [
    ("megatron", "Error: hsdp_shard_size=8 with zero_stage=0: Megatron-LM shards in groups only with the distributed "
                 "optimizer (--num-distributed-optimizer-instances, Megatron-LM megatron/training/arguments.py@"
                 "55ac7082:2333); --use-torch-fsdp2 always shards over the whole dp*cp group; valid: zero_stage=1, "
                 "hsdp_shard_size unset"),
    ("torchtitan", "Error: hsdp_shard_size=8 needs zero_stage=3 (torchtitan's dp_replicate x dp_shard); valid: "
                   "zero_stage=3"),
])
def test_an_hsdp_group_of_all_dp_ranks_under_zero_0_is_refused(target: str, line: str) -> None:
    """``--hsdp 8 --zero 0`` with dp*cp = 8 was priced (hsdp_error was asked only for groups below dp*cp): ZeRO-0
    shards nothing, so a shard group contradicts it at any size; the rule the target gives below dp*cp."""
    code, _, err = _cli("estimate", "--model", "llama3-8b", "--gpus", "16", "--tp", "2", "--pp", "1", "--hsdp", "8",
                        "--zero", "0", "--target", target)
    assert code == 2 and err.strip().splitlines() == [line], err
    # search gives the same line (was "no layout keeps zero_stage=0; valid: 1, 2, 3")
    code, _, err = _cli("search", "--model", "llama3-8b", "--gpus", "16", "--hsdp", "8", "--zero", "0", "--target",
                        target)
    assert code == 2 and err.strip().splitlines() == [line], err


def test_model_and_plan_files_of_the_wrong_json_shape_say_so_in_json_words(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A config.json holding ``null`` said "got NoneType", a plan file "not NoneType", and a plan whose "plans" is
    a number "must be a list": Python's names for what the user wrote in JSON."""
    null = tmp_path / "config.json"
    null.write_text("null")
    code, _, err = _cli("estimate", "--model", str(null), "--gpus", "8", "--tp", "1", "--pp", "1")
    assert code == 2 and err.strip() == f"Error: '{null}' must contain a mapping of fields, got null", err
    code, _, err = _cli("validate", "--target", "megatron", "--plan", str(null))
    assert code == 2 and err.strip() == f"Error: plan file '{null}' must hold one JSON object, not null", err
    plan = tmp_path / "plan.json"
    plan.write_text('{"model": 5}')
    code, _, err = _cli("emit", "--target", "megatron", "--plan", str(plan), "-o", str(tmp_path / "out"))
    assert code == 2 and err.strip() == f"Error: plan file '{plan}': \"model\" must be an object, not number", err


@pytest.mark.parametrize("args,hint", [
    (["--model", "llama3-8b", "--gpus", "1000"],
     "nearest GPU counts with a layout: 992 GPUs and 1024 GPUs; on 1000 GPUs, global batch sizes with a layout: 1020 "
     "and 1025"),
    # only 1 GPU "had a layout" (where mixtral does not fit): the batch is the way out on these 8 GPUs
    (["--model", "mixtral-8x7b", "--gpus", "8", "--seq-len", "1", "--global-batch-size", "1"],
     "nearest GPU counts with a layout: 1 GPUs; on 8 GPUs, global batch sizes with a layout: 8"),
])
def test_a_job_no_layout_shapes_names_the_batch_sizes_that_do(args: list[str], hint: str) -> None:
    """An infeasible-by-shape job named only other GPU counts; it names the nearest global batch sizes that have a
    layout on the user's cluster too (``search.planner._nearest_legal_batches``)."""
    code, _, err = _cli("search", *args)
    assert code == 3 and err.strip().splitlines()[-1].endswith(hint), err
    batch = hint.rsplit(" ", 1)[1]
    code, _, err = _cli("search", *args[:4], *(["--seq-len", "1"] if "--seq-len" in args else []),
                        "--global-batch-size", batch, "--top", "1")
    assert "passes the hard constraints" not in err, err  # a layout exists (it may still not fit in memory)


@pytest.mark.parametrize("pins", [["--vp", "2"], ["--schedule", "interleaved"], ["--vp", "2", "--target", "any"]])
def test_search_interleaving_a_hybrid_says_megatrons_mamba_rule_as_estimate_does(pins: list[str]) -> None:
    """``search --model nemotron-h-8b --vp 2`` said "no layout keeps vp=2; valid: 1"; estimate names the rule
    (MambaBlock has no virtual pipeline stages). Search now gives that line (``any``: of the targets that build it)."""
    line = ("Error: nemotron-h-8b: the Mamba hybrid model does not support virtual/interleaved pipeline parallelism "
            "(megatron-core 0.16.1 megatron/core/ssm/mamba_block.py:173-176); valid: vp=1")
    code, _, err = _cli("search", "--model", "nemotron-h-8b", "--gpus", "8", *pins)
    assert code == 2 and err.strip().splitlines() == [line], err
    code, _, err = _cli("estimate", "--model", "nemotron-h-8b", "--gpus", "8", "--tp", "1", "--pp", "2", "--vp", "2")
    assert code == 2 and err.strip().splitlines() == [line], err


@pytest.mark.parametrize(("cluster", "says"), [
    ({"efficiency": {"gemm": 0.5}}, "invalid cluster efficiency: gemm: unknown field (did you mean gemm_max?)"),
    ({"efficiency": {"gemm_max": -3.0}}, "invalid cluster efficiency: gemm_max: Input should be greater than 0"),
    ({"gpu": "h100-sxmx"}, "unknown GPU 'h100-sxmx'; did you mean: h100-sxm"),
])
def test_a_plan_files_cluster_the_catalog_refuses_names_the_file(tmp_path, cluster: dict, says: str) -> None:  # type: ignore[no-untyped-def]
    """An invalid ``cluster.efficiency`` field (or GPU) of a plan file was refused where the cluster is built, in a
    line that named neither the file nor that it came from one: emit and compare now name it."""
    code, out, err = _cli("estimate", "--model", "llama3-8b", "--gpus", "8", "--tp", "8", "--pp", "1",
                          "--format", "json")
    assert code == 0, err
    data = json.loads(out)
    data["cluster"].update(cluster)
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps(data))
    for args in (["emit", "--target", "megatron", "--plan", str(plan), "-o", str(tmp_path / "out")],
                 ["compare", str(plan), str(plan)]):
        code, _, err = _cli(*args)
        [line] = err.strip().splitlines()
        assert code == 2 and line.startswith(f"Error: plan file '{plan}': {says}"), (args, err)
