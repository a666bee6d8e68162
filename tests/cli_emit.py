"""Emit through the CLI and read the Megatron arguments back: shared by the tests of Megatron knobs."""

from __future__ import annotations

import argparse
from pathlib import Path

from click.testing import CliRunner


def emitted_megatron_args(args: list[str], tmp_path: Path) -> argparse.Namespace:
    """``autoplan emit <args> -o tmp_path/emit`` (the args name ``--target megatron``), exit 0, and its
    ``megatron_args.txt`` parsed with Megatron's flags (``parse_megatron_args``)."""
    from autoplan.cli import cli
    from autoplan.emit.megatron import parse_megatron_args

    out = tmp_path / "emit"
    res = CliRunner().invoke(cli, ["emit", *args, "-o", str(out)])
    assert res.exit_code == 0, res.output
    return parse_megatron_args((out / "megatron_args.txt").read_text().split())
