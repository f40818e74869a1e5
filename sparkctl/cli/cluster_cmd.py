"""`sparkctl cluster ...`: plan (offline), status, bootstrap, down.

Each command loads what it runs in its body: bootstrap and down start connecting to the nodes (and taking the
cluster lock) as soon as their input is checked, and the rest of sparkctl loads while the nodes answer."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

import click

from sparkctl.cli.options import build_request, csv_set, early_opening, load, run_options, run_view
from sparkctl.cli.report import json_option, print_table, report_line, verbose_option
from sparkctl.exitcodes import ExitStatus
from sparkctl.secrets import redacted
from sparkctl.taskgraph.runner import DEFAULT_FORKS

if TYPE_CHECKING:
    from sparkctl.taskgraph.graph import Graph


@click.group("cluster")
def cluster_group() -> None:
    """Bootstrap, inspect and take down a cluster of Sparks."""


@cluster_group.command("plan")
@click.argument("file", type=click.Path())
@json_option
@verbose_option
def plan(file: str, as_json: bool, verbose: int) -> None:
    """Show what bootstrap would set up, offline (no connection): phases, tasks, and per node the rendered
    netplan file, container command and env, hostfile, TensorRT-LLM config and launch line.

    Interfaces are those pinned in the inventory, else the inventory's fabric.port, else port 1's twins;
    bootstrap itself reads the cabled port from each node.
    """
    from sparkctl.cli.plan_view import plan_data, recorded_deployments, render_plan_text
    from sparkctl.plan import plan_cluster
    from sparkctl.runs.playbooks import bootstrap_graph

    inventory = load(file)
    planned = plan_cluster(inventory)
    recorded = recorded_deployments(inventory)
    if as_json:
        report_line("cluster plan", ExitStatus.SUCCESS, **plan_data(inventory, planned, bootstrap_graph(), recorded))
        return
    click.echo(redacted(render_plan_text(inventory, planned, bootstrap_graph(), recorded)), nl=False)


@cluster_group.command("bootstrap")
@click.argument("file", type=click.Path())
@run_options
def bootstrap_command(file: str, **params) -> None:
    """Set up the cluster, or repair it: rerunning changes only what drifted (a second run changes nothing)."""
    inventory = load(file)
    request = build_request(params)
    with early_opening("bootstrap", inventory, request, graph=_bootstrap_graph) as opening:
        from sparkctl.runs.rollback import bootstrap_or_roll_back

        result = bootstrap_or_roll_back(inventory, request, lambda: run_view(params), ask_for_gated_token, opening)
    sys.exit(int(result.exit_status()))


def _bootstrap_graph() -> Graph:
    from sparkctl.runs.playbooks import bootstrap_graph

    return bootstrap_graph()


def stdin_is_terminal() -> bool:
    return sys.stdin.isatty()


def ask_for_gated_token(repos: list[str], env: str) -> str | None:
    """The token for gated repos, typed (hidden) by a person at a terminal; None without one (CI: the failure
    and its hint stand)."""
    if not stdin_is_terminal():
        return None
    click.echo(f"\n{', '.join(repos)} {'is' if len(repos) == 1 else 'are'} gated and neither ${env} nor "
               f"${env}_FILE holds a token (accept the license on huggingface.co first).", err=True)
    token = click.prompt("Hugging Face token (hidden, empty to stop)", hide_input=True, default="",
                         show_default=False, err=True).strip()
    if token:
        click.echo("running bootstrap again with the token", err=True)
    return token or None


@cluster_group.command("status")
@click.argument("file", type=click.Path())
@click.option("--limit", metavar="NODE[,NODE]", help="Show these nodes only (every node is read: the plan is the "
                                                     "whole cluster's).")
@click.option("--forks", type=click.IntRange(1, 256), default=DEFAULT_FORKS, show_default=True)
@json_option
@verbose_option
def status(file: str, limit: str | None, forks: int, as_json: bool, verbose: int) -> None:
    """Connect, read every node's facts once, and show one row per node (exit 3 if a node is unreachable)."""
    from sparkctl.cli.status_view import HEADERS, bench_lines, status_cells, status_nodes
    from sparkctl.runs.status import cluster_status

    inventory = load(file)
    found = cluster_status(inventory, csv_set(limit), forks)
    nodes = status_nodes(inventory, found.facts, found.unreachable, found.spec_hashes, found.hostfile, found.shown)
    exit_status = ExitStatus.UNREACHABLE if any(not n["reachable"] for n in nodes) else ExitStatus.SUCCESS
    if as_json:
        extra = {"busy": found.busy} if found.busy else {}
        report_line("cluster status", exit_status, cluster=inventory.cluster.name, nodes=nodes,
                    fabric_bench=bench_lines(found.bench_history), **extra)
    else:
        if found.busy:
            click.echo(f"note: {found.busy} is changing the cluster now: what follows may be mid-change", err=True)
        print_table(f"cluster {inventory.cluster.name}", HEADERS, [status_cells(n) for n in nodes])
        for line in bench_lines(found.bench_history):
            click.echo(redacted(line))
    sys.exit(int(exit_status))


@cluster_group.command("down")
@click.argument("file", type=click.Path())
@click.option("--network", is_flag=True, help="Also undo the netplan changes and the ssh keys sparkctl made.")
@run_options
def down(file: str, network: bool, **params) -> None:
    """Stop and remove the containers (and with --network, restore the network and keys as they were)."""
    inventory = load(file)
    request = build_request(params)
    with early_opening("down", inventory, request, graph=lambda: _down_graph(network)) as opening:
        from sparkctl.runs.bootstrap import journaled_run

        with run_view(params) as view:
            result = journaled_run("down", inventory, _down_graph(network), request, view, opening)
    sys.exit(int(result.exit_status()))


def _down_graph(network: bool) -> Graph:
    from sparkctl.runs.playbooks import down_graph

    return down_graph(network)
