"""--recompute-modules on every command that takes a layout: one option definition (``parallel_options``), one
check of the names (``cost_models.specs.recompute_module_names_error``, which a request's field goes through too),
so a bad name reads the same on search, estimate, emit and scale, and scale pins the modules as search does."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from autoplan.cli import cli
from cost_models.specs import RECOMPUTE_MODULES

LAYOUT = {"search": [], "scale": [], "estimate": ["--tp", "1", "--pp", "1"], "emit": ["--tp", "1", "--pp", "1"]}


def _invoke(*args: str) -> tuple[int, str]:
    r = CliRunner().invoke(cli, list(args))
    return r.exit_code, r.output


@pytest.mark.parametrize("modules,named", [("foo", "'foo'"), ("core_atn,mlp", "'core_atn'"), ("mlp mlp", "'mlp'")])
def test_a_bad_module_name_reads_the_same_on_every_command(modules: str, named: str, tmp_path: Path) -> None:
    seen = {}
    for cmd, layout in LAYOUT.items():
        extra = ["--out", str(tmp_path / "emit")] if cmd == "emit" else []
        code, out = _invoke(cmd, "--model", "llama3-8b", "--gpus", "8", *layout, *extra, "--recompute-modules", modules)
        assert code == 2, (cmd, out)
        assert "Traceback" not in out and "Input should be" not in out
        line = [ln for ln in out.splitlines() if ln.startswith("Error:")][0]
        seen[cmd] = line.split(" (see '")[0]  # the hint names the command
        assert named in line
    assert len(set(seen.values())) == 1, seen
    line = next(iter(seen.values()))
    assert "--recompute-modules" in line
    if modules != "mlp mlp":  # a wrong name: every module named, and the nearest where there is one
        assert f"valid: {', '.join(RECOMPUTE_MODULES)}" in line
        assert ("nearest: core_attn" in line) == (modules == "core_atn,mlp")
    else:
        assert "given twice" in line


@pytest.mark.parametrize("cmd", ["search", "estimate"])
def test_a_request_file_says_the_flag_s_reason(cmd: str, tmp_path: Path) -> None:
    req = tmp_path / "req.json"
    req.write_text(json.dumps({"model": "llama3-8b", "cluster": {"gpu": "h100-sxm", "num_gpus": 8},
                               "parallel": {"tp": 1, "pp": 1, "recompute_modules": ["foo"]}}))
    code, out = _invoke(cmd, "--request", str(req))
    _, flag = _invoke(cmd, "--model", "llama3-8b", "--gpus", "8", *LAYOUT[cmd], "--recompute-modules", "foo")
    reason = flag.split("--recompute-modules': ", 1)[1].split(" (see ")[0]
    assert code == 2 and reason in out and "Input should be" not in out


def test_scale_pins_the_modules_as_its_request_does(tmp_path: Path) -> None:
    code, out = _invoke("scale", "--model", "llama3-8b", "--gpus", "8", "--processes", "1", "--format", "json",
                        "--recompute-modules", "mlp,core_attn")
    assert code == 0, out
    rows = json.loads(out)["rows"]
    assert [r["plan"]["parallel"]["recompute_modules"] for r in rows] == [["core_attn", "mlp"]]
    assert rows[0]["plan"]["parallel"]["recompute"] == "selective"
    req = tmp_path / "scale.json"
    req.write_text(json.dumps({"model": "llama3-8b", "gpus": [8], "parallel": {"recompute_modules": ["mlp", "core_attn"]}}))
    code2, out2 = _invoke("scale", "--request", str(req), "--format", "json")
    assert code2 == 0, out2
    assert json.loads(out2)["rows"][0]["plan"] == rows[0]["plan"]
