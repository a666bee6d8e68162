"""`autoplan batch`: answer a JSONL file of search/estimate requests, one output line per input line."""

from __future__ import annotations

import sys
from typing import IO

import click

from autoplan.batch import BatchRun, Limits, Progress, describe_summary, read_lines
from autoplan.cli import cli
from autoplan.cli.options import user_errors
from autoplan.outputs import output_target

DEFAULTS = Limits()


@cli.command("batch")
@click.argument("requests", type=click.File("rb"))
@click.option("-o", "--output", "--out", "output", default="-", help="results JSONL [stdout]; a file is replaced only when the batch "
              "completes, a pipe or device is written in place")
@click.option("--workers", type=click.IntRange(1, 1024), default=1, show_default=True,
              help="worker processes (local) or actors (ray)")
@click.option("--backend", type=click.Choice(["local", "ray"]), default="local", show_default=True)
@click.option("--address", default=None, help="Ray cluster address for --backend ray (e.g. auto, ray://head:10001)")
@click.option("--files/--no-files", "allow_files", default=True, show_default=True,
              help="allow requests to name files (model paths, cluster profiles)")
@click.option("--max-lines", type=click.IntRange(1), default=DEFAULTS.max_lines, show_default=True)
@click.option("--max-line-bytes", type=click.IntRange(1), default=DEFAULTS.max_line_bytes, show_default=True,
              help="longest request line")
@click.option("--max-bytes", type=click.IntRange(1), default=DEFAULTS.max_total_bytes, show_default=True,
              help="largest input")
@click.option("--progress/--no-progress", default=None, help="progress bar on stderr [on a terminal]")
@user_errors
def batch_cmd(requests: IO[bytes], output: str, workers: int, backend: str, address: str | None,
              allow_files: bool, max_lines: int, max_line_bytes: int, max_bytes: int,
              progress: bool | None) -> None:
    """Plan every request of REQUESTS (JSONL; '-' for stdin) and write one result line per request.

    Each line is a request as `autoplan schema` describes it, with an `id`: {"id": "job-1", "kind":
    "search" | "estimate", "model": ..., "cluster": {...}, "job": {...}, "parallel": {...}}; a line reusing an
    earlier line's id is answered invalid. Each output
    line has the same `id`, its `line` number, a `status` (ok | infeasible | invalid | error) and the
    `result` or a `message`, in input order. A bad line never stops the batch."""
    target = output_target(output)
    name = getattr(requests, "name", "input")
    lines = read_lines(requests, Limits(max_line_bytes, max_lines, max_bytes), name=str(name))
    bar = Progress(len(lines), sys.stderr, enabled=progress)
    run = BatchRun(lines, workers=workers, backend=backend, address=address,  # type: ignore[arg-type]
                   allow_files=allow_files, on_answer=bar)
    try:
        with target.open() as out:
            for _, _, text in run.answers():
                out.write(text + "\n")
    finally:
        bar.close()
    click.echo(describe_summary(run.summary()), err=True)
