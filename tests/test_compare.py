"""`autoplan compare`: plans from files, search indices and degrees, ranked, with the explanation."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from autoplan import api
from autoplan.cli import cli

JOB = ["--model", "llama3-8b", "--gpus", "16", "--global-batch-size", "128", "--seq-len", "4096"]


def test_compare_api_ranks_and_explains():
    base = {"model": "llama3-8b", "cluster": {"num_gpus": 16}, "job": {"global_batch_size": 128, "seq_len": 4096}}
    r = api.Engine().compare({"plans": [{**base, "parallel": {"tp": 8, "pp": 2}}, {**base, "parallel": {"tp": 2}}]})
    tps = [p.prediction.tokens_per_s for p in r.plans]
    assert r.ranking == sorted(range(2), key=lambda i: -tps[i])
    assert len(r.differences) == 1 and "faster than plan" in r.differences[0]
    assert "layouts differ in" in r.differences[0]
    alone = api.Engine().estimate({**base, "parallel": {"tp": 8, "pp": 2}})
    assert r.plans[0].prediction == alone.prediction


def test_cli_files_indices_and_degrees(tmp_path):
    runner = CliRunner()
    out = runner.invoke(cli, ["search", *JOB, "--format", "json"])
    assert out.exit_code == 0, out.output
    path = tmp_path / "s.json"
    path.write_text(out.stdout)
    saved = json.loads(out.stdout)
    res = runner.invoke(cli, ["compare", str(path), f"{path}#2", "#1", "tp=8,pp=2,zero=1", *JOB, "--format", "json"])
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)
    pars = [p["parallel"] for p in data["plans"]]
    assert pars[0] == saved["plans"][0]["parallel"] and pars[1] == saved["plans"][1]["parallel"]
    assert pars[2] == saved["plans"][0]["parallel"]  # #1 of a fresh search: the same plan
    assert pars[3]["tp"] == 8 and pars[3]["pp"] == 2
    assert data["ranking"][-1] == 3 and len(data["differences"]) == 3
    table = runner.invoke(cli, ["compare", str(path), "tp=8,pp=2", *JOB])
    assert table.exit_code == 0 and "why:" in table.output and "step time s" in table.output


@pytest.mark.parametrize("args,needle", [
    (["tp=8"], "two or more"),
    (["tp=8", "tq=2"], "not a degree"),
    (["tp=8", "tp=x"], "must be an integer"),
    (["#99", "tp=1"], "K must be in 1..50"),
    (["tp=8,tp=4", "tp=1"], "tp is given twice"),  # was read as tp=4
    (["tp=8,sp=maybe", "tp=1"], "sp='maybe' must be true or false"),  # was read as sp off
    # a known key without a value, a typo, a missing file, a bad #K: each says which (were all "'X' is not a degree")
    (["tp=8", "tp="], "plan 'tp=': tp has no value; write tp=VALUE"),
    (["tp=8", "recompte=full"], "'recompte' is not a degree (did you mean recompute?)"),
    (["tp=8", "nofile.json#2"], "plan 'nofile.json#2': no such file (a PLAN is FILE[#K], #K or KEY=VALUE,...)"),
    (["tp=8", "#-1"], "plan '#-1': K must be in 1..50"),
    (["tp=8", "#x"], "plan '#x': #K takes a plan number of the search, 1..50"),
    # a bare key (or key and value without '='), a bare number: the form meant (were "no such file")
    (["tp=8", "tp"], "Error: plan 'tp': a degree is written KEY=VALUE (e.g. tp=VALUE), several joined by commas as "
                     "tp=8,pp=4; a PLAN is FILE[#K], #K or KEY=VALUE,...\n"),
    (["tp=8", "pp2"], "Error: plan 'pp2': a degree is written KEY=VALUE (e.g. pp=2), several joined by commas as "
                      "tp=8,pp=4; a PLAN is FILE[#K], #K or KEY=VALUE,...\n"),
    (["tp=8", "2"], "Error: plan '2': no such file; plan K of the search is written #K (e.g. #2); a PLAN is "
                    "FILE[#K], #K or KEY=VALUE,...\n"),
])
def test_cli_errors_are_one_line(args, needle):
    res = CliRunner().invoke(cli, ["compare", *args, *JOB])
    assert res.exit_code == 2 and needle in res.output and "Traceback" not in res.output
    no_model = CliRunner().invoke(cli, ["compare", "tp=8", "tp=4"])
    assert no_model.exit_code == 2 and "need --model" in no_model.output


def test_cli_file_plan_out_of_range_or_malformed(tmp_path):
    """FILE#K past the file's plans, or a plan whose prediction is not an object: one line, exit 2 (were an
    IndexError and an AttributeError, "internal error")."""
    est = api.estimate({"model": "llama3-8b", "cluster": {"num_gpus": 16},
                        "job": {"global_batch_size": 128, "seq_len": 4096}, "parallel": {"tp": 8, "pp": 2}})
    data = est.model_dump(mode="json")
    saved = {k: data[k] for k in ("model", "cluster", "job")}
    saved["plans"] = [{"parallel": data["parallel"], "prediction": data["prediction"]}]
    path = tmp_path / "s.json"
    path.write_text(json.dumps(saved))
    res = CliRunner().invoke(cli, ["compare", f"{path}#1", f"{path}#3"])
    assert res.exit_code == 2 and "holds 1 plan(s) (valid: 1..1)" in res.output, res.output
    saved["plans"][0]["prediction"] = "x"
    path.write_text(json.dumps(saved))
    res = CliRunner().invoke(cli, ["compare", str(path), "tp=8", *JOB])
    assert res.exit_code == 2 and "plans[0].prediction must be an object, not str" in res.output, res.output


def test_a_plan_over_memory_never_ranks_first():
    """A plan that does not fit loses to one that does, however fast (search ranks only plans that fit); the
    explanation says why. Here ZeRO-2 is faster than ZeRO-3 but over a 40 GiB limit (was ranked best)."""
    base = {"model": "llama3-8b", "cluster": {"num_gpus": 8, "memory_headroom": 40.0},
            "job": {"global_batch_size": 64, "seq_len": 2048}}
    par = {"tp": 2, "pp": 1, "micro_batch_size": 4}
    plans = [{**base, "parallel": {**par, "zero_stage": z}} for z in (2, 3)]
    r = api.Engine().compare({"plans": plans})
    fits = [p.prediction.fits for p in r.plans]
    tps = [p.prediction.tokens_per_s for p in r.plans]
    assert fits == [False, True] and tps[0] > tps[1]  # the case: the faster plan is the one over memory
    assert r.ranking == [1, 0]
    assert "plan 1 does not fit in memory" in r.differences[0]
    both_fit = api.Engine().compare({"plans": [{**p, "cluster": {"num_gpus": 8}} for p in plans]})
    assert both_fit.ranking == [0, 1]  # with room for both, throughput decides
    none_fit = api.Engine().compare({"plans": [{**p, "cluster": {"num_gpus": 8, "memory_headroom": 70.0}}
                                               for p in plans]})
    assert none_fit.ranking == [0, 1] and none_fit.differences[0].startswith("No plan fits in memory (plan 1: ")


def test_flags_no_file_plan_takes_are_refused(tmp_path):
    """With saved results only, the model, cluster and job flags are used by no plan: refused by name (they were
    silently ignored, the files' values priced); beside a degree plan they apply to it."""
    runner = CliRunner()
    out = runner.invoke(cli, ["search", *JOB, "--top", "2", "--format", "json"])
    assert out.exit_code == 0, out.output
    path = tmp_path / "s.json"
    path.write_text(out.stdout)
    bad = runner.invoke(cli, ["compare", str(path), f"{path}#2", "--seq-len", "8192", "--gpu", "b200"])
    assert bad.exit_code == 2 and "--gpu, --seq-len would be ignored" in bad.stderr, bad.output
    knob = runner.invoke(cli, ["compare", str(path), f"{path}#2", "--target", "torchtitan", "--compile"])
    assert knob.exit_code == 2 and "--target, --compile would be ignored" in knob.stderr, knob.output
    assert runner.invoke(cli, ["compare", str(path), f"{path}#2"]).exit_code == 0
    mixed = runner.invoke(cli, ["compare", str(path), "tp=2", *JOB, "--format", "json"])
    assert mixed.exit_code == 0, mixed.output
    assert json.loads(mixed.stdout)["plans"][1]["job"]["seq_len"] == 4096
