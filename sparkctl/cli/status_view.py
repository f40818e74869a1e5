"""`cluster status`: one row per node from its facts."""

from __future__ import annotations

from rich.table import Table

from sparkctl.facts import Facts
from sparkctl.inventory import Inventory
from sparkctl.knowledge.bench_history import compared, incomparable, regressions
from sparkctl.plan.container import SPEC_LABEL
from sparkctl.secrets import redacted


def _hostfile(facts: Facts, wanted: str | None) -> str:
    have = facts.container_hostfile
    if have is None:
        return "-"
    if have == "":
        return "missing"
    return "matches" if wanted is not None and have.split() == wanted.split() else "differs"


def _container(facts: Facts, name: str, expected_hash: str | None) -> str:
    info = facts.containers.get(name)
    if info is None or not info.exists:
        return "absent" if facts.docker_access else f"unknown ({facts.docker_error or 'no docker access'})"
    state = info.status
    if expected_hash:
        state += ", spec ok" if info.labels.get(SPEC_LABEL) == expected_hash else ", spec differs"
    return state


HEADERS = ("node", "reachable", "os", "fabric ports", "fabric addresses", "container", "hostfile",
           "ports listening")


def status_nodes(inventory: Inventory, facts: dict[str, Facts], unreachable: dict[str, str],
                 spec_hashes: dict[str, str], hostfile: str | None = None,
                 shown: list[str] | None = None) -> list[dict]:
    """One dict per node shown (inventory order): what `cluster status --json` prints and the table shows."""
    out = []
    ssh_port, serve_port = inventory.container.ssh_port, inventory.serve.port
    for node in inventory.nodes:
        if shown is not None and node.name not in shown:
            continue
        if node.name in unreachable:
            out.append({"name": node.name, "reachable": False, "reason": unreachable[node.name]})
            continue
        f = facts.get(node.name)
        if f is None:
            continue
        ports = {str(port): ["Up" if f.interface_up(t) else "Down" for t in twins] for port, twins in f.ports().items()}
        addresses = {}
        for twins in f.ports().values():
            for twin in twins:
                nic = f.interfaces.get(twin)
                if nic and nic.ipv4():
                    addresses[twin] = [str(a) for a in nic.ipv4()] + [f"mtu {nic.mtu}"]
        out.append({"name": node.name, "reachable": True,
                    "os": f"{f.os_id} {f.os_version}" + (" (DGX Spark)" if f.is_dgx_spark else ""),
                    "fabric_ports": ports, "addresses": addresses,
                    "container": _container(f, inventory.container.name, spec_hashes.get(node.name)),
                    "hostfile": _hostfile(f, hostfile),
                    "listening": {str(p): f.listening_tcp[p] or "?" for p in (ssh_port, serve_port)
                                  if p in f.listening_tcp}})
    return redacted(out)


def status_cells(node: dict) -> list[str]:
    """A node's row as plain text cells (a cell may hold several lines)."""
    if not node["reachable"]:
        return [node["name"], f"no: {node['reason']}", "", "", "", "", "", ""]
    ports = " ".join(f"p{p}:{'/'.join(s)}" for p, s in node["fabric_ports"].items()) or "no CX-7"
    addresses = "\n".join(f"{twin} {','.join(a[:-1])} {a[-1]}" for twin, a in node["addresses"].items()) or "-"
    listening = " ".join(f"{p}:{who}" for p, who in node["listening"].items()) or "-"
    return [node["name"], "yes", node["os"], ports, addresses, node["container"], node["hostfile"], listening]


def status_table(inventory: Inventory, facts: dict[str, Facts], unreachable: dict[str, str],
                 spec_hashes: dict[str, str], hostfile: str | None = None, shown: list[str] | None = None) -> Table:
    table = Table(title=f"cluster {inventory.cluster.name}", show_lines=True)
    for col in HEADERS:
        table.add_column(col)
    for node in status_nodes(inventory, facts, unreachable, spec_hashes, hostfile, shown):
        table.add_row(*status_cells(node))
    return table


def bench_lines(history: list[dict]) -> list[str]:
    """The last fabric bench in one line, what got slower than at the first (or the last) bench that measured it
    the same way, and what no earlier bench measured the same way."""
    if not history:
        return ["fabric bench: never run (sparkctl fabric bench INVENTORY measures every link)"]
    latest = history[0]
    links = latest.get("links") or []
    below = [link for link in links if not (link.get("verdict") or {}).get("ok")]
    nccl = latest.get("nccl") or {}
    head = (f"fabric bench {latest.get('time', '?')}: {len(links)} link(s), {len(below)} below line rate"
            + (f"; NCCL all-reduce {nccl['busbw']:.3g} GB/s busbw" if nccl.get("busbw") is not None else ""))
    slower, unlike = regressions(history), incomparable(history)
    lines = [head] + [f"slower than at the {r.reference}: {r.line()}" for r in slower] if slower else \
        [head + ("; no slower than at the first bench" if compared(history) else "")]
    return lines + [f"nothing to compare with: {line}" for line in unlike]
