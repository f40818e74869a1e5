"""`sparkctl lab ...`: a lab of simulated DGX Sparks on this machine (needs root)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import click

from sparkctl.cli.report import json_option, print_table, report_line, verbose_option
from sparkctl.errors import BadInput
from sparkctl.exitcodes import ExitStatus
from sparkctl.lab.renderer import DEFAULT_RENDERER, RENDERERS

DEFAULT_DIR = ".sparkctl-lab"
dir_option = click.option("--dir", "directory", default=DEFAULT_DIR, show_default=True,
                          type=click.Path(file_okay=False), help="State, keys, inventory.")


def _load(directory: str):
    from sparkctl.lab.deps import check_machine
    from sparkctl.lab.lab import Lab

    check_machine(need_packages=False)
    return Lab.load(directory)


def _node_of(lookup, node: str):
    """lookup(node), a node the lab does not have being bad input."""
    try:
        return lookup(node)
    except KeyError as exc:
        raise BadInput(str(exc.args[0])) from None


@click.group("lab")
def lab_group() -> None:
    """A lab of simulated DGX Sparks on this machine: namespaces, systemd, sshd, podman."""


@lab_group.command("up")
@click.option("--nodes", default=2, show_default=True, type=click.IntRange(1, 64))
@click.option("--topology", default="pair", show_default=True,
              type=click.Choice(["single", "pair", "ring", "switch"]))
@click.option("--port", default=1, show_default=True, type=click.IntRange(0, 1),
              help="The QSFP port cabled (pair, switch).")
@click.option("--ring-order", metavar="N,N,...",
              help="Cable the ring in this order of node numbers (e.g. 1,3,2) instead of the inventory's: "
                   "a miscabled lab; the inventory still lists spark1..N.")
@dir_option
@click.option("--sudo-password", is_flag=True,
              help="nvidia's sudo asks for a password (written to DIR/sudo-password).")
@click.option("--renderer", default=DEFAULT_RENDERER, show_default=True, type=click.Choice(RENDERERS),
              help="What renders netplan on the nodes: NetworkManager, as DGX OS ships "
                   "(01-network-manager-all.yaml), or systemd-networkd.")
@click.option("--install-deps", is_flag=True, help="apt-get install the packages the lab needs first.")
@click.option("--serve", "serve_preset", metavar="PRESET",
              help="Also serve this preset (e.g. qwen3-235b-eagle3, llama-3.3-70b-vllm, "
                   "llama-3.3-70b-sglang-eagle3) through the lab's stand-in for its engine.")
def up_command(nodes: int, topology: str, port: int, ring_order: str | None, directory: str, sudo_password: bool,
               renderer: str, install_deps: bool, serve_preset: str | None) -> None:
    """Bring a lab up and write DIR/inventory.yaml for `sparkctl cluster bootstrap`."""
    from sparkctl.inventory.presets import get_preset, preset_names
    from sparkctl.lab.deps import check_machine, install_packages
    from sparkctl.lab.lab import Lab

    try:
        engine = get_preset(serve_preset).engine if serve_preset else "trtllm"
    except KeyError as exc:
        raise BadInput(f"--serve: {exc.args[0]}", hint=f"one of: {', '.join(preset_names())}") from exc

    if install_deps:
        check_machine(need_packages=False)
        install_packages(log=lambda m: click.echo(m, err=True))
    check_machine()
    lab = Lab.up(directory, nodes=nodes, topology=topology, port=port, sudo_password=sudo_password,
                 ring_order=ring_order, renderer=renderer, log=lambda m: click.echo(m, err=True))
    if serve_preset:
        from sparkctl.lab.inventory_writer import add_serve_section

        add_serve_section(Path(lab.inventory_path), serve_preset, engine)
    _print_nodes(lab.status())
    click.echo(f"inventory: {lab.inventory_path}")
    token = "HF_TOKEN=<any value: the lab's gated repos take any token> " if serve_preset else ""
    click.echo(f"next: {token}sparkctl cluster bootstrap {lab.inventory_path}")


@lab_group.command("down")
@dir_option
def down_command(directory: str) -> None:
    """Tear the lab down: namespaces, links, processes, cgroups (also a half-built one)."""
    lab = _load(directory)
    leftovers = lab.down(log=lambda m: click.echo(m, err=True))
    if leftovers:
        for item in leftovers:
            click.echo(f"left behind: {item}", err=True)
        sys.exit(int(ExitStatus.TASK_FAILED))
    click.echo(f"lab {lab.names.lab_id} is down")


@lab_group.command("reboot")
@dir_option
@click.argument("node")
@click.option("--hard", is_flag=True, help="A power cut: every process killed at once, no shutdown.")
@json_option
@verbose_option
def reboot_command(directory: str, node: str, hard: bool, as_json: bool, verbose: int) -> None:
    """Reboot NODE: its disk is kept (/etc, /home, /var/lib, the containers), /run, /tmp and its addresses are
    lost, and it boots again through its systemd (netplan, docker, sshd as at any boot)."""
    lab = _load(directory)
    _node_of(lab.state.node, node)
    seconds = lab.reboot(node, hard=hard, log=lambda m: click.echo(m, err=True))
    if as_json:
        report_line("lab reboot", ExitStatus.SUCCESS, node=node, hard=hard, seconds=round(seconds, 2))
        return
    click.echo(f"{node} is up again after {seconds:.1f}s ({'power cut' if hard else 'reboot'})")


@lab_group.command("status")
@dir_option
@json_option
@verbose_option
def status_command(directory: str, as_json: bool, verbose: int) -> None:
    """Each node: management IP, PID 1, which init runs, fabric interfaces Up."""
    lab = _load(directory)
    rows = lab.status()
    if as_json:
        report_line("lab status", ExitStatus.SUCCESS, lab=lab.names.lab_id, topology=lab.state.topology,
                    port=lab.state.port, ring_order=lab.state.ring_order, renderer=lab.state.renderer,
                    phase=lab.state.phase, nodes=rows)
        return
    cabled = f", cabled in order {','.join(map(str, lab.state.ring_order))}" if lab.state.ring_order else ""
    click.echo(f"lab {lab.names.lab_id} ({lab.state.topology}, port {lab.state.port}{cabled}, netplan rendered by "
               f"{lab.state.renderer}): {lab.state.phase}")
    _print_nodes(rows)


@lab_group.command("exec", context_settings={"ignore_unknown_options": True})
@dir_option
@click.argument("node")
@click.argument("command", nargs=-1, required=True, type=click.UNPROCESSED)
def exec_command(directory: str, node: str, command: tuple[str, ...]) -> None:
    """Run COMMAND as root on NODE (`sparkctl lab exec spark1 -- ip -br addr`); its exit code is ours."""
    from sparkctl.lab.node import exec_argv

    lab = _load(directory)
    pid = _node_of(lab.pid_of, node)
    # inherit the terminal: interactive commands work, output streams
    env = dict(os.environ, NODE_CGROUP_PROCS=" ".join(map(str, lab.cgroup_procs_files(node))))
    argv = exec_argv(pid, list(command), lab.cgroup_procs_files(node))
    os.execvpe(argv[0], argv, env)


@lab_group.command("ssh")
@dir_option
@click.argument("node")
@click.argument("command", nargs=-1, type=click.UNPROCESSED)
def ssh_command(directory: str, node: str, command: tuple[str, ...]) -> None:
    """ssh to NODE as nvidia with the lab key; the host key is verified."""
    lab = _load(directory)
    argv = _node_of(lambda name: lab.ssh_argv(name, *command), node)
    os.execvp(argv[0], argv)


@lab_group.command("image")
@click.option("--rebuild", is_flag=True, help="Build even when the cached image matches its recipe.")
def image_command(rebuild: bool) -> None:
    """Build (or reuse) the lab's container image in the shared image store."""
    from sparkctl.lab.deps import check_machine
    from sparkctl.lab.image import ensure_image

    check_machine()
    ref = ensure_image(rebuild=rebuild, log=lambda m: click.echo(m, err=True))
    click.echo(ref)


def _print_nodes(rows: list[dict]) -> None:
    print_table(None, ("node", "management IP", "PID 1", "init", "state", "fabric Up"),
                [(row["node"], row["mgmt_ip"], str(row["pid"] or "-"), row["init"], row["system"],
                  ", ".join(row["fabric_up"]) or "-") for row in rows])
