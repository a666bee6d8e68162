"""The `autoplan` command. Thin click commands; each lives in its own module and registers here."""

from __future__ import annotations

from typing import IO, Any

import click

from autoplan import __version__


class _OneLineUsageError(click.UsageError):
    """A usage error as one line on stderr (``Error: ... (see 'autoplan CMD --help')``), exit 2."""

    def __init__(self, err: click.UsageError) -> None:
        super().__init__(err.format_message(), err.ctx)

    def show(self, file: IO[Any] | None = None) -> None:
        where = f" (see '{self.ctx.command_path} --help')" if self.ctx is not None else ""
        click.echo(f"Error: {' '.join(self.format_message().split())}{where}", err=True, file=file)


class _Group(click.Group):
    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except click.UsageError as err:
            raise _OneLineUsageError(err) from None


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
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
    from autoplan.cli import compare_cmd, scale_cmd, serve_cmd  # noqa: F401


_register()


def main() -> None:
    cli(prog_name="autoplan")
