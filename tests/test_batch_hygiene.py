"""Issue 14's batch reproductions: special-file outputs, lines that used to stop a batch, process hygiene."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from autoplan.batch.local import crashed
from autoplan.batch.reader import Line
from autoplan.cli import cli

ROOT = Path(__file__).resolve().parents[1]
OK = '{"id": "a", "kind": "estimate", "model": "llama3-8b", "cluster": {"num_gpus": 8}, "parallel": {"tp": 8}}'


def _batch(tmp_path: Path, text: str, *args: str) -> tuple[int, list[dict], str]:
    src = tmp_path / "in.jsonl"
    src.write_text(text)
    r = CliRunner().invoke(cli, ["batch", str(src), *args])
    out = r.stdout if "-o" not in args else ""
    return r.exit_code, [json.loads(x) for x in out.splitlines() if x.strip()], r.stderr


def test_lines_that_used_to_stop_a_batch(tmp_path: Path) -> None:
    dup = '{"id": "%s", "model": "llama3-8b", "cluster": {"num_gpus": 8, "inter_node_gbps": 1e400}}'
    text = "\n".join([OK, '{"id": "\\ud800", "model": "llama3-8b", "cluster": {"num_gpus": 8}}',
                      dup % "d1", dup % "d2", '{"id": "x", "model": ', OK.replace('"a"', '"b"')]) + "\n"
    code, lines, err = _batch(tmp_path, text)
    assert code == 0, err
    assert [x["status"] for x in lines] == ["ok", "invalid", "invalid", "invalid", "invalid", "ok"]
    assert [x["id"] for x in lines] == ["a", None, "d1", "d2", None, "b"]
    assert "surrogate" in lines[1]["message"] and "1e400 is out of range" in lines[2]["message"]
    assert lines[4]["message"] == "not valid JSON: Expecting value (character 23)"


def test_output_to_a_pipe_is_streamed_not_replaced(tmp_path: Path) -> None:
    fifo = tmp_path / "out.fifo"
    os.mkfifo(fifo)
    got: list[bytes] = []
    reader = threading.Thread(target=lambda: got.append(fifo.read_bytes()))
    reader.start()
    code, _, err = _batch(tmp_path, OK + "\n", "-o", str(fifo))
    reader.join(30)
    assert code == 0, err
    assert fifo.is_fifo()  # still the pipe, not a regular file put in its place
    assert json.loads(got[0])["status"] == "ok"


@pytest.mark.skipif(os.geteuid() != 0, reason="mknod of a character device needs root")
def test_output_to_a_device_is_not_replaced(tmp_path: Path) -> None:
    null = tmp_path / "null"
    os.mknod(null, 0o666 | 0o020000, os.makedev(1, 3))
    code, _, err = _batch(tmp_path, OK + "\n", "-o", str(null))
    assert code == 0, err
    assert null.is_char_device()


def test_unwritable_output_is_refused_before_the_work(tmp_path: Path) -> None:
    code, _, err = _batch(tmp_path, OK + "\n", "-o", str(tmp_path / "nope" / "x.jsonl"))
    assert code == 2 and err.strip().endswith("does not exist") and len(err.strip().splitlines()) == 1


def test_output_is_replaced_only_on_success(tmp_path: Path) -> None:
    out = tmp_path / "out.jsonl"
    out.write_text("previous\n")
    code, _, _ = _batch(tmp_path, OK + "\n", "-o", str(out))
    assert code == 0 and json.loads(out.read_text())["id"] == "a"
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


def test_a_line_rerun_after_a_crash_keeps_its_id() -> None:
    _, status, text = crashed(Line(7, OK), "worker killed")
    assert status == "error" and json.loads(text)["id"] == "a" and json.loads(text)["line"] == 7


def _slow_batch(tmp_path: Path) -> subprocess.Popen[bytes]:
    src = tmp_path / "slow.jsonl"
    src.write_text("".join(json.dumps({"id": f"s{i}", "model": "deepseek-v3", "cluster": {"num_gpus": 1024 * i}})
                           + "\n" for i in range(1, 40)))
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.Popen([sys.executable, "-m", "autoplan", "batch", str(src), "-o", str(tmp_path / "o.jsonl"),
                             "--workers", "2"], env=env, stderr=subprocess.PIPE)


def _workers(pid: int, wait_s: float = 60) -> list[int]:
    deadline = time.time() + wait_s
    while time.time() < deadline:
        kids = [int(x) for x in subprocess.run(["ps", "-o", "pid=", "--ppid", str(pid)], capture_output=True,
                                               text=True).stdout.split()]
        if len(kids) >= 2:
            return kids
        time.sleep(0.2)
    raise AssertionError("no pool workers started")


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM])
def test_killing_batch_stops_its_workers_and_leaves_no_files(tmp_path: Path, sig: int) -> None:
    proc = _slow_batch(tmp_path)
    try:
        kids = _workers(proc.pid)
        time.sleep(1.0)
        proc.send_signal(sig)
        proc.wait(30)
        deadline = time.time() + 10
        while time.time() < deadline and any(Path(f"/proc/{k}").exists() for k in kids):
            time.sleep(0.2)
        alive = [k for k in kids if Path(f"/proc/{k}").exists()
                 and "zombie" not in Path(f"/proc/{k}/status").read_text().lower()]
        assert alive == []
        assert sorted(p.name for p in tmp_path.iterdir()) == ["slow.jsonl"]
    finally:
        if proc.poll() is None:
            proc.kill()
