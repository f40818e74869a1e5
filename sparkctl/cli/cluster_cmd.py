"""`sparkctl cluster ...`: plan (offline), status, bootstrap, down."""

from __future__ import annotations

import sys

import click

from sparkctl.cli.plan_view import render_plan_text
from sparkctl.cli.run_options import Views, build_request, run_options
from sparkctl.errors import SparkctlError
from sparkctl.exitcodes import ExitStatus
from sparkctl.inventory import load_inventory
from sparkctl.plan import plan_cluster
from sparkctl.playbooks import bootstrap_graph, down_graph
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


@cluster_group.command("status")
@click.argument("file", type=click.Path(dir_okay=False))
@click.option("--limit", metavar="NODE[,NODE]", help="These nodes only.")
@click.option("--forks", type=click.IntRange(1, 256), default=32, show_default=True)
def status(file: str, limit: str | None, forks: int) -> None:
    """Connect, read every node's facts once, and show one row per node (exit 3 if a node is unreachable)."""
    from rich.console import Console

    from sparkctl.cli.status_view import read_container_hostfile, status_table
    from sparkctl.session import RunRequest, gather_cluster

    inventory = load_inventory(file)
    request = RunRequest(limit={n.strip() for n in limit.split(",")} if limit else None, forks=forks)
    facts, unreachable = gather_cluster(inventory, request, also=read_container_hostfile(inventory))
    try:
        cluster_plan = plan_cluster(inventory, facts)
        hashes = {n: p.container.spec_hash() for n, p in cluster_plan.nodes.items()}
        hostfile = cluster_plan.hostfile
    except SparkctlError:
        hashes, hostfile = {}, None
    # a pipe gets no terminal width: a wide table then reads better than 80 columns of ellipses
    Console(width=None if sys.stdout.isatty() else 180).print(
        status_table(inventory, facts, unreachable, hashes, hostfile))
    sys.exit(int(ExitStatus.UNREACHABLE if unreachable else ExitStatus.SUCCESS))


@cluster_group.command("down")
@click.argument("file", type=click.Path(dir_okay=False))
@click.option("--network", is_flag=True, help="Also undo the netplan changes and the ssh keys sparkctl made.")
@run_options
def down(file: str, network: bool, **params) -> None:
    """Stop and remove the containers (and with --network, restore the network and keys as they were)."""
    inventory = load_inventory(file)
    request = build_request(params)
    with Views("down", params) as bus:
        result = run_playbook(inventory, down_graph(network), request, bus)
    sys.exit(int(result.exit_status()))
