"""Target profiles (cost_models.targets): legality with the framework's reason, run-time semantics priced,
knobs checked, and the search space enumerating only what a target runs."""

from __future__ import annotations

import pytest

from autoplan import api
from autoplan.catalog import build_cluster, load_model
from cost_models.errors import ConfigError
from cost_models.specs import JobSpec, ParallelConfig
from cost_models.targets import MEGATRON, PROFILES
from search.space import Tally, enumerate_layouts


@pytest.fixture(scope="module")
def ds3():  # type: ignore[no-untyped-def]
    return load_model("deepseek-v3")


def test_megatron_refuses_fsdp2_with_ep_citing_validate_args(ds3) -> None:  # type: ignore[no-untyped-def]
    cluster = build_cluster("h800", 2048)
    job = JobSpec(global_batch_size=4096, seq_len=4096)
    par = ParallelConfig(tp=1, pp=1, ep=256, zero_stage=3)
    with pytest.raises(ConfigError, match=r"--use-torch-fsdp2 is not supported with expert parallelism "
                                          r"\(Megatron-LM megatron/training/arguments.py@55ac7082:611\)"):
        MEGATRON.check(ds3, cluster, job, par)
    with pytest.raises(ConfigError, match="expert parallelism"):
        api.estimate({"model": "deepseek-v3", "cluster": {"gpu": "h800", "num_gpus": 2048},
                      "job": {"global_batch_size": 4096, "seq_len": 4096},
                      "parallel": {"tp": 1, "pp": 1, "ep": 256, "zero_stage": 3}, "target": "megatron"})


def test_search_space_holds_only_what_the_target_runs(ds3) -> None:  # type: ignore[no-untyped-def]
    cluster = build_cluster("h800", 2048)
    job = JobSpec(global_batch_size=4096, seq_len=4096)
    for target in ("megatron", "torchtitan"):
        prof = PROFILES[target]
        tally = Tally()
        n = 0
        for lay in enumerate_layouts(ds3, cluster, job, target, {"tp": 8}, tally):  # type: ignore[arg-type]
            n += 1
            assert lay.zero_stage in prof.zero_stages and lay.schedule in prof.schedules
            assert prof.layout_error(ds3, tp=lay.tp, pp=lay.pp, cp=lay.cp, ep=lay.ep, zero=lay.zero_stage,
                                     hsdp=lay.hsdp_shard_size, dp_cp=lay.dp * lay.cp, schedule=lay.schedule) is None
        assert n > 0
        if target == "megatron":
            assert tally.counts["target_rule"] > 0  # ZeRO-3 with pp > 1 or ep > 1 was cut




def test_cli_estimate_illegal_layout_is_one_line_naming_the_rule() -> None:
    from click.testing import CliRunner

    from autoplan.cli import cli

    res = CliRunner().invoke(cli, ["estimate", "--model", "llama3-8b", "--gpus", "16", "--tp", "1", "--pp", "2",
                                   "--zero", "3", "--target", "megatron"])
    assert res.exit_code == 2, res.output
    assert res.output.strip().count("\n") == 0 and "arguments.py@55ac7082" in res.output
    ok = CliRunner().invoke(cli, ["estimate", "--model", "llama3-8b", "--gpus", "16", "--tp", "1", "--pp", "2",
                                  "--zero", "3", "--target", "torchtitan"])
    assert ok.exit_code == 0, ok.output
