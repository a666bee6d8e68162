"""`autoplan schema`: the JSON Schema of requests and responses."""

from __future__ import annotations

import json

import click

from autoplan.cli import cli
from autoplan.schema import SCHEMA_PARTS, json_schema, schema_for

PARTS = ("all", *SCHEMA_PARTS)


@cli.command("schema")
@click.argument("part", type=click.Choice(PARTS), default="all")
def schema_cmd(part: str) -> None:
    """Print the JSON Schema of requests and responses (PART: one of them, standalone)."""
    doc = json_schema() if part == "all" else schema_for(part)
    click.echo(json.dumps(doc, indent=2))
