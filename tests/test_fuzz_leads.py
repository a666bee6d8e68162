"""Leads of the s18 fuzzing pass on the user-facing surfaces (CLI, Python API, JSONL batch), each pinned:

1. a plan file written with a cluster profile (``--cluster``) reloads (``emit --plan``, ``compare FILE``) on that
   cluster, its profile's efficiency fields included, not on the catalog's;
2. list-valued inputs (``cuda_graph_scope``, ``recompute_modules``, ``calibrate --fit``) refuse a repeated name, the
   same rule on every surface;
3. a request's ``memory_headroom`` takes the CLI's forms (``6GiB``, ``10%``) through one parser."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from autoplan import api
from autoplan.cli import cli
from autoplan.errors import UserInputError

JOB = ["--model", "llama3-8b", "--gpus", "16", "--global-batch-size", "128", "--seq-len", "4096"]
ROOT = Path(__file__).resolve().parents[1]


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
