"""`sparkctl cluster ...`: plan (offline), status, bootstrap, down."""

from __future__ import annotations

import sys

import click

from sparkctl.cli.plan_view import render_plan_text
from sparkctl.cli.run_options import Views, build_request, run_options
from sparkctl.inventory import load_inventory
from sparkctl.plan import plan_cluster
from sparkctl.playbooks import bootstrap_graph
from sparkctl.session import run_playbook


@click.group("cluster")
def cluster_group() -> None:
    """Bootstrap, inspect and take down a cluster of Sparks."""


@cluster_group.command("plan")
@click.argument("file", type=click.Path(dir_okay=False))
def plan(file: str) -> None:
    """Show what bootstrap would set up, offline (no connection): phases, tasks, and per node the rendered
    netplan file, container command and env, hostfile, TensorRT-LLM config and launch line.

    Interfaces are those pinned in the inventory, else the inventory's fabric.port, else port 1's twins;
    bootstrap itself reads the cabled port from each node.
    """
    inventory = load_inventory(file)
    click.echo(render_plan_text(inventory, plan_cluster(inventory), bootstrap_graph()), nl=False)


@cluster_group.command("bootstrap")
@click.argument("file", type=click.Path(dir_okay=False))
@run_options
def bootstrap(file: str, **params) -> None:
    """Set up the cluster, or repair it: rerunning changes only what drifted (a second run changes nothing)."""
    inventory = load_inventory(file)
    request = build_request(params)
    with Views("bootstrap", params) as bus:
        result = run_playbook(inventory, bootstrap_graph(), request, bus)
    sys.exit(int(result.exit_status()))
