"""The `autoplan` command. Thin click commands; each lives in its own module and registers here."""

from __future__ import annotations

import click

from autoplan import __version__


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(__version__, prog_name="autoplan")
def cli() -> None:
    """Find the fastest way to train a model on a cluster, and emit configs that launch."""


def _register() -> None:
    # One import per command module; each module defines commands decorated with @cli.command().
    from autoplan.cli import estimate_cmd  # noqa: F401
    from autoplan.cli import catalog_cmd  # noqa: F401
    from autoplan.cli import batch_cmd, schema_cmd  # noqa: F401
    from autoplan.cli import search_cmd  # noqa: F401
    from autoplan.cli import calibrate_cmd  # noqa: F401
    from autoplan.cli import emit_cmd  # noqa: F401


_register()


def main() -> None:
    cli(prog_name="autoplan")
