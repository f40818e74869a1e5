"""Pure naming and addressing of a lab: every name, subnet and cable derives from a short lab id."""

from __future__ import annotations

import secrets
from dataclasses import dataclass

TOPOLOGIES = ("single", "pair", "ring", "switch")
MGMT_IFACE = "enP7s7"
# Each QSFP port shows up as two netdevs ("twins"), names as on a real Spark.
PORT_TWINS: dict[int, tuple[str, str]] = {
    0: ("enp1s0f0np0", "enP2p1s0f0np0"),
    1: ("enp1s0f1np1", "enP2p1s0f1np1"),
}
ALL_TWINS: tuple[str, ...] = PORT_TWINS[0] + PORT_TWINS[1]
MAX_NODES = 64
NODE_USER = "nvidia"
SWITCH_PORT_MTU = 9216


def new_lab_id() -> str:
    return secrets.token_hex(2)


def node_name(index: int) -> str:
    """Nodes are numbered from 1, like the playbooks' spark1, spark2."""
    return f"spark{index}"


def twin_index(twin: str) -> int:
    return ALL_TWINS.index(twin)


@dataclass(frozen=True)
class LabNames:
    """Every name the lab creates on the machine; two lab ids never share one."""

    lab_id: str

    def __post_init__(self) -> None:
        if len(self.lab_id) != 4 or any(c not in "0123456789abcdef" for c in self.lab_id):
            raise ValueError(f"lab id must be 4 lowercase hex digits, got {self.lab_id!r}")

    @property
    def cluster_name(self) -> str:
        return f"lab-{self.lab_id}"

    def node_netns(self, node: str) -> str:
        return f"sl{self.lab_id}-{node}"

    @property
    def unplugged_netns(self) -> str:
        return f"sl{self.lab_id}-unplugged"

    @property
    def switch_netns(self) -> str:
        return f"sl{self.lab_id}-switch"

    @property
    def bridge(self) -> str:
        return f"sl{self.lab_id}br"

    def mgmt_host_veth(self, index: int) -> str:
        return f"sl{self.lab_id}m{index}"

    @property
    def cgroup(self) -> str:
        """Relative to the root of each cgroup hierarchy."""
        return f"sparkctl-lab/{self.lab_id}"

    # --- management subnet: 10.<a>.<b>.0/24 -------------------------------------------------------
    @property
    def mgmt_octets(self) -> tuple[int, int]:
        value = int(self.lab_id, 16)
        return 200 + value % 50, (value // 50) % 256

    @property
    def mgmt_subnet(self) -> str:
        a, b = self.mgmt_octets
        return f"10.{a}.{b}.0/24"

    @property
    def bridge_ip(self) -> str:
        a, b = self.mgmt_octets
        return f"10.{a}.{b}.1"

    def mgmt_ip(self, index: int) -> str:
        if not 1 <= index <= MAX_NODES:
            raise ValueError(f"node index {index} outside 1..{MAX_NODES}")
        a, b = self.mgmt_octets
        return f"10.{a}.{b}.{10 + index}"


def unplugged_peer_name(index: int, twin: str) -> str:
    """The far end of a twin without carrier, inside the lab's unplugged namespace."""
    return f"n{index}t{twin_index(twin)}"


def switch_port_name(index: int, twin: str) -> str:
    return f"n{index}t{twin_index(twin)}"


def switch_bridge_name(twin: str) -> str:
    return f"br{twin_index(twin)}"


@dataclass(frozen=True)
class Cable:
    """One QSFP cable: both twins of port `a_port` on node `a` to the twins of `b_port` on node `b`."""

    a: int
    a_port: int
    b: int
    b_port: int

    def twin_pairs(self) -> list[tuple[str, str]]:
        return list(zip(PORT_TWINS[self.a_port], PORT_TWINS[self.b_port], strict=True))


def validate_topology(topology: str, nodes: int, port: int) -> None:
    if topology not in TOPOLOGIES:
        raise ValueError(f"unknown topology {topology!r} (one of {', '.join(TOPOLOGIES)})")
    if port not in PORT_TWINS:
        raise ValueError(f"port must be 0 or 1, got {port}")
    if not 1 <= nodes <= MAX_NODES:
        raise ValueError(f"nodes must be 1..{MAX_NODES}, got {nodes}")
    needed = {"single": (1, 1), "pair": (2, 2), "ring": (3, MAX_NODES), "switch": (2, MAX_NODES)}
    low, high = needed[topology]
    if not low <= nodes <= high:
        span = f"{low}" if low == high else f"{low}..{high}"
        raise ValueError(f"topology {topology} needs {span} nodes, got {nodes}")


def parse_ring_order(text: str | None, topology: str, nodes: int) -> tuple[int, ...] | None:
    """`--ring-order 1,3,2`: the order the ring's cables really follow (port 0 of each to port 1 of the next),
    a permutation of the node numbers; None (or the inventory's own order) cables the ring as the inventory says."""
    if not text:
        return None
    if topology != "ring":
        raise ValueError(f"--ring-order needs --topology ring, not {topology}")
    try:
        order = tuple(int(part) for part in text.split(","))
    except ValueError:
        raise ValueError(f"--ring-order must be node numbers separated by commas, like 1,3,2; got {text!r}") from None
    if sorted(order) != list(range(1, nodes + 1)):
        raise ValueError(f"--ring-order must name each of the nodes 1..{nodes} once, got {text!r}")
    return order


def cables(topology: str, nodes: int, port: int, ring_order: tuple[int, ...] | None = None) -> list[Cable]:
    """Direct node-to-node cables; a switch has none (every node goes to the switch instead). A ring follows
    `ring_order` (node numbers) when given, else 1, 2, ..., n."""
    validate_topology(topology, nodes, port)
    if topology == "pair":
        return [Cable(1, port, 2, port)]
    if topology == "ring":
        order = ring_order or tuple(range(1, nodes + 1))
        return [Cable(order[i], 0, order[(i + 1) % nodes], 1) for i in range(nodes)]
    return []


def cabled_twins(topology: str, nodes: int, port: int) -> dict[int, set[str]]:
    """For each node index, the twins that have a live peer (cable or switch port)."""
    result: dict[int, set[str]] = {i: set() for i in range(1, nodes + 1)}
    if topology == "switch":
        for i in result:
            result[i].update(PORT_TWINS[port])
    for cable in cables(topology, nodes, port):
        result[cable.a].update(PORT_TWINS[cable.a_port])
        result[cable.b].update(PORT_TWINS[cable.b_port])
    return result
