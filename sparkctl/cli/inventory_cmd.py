"""`sparkctl inventory ...`: validate, schema."""

from __future__ import annotations

import json

import click

from sparkctl.inventory import inventory_json_schema, load_inventory


@click.group("inventory")
def inventory_group() -> None:
    """Check and describe inventory files."""


@inventory_group.command("validate")
@click.argument("file", type=click.Path(dir_okay=False))
def validate(file: str) -> None:
    """Check FILE and report every problem at once (file:line: field: what, and what to do)."""
    inv = load_inventory(file)
    click.echo(
        f"{file}: ok — cluster {inv.cluster.name}, {len(inv.nodes)} node(s), topology {inv.topology}, "
        f"head {inv.head.name}, tp_size {inv.tp_size}"
    )


@inventory_group.command("schema")
def schema() -> None:
    """Print the inventory's JSON Schema (for editors and CI linters)."""
    click.echo(json.dumps(inventory_json_schema(), indent=2))
