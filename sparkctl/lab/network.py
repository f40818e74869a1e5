"""The lab's networks: a management bridge on the machine, and the CX-7 fabric cabled per topology.

Every link is recorded in the lab state before it is created. Links whose both ends live in lab
namespaces vanish with those namespaces; the machine-side ones are deleted explicitly on teardown.
"""

from __future__ import annotations

import ipaddress
import subprocess
from collections.abc import Sequence

from sparkctl.errors import SparkctlError
from sparkctl.lab.naming import (
    ALL_TWINS,
    MGMT_IFACE,
    PORT_TWINS,
    SWITCH_PORT_MTU,
    LabNames,
    cabled_twins,
    cables,
    switch_bridge_name,
    switch_port_name,
    unplugged_peer_name,
)
from sparkctl.lab.state import LabState, Resource


def ip(*args: str, netns: str | None = None, check: bool = True) -> subprocess.CompletedProcess:
    argv = ["ip", *(["-n", netns] if netns else []), *args]
    result = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    if check and result.returncode != 0:
        raise SparkctlError(f"`{' '.join(argv)}` failed: {result.stderr.strip()}")
    return result


def ip_batch(lines: Sequence[str], netns: str | None = None) -> None:
    """Many link commands in one `ip` process: a 16-node lab issues a few hundred."""
    if not lines:
        return
    argv = ["ip", *(["-n", netns] if netns else []), "-batch", "-"]
    result = subprocess.run(argv, input="\n".join(lines) + "\n", capture_output=True, text=True, timeout=60)
    if result.returncode != 0:
        raise SparkctlError(f"`ip -batch` failed: {result.stderr.strip()}")


def existing_netns() -> set[str]:
    out = ip("netns", "list", check=False).stdout
    return {line.split()[0] for line in out.splitlines() if line.strip()}


def existing_links() -> set[str]:
    out = ip("-o", "link", "show", check=False).stdout
    return {line.split(":")[1].strip().split("@")[0] for line in out.splitlines() if ":" in line}


def subnet_in_use(subnet: str) -> bool:
    """True when the machine already routes anything overlapping `subnet` (another lab, a VPN...)."""
    wanted = ipaddress.ip_network(subnet)
    for line in ip("-4", "route", "show", "table", "all", check=False).stdout.splitlines():
        dest = line.split()[0] if line.strip() else ""
        if dest in ("default", "broadcast", "local", "unreachable", "") or dest[0].isalpha():
            dest = line.split()[1] if dest in ("broadcast", "local") else ""
        try:
            if dest and ipaddress.ip_network(dest, strict=False).overlaps(wanted):
                return True
        except ValueError:
            continue
    return False


def add_netns(state: LabState, name: str) -> None:
    state.record(Resource(kind="netns", name=name))
    ip("netns", "add", name)
    ip("link", "set", "lo", "up", netns=name)


def add_mgmt_bridge(state: LabState, names: LabNames) -> None:
    state.record(Resource(kind="link", name=names.bridge))
    ip("link", "add", names.bridge, "type", "bridge")
    ip("addr", "add", f"{names.bridge_ip}/24", "dev", names.bridge)
    ip("link", "set", names.bridge, "up")


def add_mgmt_link(state: LabState, names: LabNames, index: int, node: str) -> None:
    """A veth from the machine's bridge to `enP7s7` in the node; its address comes from the node's netplan."""
    host_end = names.mgmt_host_veth(index)
    state.record(Resource(kind="link", name=host_end, node=node))
    ns = names.node_netns(node)
    ip("link", "add", host_end, "type", "veth", "peer", "name", MGMT_IFACE, "netns", ns)
    ip("link", "set", host_end, "master", names.bridge, "up")
    ip("link", "set", MGMT_IFACE, "up", netns=ns)


def build_fabric(state: LabState, names: LabNames, node_names: dict[int, str]) -> None:
    """Cables, switch and the unplugged twins. Fabric links start up, without addresses, MTU 1500."""
    topology, port, count = state.topology, state.port, len(node_names)
    netns_of = {i: names.node_netns(n) for i, n in node_names.items()}
    batch: list[str] = []
    ring_order = tuple(state.ring_order) if state.ring_order else None
    for cable in cables(topology, count, port, ring_order):
        for a_twin, b_twin in cable.twin_pairs():
            batch.append(f"link add {a_twin} netns {netns_of[cable.a]} type veth "
                         f"peer name {b_twin} netns {netns_of[cable.b]}")
    if topology == "switch":
        add_netns(state, names.switch_netns)
        for twin in PORT_TWINS[port]:
            bridge = switch_bridge_name(twin)
            ip("link", "add", bridge, "type", "bridge", netns=names.switch_netns)
            ip("link", "set", bridge, "mtu", str(SWITCH_PORT_MTU), "up", netns=names.switch_netns)
        for i in node_names:
            for twin in PORT_TWINS[port]:
                batch.append(f"link add {twin} netns {netns_of[i]} type veth "
                             f"peer name {switch_port_name(i, twin)} netns {names.switch_netns}")
    live = cabled_twins(topology, count, port)
    unplugged = {i: [t for t in ALL_TWINS if t not in live[i]] for i in node_names}
    if any(unplugged.values()):
        add_netns(state, names.unplugged_netns)
    for i, twins in unplugged.items():
        for twin in twins:
            batch.append(f"link add {twin} netns {netns_of[i]} type veth "
                         f"peer name {unplugged_peer_name(i, twin)} netns {names.unplugged_netns}")
    ip_batch(batch)
    if topology == "switch":
        ip_batch([
            f"link set {switch_port_name(i, twin)} mtu {SWITCH_PORT_MTU} master {switch_bridge_name(twin)} up"
            for i in node_names for twin in PORT_TWINS[port]
        ], netns=names.switch_netns)
    for i in node_names:
        # no IPv6 link-local either: a fresh Spark's fabric links carry no address until netplan says so
        ip_batch([f"link set dev {twin} addrgenmode none" for twin in ALL_TWINS]
                 + [f"link set {twin} up" for twin in ALL_TWINS], netns=netns_of[i])


def link_state(netns: str, link: str) -> dict[str, str]:
    """operstate and carrier of a link inside a namespace (for status and tests)."""
    out = ip("-o", "link", "show", link, netns=netns, check=False).stdout
    if not out:
        return {"exists": "no"}
    flags = out.split("<", 1)[1].split(">", 1)[0].split(",")
    state = out.split(" state ", 1)[1].split()[0] if " state " in out else "UNKNOWN"
    return {"exists": "yes", "operstate": state, "carrier": "no" if "NO-CARRIER" in flags else "yes"}
