"""`sparkctl cluster ...`: plan (offline), status, bootstrap, down."""

from __future__ import annotations

import sys

import click

from sparkctl.cli.plan_view import render_plan_text
from sparkctl.cli.run_options import Views, build_request, run_options
from sparkctl.engine.task import TaskFailed
from sparkctl.errors import SparkctlError
from sparkctl.exitcodes import ExitStatus
from sparkctl.inventory import load_inventory
from sparkctl.plan import plan_cluster
from sparkctl.playbooks import bootstrap_graph, down_graph
from sparkctl.session import run_playbook
from sparkctl.tasks.model import gated_repos_failed, hf_token, provide_token


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
    if ask_for_gated_token(inventory, result):
        with Views("bootstrap", params) as bus:
            result = run_playbook(inventory, bootstrap_graph(), request, bus)
    sys.exit(int(result.exit_status()))


def stdin_is_terminal() -> bool:
    return sys.stdin.isatty()


def ask_for_gated_token(inventory, result) -> bool:
    """A download refused as gated, no token anywhere, a person at a terminal: ask once (hidden), then the
    caller runs again (it converges: only the refused downloads and what needs them are left).

    Whether a repo is gated is known only once the Hub refuses it, so the prompt follows that refusal rather
    than asking on every run. Without a terminal (CI) the failure and its hint stand.
    """
    repos = gated_repos_failed(result.outcomes)
    if not repos or result.check_mode or not stdin_is_terminal():
        return False
    try:
        if hf_token(inventory) is not None:
            return False  # a token is set but cannot see the repo: typing it again would not help
    except TaskFailed:
        return False
    env = inventory.serve.hf_token_env
    click.echo(f"\n{', '.join(repos)} {'is' if len(repos) == 1 else 'are'} gated and neither ${env} nor "
               f"${env}_FILE holds a token (accept the license on huggingface.co first).", err=True)
    token = click.prompt("Hugging Face token (hidden, empty to stop)", hide_input=True, default="",
                         show_default=False, err=True).strip()
    if not token:
        return False
    provide_token(env, token)
    click.echo("running bootstrap again with the token", err=True)
    return True


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
