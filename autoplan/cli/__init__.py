"""The `autoplan` command. Thin click commands; each lives in its own module and registers here."""

from __future__ import annotations

import importlib
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


# Command → the module that defines it (with @cli.command). Modules are imported when their command is looked
# up, so `autoplan search` does not pay for calibrate's or batch's imports (tests/test_search_cli.py checks the map).
COMMAND_MODULES = {
    "batch": "batch_cmd", "calibrate": "calibrate_cmd", "compare": "compare_cmd", "emit": "emit_cmd",
    "estimate": "estimate_cmd", "hardware": "catalog_cmd", "models": "catalog_cmd", "scale": "scale_cmd",
    "schema": "schema_cmd", "search": "search_cmd", "serve": "serve_cmd", "validate": "emit_cmd",
}


class _Group(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(set(super().list_commands(ctx)) | set(COMMAND_MODULES))

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in self.commands and cmd_name in COMMAND_MODULES:
            importlib.import_module(f"autoplan.cli.{COMMAND_MODULES[cmd_name]}")
        return super().get_command(ctx, cmd_name)

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except click.UsageError as err:
            raise _OneLineUsageError(err) from None


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(__version__, prog_name="autoplan")
def cli() -> None:
    """Find the fastest way to train a model on a cluster, and emit configs that launch."""


def main() -> None:
    cli(prog_name="autoplan")
