"""`sparkctl inventory ...`: validate, schema, init."""

from __future__ import annotations

import json
import os

import click

from sparkctl.cli.options import load
from sparkctl.cli.placement_view import placement_data, placement_lines
from sparkctl.cli.report import STDOUT, json_option, output_file, report_line, verbose_option
from sparkctl.errors import BadInput
from sparkctl.exitcodes import ExitStatus
from sparkctl.inventory import inventory_json_schema
from sparkctl.runs.inventory_init import draft_inventory
from sparkctl.runs.outputs import check_writable


@click.group("inventory")
def inventory_group() -> None:
    """Check and describe inventory files."""


@inventory_group.command("validate")
@click.argument("file", type=click.Path())
@json_option
@verbose_option
def validate(file: str, as_json: bool, verbose: int) -> None:
    """Check FILE and report every problem at once (file:line: field: what, and what to do)."""
    inv = load(file, warn=not as_json)
    several = len(inv.serve.models or []) > 1
    if as_json:
        extra = {"models": [placement_data(m) for m in inv.served_models()]} if several else {}
        report_line("inventory validate", ExitStatus.SUCCESS, file=file, cluster=inv.cluster.name,
                    nodes=[n.name for n in inv.nodes], topology=inv.topology, head=inv.head.name,
                    tp_size=None if several else inv.tp_size, warnings=list(inv.warnings), **extra)
        return
    sizes = "" if several else f", tp_size {inv.tp_size}"
    click.echo(
        f"{file}: ok — cluster {inv.cluster.name}, {len(inv.nodes)} node(s), topology {inv.topology}, "
        f"head {inv.head.name}{sizes}"
    )
    if several:
        for line in placement_lines(inv.served_models()):
            click.echo(f"  {line}")


@inventory_group.command("schema")
def schema() -> None:
    """Print the inventory's JSON Schema (for editors and CI linters)."""
    click.echo(json.dumps(inventory_json_schema(), indent=2))


@inventory_group.command("init")
@click.argument("hosts", nargs=-1, required=True)
@click.option("-o", "--output", default="inventory.yaml", show_default=True, type=click.Path(dir_okay=False),
              help="Where to write it ('-': stdout).")
@click.option("--user", help="SSH user (default: from ~/.ssh/config, else your login name).")
@click.option("--identity-file", type=click.Path(dir_okay=False), help="SSH private key to use.")
@click.option("--known-hosts", default="~/.ssh/known_hosts", show_default=True,
              help="known_hosts used to verify the nodes (first contact is recorded).")
@click.option("--name", "cluster", default="sparks", show_default=True, help="Cluster name.")
@click.option("--force", is_flag=True, help="Overwrite the output file.")
@json_option
@verbose_option
def init(hosts: tuple[str, ...], output: str, user: str | None, identity_file: str | None, known_hosts: str,
         cluster: str, force: bool, as_json: bool, verbose: int) -> None:
    """Connect to HOSTS (management addresses, head first), detect the user, Up ports and topology, and write
    a commented inventory. What had to be assumed is printed and written as comments. A host key is recorded in
    --known-hosts only once the login to that host worked."""
    if output == STDOUT and as_json:
        raise BadInput("-o - and --json both want stdout", hint="write the inventory to a file with -o FILE")
    if output != STDOUT:
        if os.path.exists(output) and not force:
            raise BadInput(f"{output} exists", hint="pass --force to overwrite it, or -o another file")
        check_writable(output, "--output")
    known = os.path.expanduser(known_hosts)
    if os.path.dirname(known) != os.path.expanduser("~/.ssh"):
        check_writable(known, "--known-hosts")  # its folder is never created (a typo would pass unseen)
    result = draft_inventory(list(hosts), user=user, identity_file=identity_file, known_hosts=known_hosts,
                             cluster=cluster)
    with output_file(output, "--output") as fh:
        fh.write(result.text)
    if as_json:
        report_line("inventory init", ExitStatus.SUCCESS, output=output, assumptions=result.assumptions,
                    seen_with_lldp=result.seen)
        return
    for line in result.seen:
        click.echo(f"seen with LLDP: {line}", err=True)
    for line in result.assumptions:
        click.echo(f"assumed: {line}", err=True)
    if output != STDOUT:
        click.echo(f"wrote {output}: check it, then `sparkctl cluster bootstrap {output}`")
