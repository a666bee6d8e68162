"""`autoplan scale`: a sweep equals independent searches, strong/weak batches, efficiency, time and cost."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from autoplan import api
from autoplan.capacity import ScaleRequest, parse_gpus
from autoplan.cli import cli
from autoplan.errors import UserInputError

BASE = {"model": "llama3-8b", "gpus": [16, 32, 64], "job": {"global_batch_size": 128, "seq_len": 4096}}


def test_sweep_equals_independent_searches():
    result = api.Engine().scale(BASE)
    assert [r.num_gpus for r in result.rows] == [16, 32, 64]
    for row in result.rows:
        alone = api.Engine().search({"model": "llama3-8b", "cluster": {"num_gpus": row.num_gpus},
                                     "job": BASE["job"], "top": 1})
        assert row.plan.parallel == alone.plans[0].parallel
        assert row.plan.prediction == alone.plans[0].prediction
        assert row.tokens_per_s == alone.plans[0].prediction.tokens_per_s
    first = result.rows[0]
    assert first.scaling_efficiency == 1.0
    for row in result.rows:
        assert row.scaling_efficiency == pytest.approx(row.tokens_per_s_per_gpu / first.tokens_per_s_per_gpu)
        assert row.global_batch_size == 128  # strong scaling


def test_weak_scaling_batches_and_training_time():
    job = {k: v for k, v in BASE["job"].items() if k != "global_batch_size"}  # tokens_per_gpu sets the batch
    weak = api.Engine().scale({**BASE, "job": job, "tokens_per_gpu": 32768, "train_tokens": 1e12,
                               "gpu_hour_price": 2.0})
    assert [r.global_batch_size for r in weak.rows] == [n * 32768 // 4096 for n in (16, 32, 64)]
    assert weak.scaling == "weak"
    for r in weak.rows:
        hours = 1e12 / (r.tokens_per_s * r.goodput) / 3600
        assert r.train_days == pytest.approx(hours / 24)
        assert r.gpu_hours == pytest.approx(hours * r.num_gpus)
        assert r.cost == pytest.approx(2.0 * r.gpu_hours)
    prop = api.Engine().scale({**BASE, "scaling": "weak"})
    assert [r.global_batch_size for r in prop.rows] == [128, 256, 512]


def test_sizes_without_a_plan_are_rows_not_errors():
    result = api.Engine().scale({"model": "llama3-70b", "gpus": [2, 64], "job": {"global_batch_size": 64}})
    assert result.rows[0].status == "infeasible" and "fits" in result.rows[0].message
    assert result.rows[1].status == "ok" and result.rows[1].scaling_efficiency == 1.0


def test_layout_changes_are_marked():
    result = api.Engine().scale({"model": "llama3-70b", "gpus": [64, 512, 4096, 8192]})
    labels = [r.layout for r in result.rows]
    assert [r.layout_changed for r in result.rows] == [False] + [a != b for a, b in zip(labels, labels[1:])]


def test_parse_gpus():
    assert parse_gpus("64..8192") == [64, 128, 256, 512, 1024, 2048, 4096, 8192]
    assert parse_gpus("8, 24,64..128") == [8, 24, 64, 128]
    assert ScaleRequest(model="x", gpus=[64, 8]).gpus == [8, 64]
    # a range the wrong way round, or from no GPUs, says which (was "expected a list like ... or a range like ...")
    with pytest.raises(UserInputError, match=r"^--gpus '8\.\.4': the range 8\.\.4 runs downwards; valid: 4\.\.8$"):
        parse_gpus("8..4")
    with pytest.raises(UserInputError, match=r"^--gpus '0\.\.8': a range starts at a positive GPU count, not 0$"):
        parse_gpus("0..8")


@pytest.mark.parametrize(("text", "line"), [
    ("8,8", "--gpus '8,8': '8' given twice; give each GPU count once: 8"),
    ("64..256,128", "--gpus '64..256,128': '128' given twice; give each GPU count once: 64,128,256"),
    ("16,8,16,16", "--gpus '16,8,16,16': '16' given 3 times; give each GPU count once: 16,8"),
])
def test_a_repeated_gpu_count_is_refused(text: str, line: str) -> None:
    """A GPU count given twice (or a listed count a range already holds) was merged silently; like every list input
    (``cost_models.errors.repeated_error``) it is a slip, refused in one line naming it: CLI and request alike."""
    r = CliRunner().invoke(cli, ["scale", "--model", "llama3-8b", "--gpus", text])
    assert r.exit_code == 2 and r.stderr.strip().splitlines() == [f"Error: {line}"], r.output
    with pytest.raises(UserInputError, match=r"gpus: '8' given twice; give each GPU count once: 64,8$"):
        api.scale({"model": "llama3-8b", "gpus": [64, 8, 8]})


def test_cli_table_json_plot_and_errors(tmp_path):
    runner = CliRunner()
    args = ["scale", "--model", "llama3-8b", "--gpus", "16..64", "--global-batch-size", "128", "--seq-len", "4096"]
    out = runner.invoke(cli, args + ["--train-tokens", "1T"])
    assert out.exit_code == 0, out.output
    assert "best layout" in out.output and "days" in out.output and "16" in out.output
    js = runner.invoke(cli, args + ["--format", "json"])
    data = json.loads(js.stdout)
    assert [r["num_gpus"] for r in data["rows"]] == [16, 32, 64]
    bad = runner.invoke(cli, ["scale", "--model", "llama3-8b", "--gpus", "64..x"])
    assert bad.exit_code == 2 and "64..8192" in bad.output and "Traceback" not in bad.output
    bad = runner.invoke(cli, args + ["--plot", str(tmp_path / "x.jpg")])
    assert bad.exit_code == 2 and ".png or .svg" in bad.output
    pytest.importorskip("matplotlib")
    for name in ("s.png", "s.svg"):
        out = runner.invoke(cli, args + ["--plot", str(tmp_path / name)])
        assert out.exit_code == 0, out.output
        assert (tmp_path / name).stat().st_size > 1000
    assert (tmp_path / "s.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert b"<svg" in (tmp_path / "s.svg").read_bytes()[:2000]


def test_forked_sweep_gives_the_same_rows():
    import threading

    if threading.active_count() > 1:
        pytest.skip("this test process has threads: the sweep would not fork")
    req = {"model": "llama3-70b", "gpus": [2, 64, 512], "job": {"global_batch_size": 256}}
    one = api.Engine().scale(req, processes=1)
    two = api.Engine().scale(req, processes=2)
    assert one.model_dump(exclude={"wall_time_s"}) == two.model_dump(exclude={"wall_time_s"})
    assert two.rows[0].status == "infeasible" and two.rows[0].hint == one.rows[0].hint


def test_bad_and_infeasible_sizes_in_the_cli():
    runner = CliRunner()
    out = runner.invoke(cli, ["scale", "--model", "llama3-70b", "--gpus", "64,100", "--global-batch-size", "64"])
    assert out.exit_code == 0 and "100 GPUs: num_gpus (100) must be a multiple of gpus_per_node (8)" in out.output
    none = runner.invoke(cli, ["scale", "--model", "llama3-405b", "--gpus", "1,2"])
    assert none.exit_code == 3 and "infeasible" in none.output


def test_cli_plot_to_an_unwritable_path_is_one_line(tmp_path):
    """--plot into a missing folder: refused before the sweep (was FileNotFoundError from savefig after it,
    an "internal error")."""
    pytest.importorskip("matplotlib")
    args = ["scale", "--model", "llama3-8b", "--gpus", "8", "--global-batch-size", "8", "--seq-len", "1024"]
    bad = CliRunner().invoke(cli, args + ["--plot", str(tmp_path / "no" / "s.png")])
    assert bad.exit_code == 2 and "cannot write plot" in bad.output and "does not exist" in bad.output, bad.output


@pytest.mark.parametrize(("job", "gpus"), [(["--global-batch-size", "8", "--seq-len", "1024"], 16),
                                          (["--global-batch-size", "64", "--cpu-offload-layers", "60"], 32)],
                         ids=["plain", "knob"])
def test_no_size_with_a_plan_names_the_smallest_cluster(job: list[str], gpus: int) -> None:
    """Every size infeasible (memory): the largest says where plans start, the hint `search` gives (the sweep
    itself skips that probe per size), with the user's knobs as search prices them (Megatron's CPU offloading of 60
    layers: 16 GPUs have no plan at global batch 64; a knob-less probe said 16)."""
    args = ["--model", "llama3-70b", "--gpus", "8", *job]
    res = CliRunner().invoke(cli, ["scale", *args])
    searched = CliRunner().invoke(cli, ["search", *args])
    assert res.exit_code == 3 and searched.exit_code == 3
    assert f"smallest h100-sxm cluster with a plan: {gpus} GPUs" in res.output
    assert f"smallest h100-sxm cluster with a plan: {gpus} GPUs" in searched.output


def test_price_without_train_tokens_is_refused():
    """--gpu-hour-price alone printed no cost and said nothing (the cost is GPU-hours to train x price)."""
    res = CliRunner().invoke(cli, ["scale", "--model", "llama3-8b", "--gpus", "8", "--global-batch-size", "8",
                                   "--seq-len", "1024", "--gpu-hour-price", "2"])
    assert res.exit_code == 2, res.output
    assert "gpu_hour_price=2 prices the GPU-hours to train, which need train_tokens" in res.output
    with pytest.raises(UserInputError, match="need train_tokens"):
        api.scale({"model": "llama3-8b", "gpus": [8], "gpu_hour_price": 2.0})


def test_scale_takes_every_cluster_field_of_search():
    """``scale``'s cluster shape has every field of a search's cluster but its size (``--memory-headroom`` was
    dropped: scale ranked plans against the default 5% headroom whatever was asked)."""
    from autoplan.capacity import ClusterShape
    from autoplan.request import ClusterRequest

    assert set(ClusterShape.model_fields) == set(ClusterRequest.model_fields) - {"num_gpus"}
    job = ["--global-batch-size", "64", "--seq-len", "2048", "--format", "json", "--memory-headroom", "40GiB"]
    runner = CliRunner()
    swept = runner.invoke(cli, ["scale", "--model", "llama3-8b", "--gpus", "8", *job])
    alone = runner.invoke(cli, ["search", "--model", "llama3-8b", "--gpus", "8", "--top", "1", *job])
    assert swept.exit_code == alone.exit_code == 0, swept.output + alone.output
    row, best = json.loads(swept.stdout)["rows"][0], json.loads(alone.stdout)["plans"][0]
    assert row["plan"]["parallel"] == best["parallel"]
    assert row["plan"]["prediction"]["memory_limit_gib"] == best["prediction"]["memory_limit_gib"]
    assert best["prediction"]["memory_limit_gib"] == pytest.approx(80 - 40, abs=0.5)  # HBM less the headroom


def test_tokens_per_gpu_and_a_global_batch_are_one_or_the_other():
    """``tokens_per_gpu`` sets the batch at each size: a global batch given with it was silently dropped."""
    base = {"model": "llama3-8b", "gpus": [8, 16], "tokens_per_gpu": 16384}
    with pytest.raises(UserInputError, match="global_batch_size=512 would be ignored"):
        api.Engine().scale({**base, "job": {"global_batch_size": 512, "seq_len": 2048}})
    rows = api.Engine().scale({**base, "job": {"seq_len": 2048}}).rows
    assert [r.global_batch_size for r in rows] == [n * 16384 // 2048 for n in (8, 16)]
    args = ["scale", "--model", "llama3-8b", "--gpus", "8,16", "--seq-len", "2048", "--tokens-per-gpu", "16384"]
    refused = CliRunner().invoke(cli, [*args, "--global-batch-size", "512"])
    assert refused.exit_code == 2 and "would be ignored" in refused.stderr, refused.output
    assert CliRunner().invoke(cli, args).exit_code == 0


def test_the_table_shows_each_rows_notes():
    """The JSON carries each plan's notes (``rows[i].plan.prediction.notes``); the table showed none. Each distinct
    note is shown once, with the sizes whose plans carry it ('every size' when all do)."""
    from autoplan.capacity import ScaleResult
    from autoplan.cli.scale_cmd import render_scale

    args = ["scale", "--model", "nemotron4-15b", "--gpus", "8,16", "--global-batch-size", "64", "--seq-len", "2048",
            "--target", "torchtitan"]
    table = CliRunner().invoke(cli, args)
    data = json.loads(CliRunner().invoke(cli, args + ["--format", "json"]).stdout)
    assert table.exit_code == 0, table.output
    notes = [r["plan"]["prediction"]["notes"] for r in data["rows"]]
    assert notes[0] and notes[0] == notes[1]  # torchtitan ships no nemotron flavor: priced, with a note
    for note in notes[0]:
        assert f"  note (every size): {note}" in table.output.splitlines()
    result = ScaleResult.model_validate(data)
    rows = [r.model_copy(update={"plan": r.plan.model_copy(update={"prediction": r.plan.prediction.model_copy(
        update={"notes": [*r.plan.prediction.notes, f"only at {r.num_gpus}"]})})}) for r in result.rows]
    lines = render_scale(result.model_copy(update={"rows": rows})).splitlines()
    assert "  note (8 GPUs): only at 8" in lines and "  note (16 GPUs): only at 16" in lines
    assert sum(line.startswith("  note (every size)") for line in lines) == len(notes[0])
