"""`cluster status`: one row per node from its facts."""

from __future__ import annotations

from rich.table import Table

from sparkctl.facts import Facts
from sparkctl.inventory import Inventory
from sparkctl.plan.container import SPEC_LABEL
from sparkctl.secrets import redacted


def _hostfile(facts: Facts, wanted: str | None) -> str:
    have = getattr(facts, "extra", None)
    if have is None:
        return "-"
    if have == "":
        return "missing"
    return "matches" if wanted is not None and have.split() == wanted.split() else "differs"


def _ports(facts: Facts) -> str:
    out = []
    for port, twins in facts.ports().items():
        states = ["Up" if facts.interface_up(t) else "Down" for t in twins]
        out.append(f"p{port}:{'/'.join(states)}")
    return " ".join(out) or "no CX-7"


def _addresses(facts: Facts) -> str:
    lines = []
    for port_twins in facts.ports().values():
        for twin in port_twins:
            nic = facts.interfaces.get(twin)
            if nic and nic.ipv4():
                lines.append(f"{twin} {','.join(str(a) for a in nic.ipv4())} mtu {nic.mtu}")
    return "\n".join(lines) or "-"


def _container(facts: Facts, name: str, expected_hash: str | None) -> str:
    info = facts.containers.get(name)
    if info is None or not info.exists:
        return "absent" if facts.docker_access else f"unknown ({facts.docker_error or 'no docker access'})"
    state = info.status
    if expected_hash:
        state += ", spec ok" if info.labels.get(SPEC_LABEL) == expected_hash else ", spec differs"
    return state


def status_table(inventory: Inventory, facts: dict[str, Facts], unreachable: dict[str, str],
                 spec_hashes: dict[str, str], hostfile: str | None = None, shown: list[str] | None = None) -> Table:
    table = Table(title=f"cluster {inventory.cluster.name}", show_lines=True)
    for col in ("node", "reachable", "os", "fabric ports", "fabric addresses", "container", "hostfile",
                "ports listening"):
        table.add_column(col)
    ssh_port, serve_port = inventory.container.ssh_port, inventory.serve.port
    for node in inventory.nodes:
        if shown is not None and node.name not in shown:
            continue
        if node.name in unreachable:
            table.add_row(node.name, redacted(f"[red]no[/] {unreachable[node.name]}"), "", "", "", "", "", "")
            continue
        f = facts.get(node.name)
        if f is None:
            continue
        os_text = f"{f.os_id} {f.os_version}" + (" (DGX Spark)" if f.is_dgx_spark else "")
        listening = [f"{p}:{f.listening_tcp[p] or '?'}" for p in (ssh_port, serve_port) if p in f.listening_tcp]
        table.add_row(*redacted([node.name, "[green]yes[/]", os_text, _ports(f), _addresses(f),
                                 _container(f, inventory.container.name, spec_hashes.get(node.name)),
                                 _hostfile(f, hostfile), " ".join(listening) or "-"]))
    return table
