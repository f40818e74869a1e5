"""PURE fabric planning: which twins each node uses, the addresses they get, the netplan file, the links."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field

from sparkctl.errors import SparkctlError
from sparkctl.facts import Facts
from sparkctl.inventory import Inventory, Node
from sparkctl.knowledge.spark import DEFAULT_PORT, SPARK_ROCE, SPARK_TWINS
from sparkctl.plan.render import render


class PlanError(SparkctlError):
    """The inventory and the node's facts do not allow a plan (e.g. no Up port)."""


@dataclass(frozen=True)
class NodePorts:
    """The fabric twins a node uses, in order (twin 1 then twin 2 of each used port), with their RoCE devices."""

    node: str
    ports: tuple[int | None, ...]          # physical port per pair of twins (None when pinned by name)
    interfaces: tuple[str, ...]
    roce_devices: tuple[str, ...]
    source: str                            # "pinned" | "facts" | "inventory" | "default" | "peer" | "ring"


@dataclass(frozen=True)
class Link:
    """One twin subnet seen from one node: its interface and address, and the peers on the same subnet."""

    node: str
    interface: str
    address: ipaddress.IPv4Interface
    peers: tuple[tuple[str, str, ipaddress.IPv4Interface], ...]   # (peer node, peer interface, peer address)


@dataclass
class FabricPlan:
    ports: dict[str, NodePorts]
    addresses: dict[str, dict[str, ipaddress.IPv4Interface]]   # node -> interface -> address
    kept: dict[str, set[str]] = field(default_factory=dict)      # node -> interfaces whose address was kept
    # node -> its links, worked out once: asked for every pair of nodes (peer_route), each answer walks every node
    _links: dict[str, list[Link]] = field(default_factory=dict, init=False, repr=False, compare=False)

    def links(self, node: str) -> list[Link]:
        if node not in self._links:
            mine = self.addresses.get(node, {})
            self._links[node] = [
                Link(node, iface, addr, tuple((other, oif, oaddr)
                                              for other, oaddrs in self.addresses.items() if other != node
                                              for oif, oaddr in oaddrs.items() if oaddr.network == addr.network))
                for iface, addr in mine.items()]
        return list(self._links[node])

    def address_facing(self, node: str, peer: str) -> ipaddress.IPv4Address | None:
        """node's first address on a subnet it shares with peer (a ring reaches each neighbour on its own
        cable); else its first address."""
        theirs = {a.network for a in self.addresses.get(peer, {}).values()}
        for iface in self.ports[node].interfaces:
            addr = self.addresses.get(node, {}).get(iface)
            if addr is not None and addr.network in theirs:
                return addr.ip
        return self.first_address(node)

    def interface_of(self, node: str, ip: ipaddress.IPv4Address | None) -> str | None:
        return next((iface for iface, addr in self.addresses.get(node, {}).items() if addr.ip == ip), None)

    def first_interface(self, node: str) -> str | None:
        """The node's first planned twin that has an address."""
        return next((i for i in self.ports[node].interfaces if i in self.addresses.get(node, {})), None)

    def first_address(self, node: str) -> ipaddress.IPv4Address | None:
        iface = self.first_interface(node)
        return self.addresses[node][iface].ip if iface is not None else None


def _roce_for(netdev: str, facts: Facts | None) -> str:
    if facts is not None:
        for dev in facts.roce:
            if dev.netdev == netdev:
                return dev.device
    return SPARK_ROCE.get(netdev, "")


def _cabled_port(node: Node, facts: Facts) -> int:
    """The port a cable is in: both twins Up; else one twin Up (one cable carries both twins, so the other
    twin's trouble is its own); else the only port with a twin set down (bringing it Up is planned)."""
    up = sorted(facts.up_ports())
    if up:
        return up[0] if len(up) == 1 else DEFAULT_PORT
    ports = facts.ports()
    carrier = [p for p, twins in ports.items() if any(facts.interface_up(t) for t in twins)]
    if carrier:
        return DEFAULT_PORT if DEFAULT_PORT in carrier else carrier[0]
    set_down = [p for p, twins in ports.items() if any(facts.interface_admin_down(t) for t in twins)]
    if len(set_down) == 1:
        return set_down[0]
    raise PlanError(
        f"{node.name}: no fabric port is Up (no QSFP port has carrier on both twins)",
        hint="plug the QSFP cable into the same port on both nodes; `ibdev2netdev` shows the state",
    )


def select_ports(inventory: Inventory, node: Node, facts: Facts | None) -> NodePorts:
    """The twins a node uses: pinned names, else the inventory's port, else the cabled one (facts), else port 1.

    A port the inventory names is planned whether or not it has carrier: why it has none (a twin set down here
    or at the far end, the cable, another port cabled) is preflight's judgement (rules/twins.py)."""
    topology = inventory.topology
    if topology == "single":
        return NodePorts(node.name, (), (), (), "inventory")
    pinned = node.fabric.interfaces
    if pinned:
        names = tuple(pinned)
        return NodePorts(node.name, (None,), names, tuple(_roce_for(n, facts) for n in names), "pinned")
    wanted = inventory.fabric.port
    if topology == "ring":
        ports: tuple[int, ...] = (0, 1)
        source = "ring"
    elif wanted in (0, 1):
        ports = (int(wanted),)
        source = "facts" if facts is not None and int(wanted) in facts.up_ports() else "inventory"
    elif facts is not None:
        ports, source = (_cabled_port(node, facts),), "facts"
    else:
        ports = (int(wanted),) if wanted in (0, 1) else (DEFAULT_PORT,)
        source = "inventory" if wanted in (0, 1) else "default"
    names = tuple(n for p in ports for n in SPARK_TWINS[p])
    return NodePorts(node.name, ports, names, tuple(_roce_for(n, facts) for n in names), source)


def _select_all(inventory: Inventory, facts_by_node: dict[str, Facts]) -> dict[str, NodePorts]:
    """select_ports for every node; in a pair, a node with no carrier anywhere takes its peer's port (NVIDIA:
    the same port on both), so the far end's trouble (a twin set down there) can be named and repaired."""
    ports: dict[str, NodePorts] = {}
    undecided: dict[str, PlanError] = {}
    for n in inventory.nodes:
        try:
            ports[n.name] = select_ports(inventory, n, facts_by_node.get(n.name))
        except PlanError as exc:
            undecided[n.name] = exc
    if not undecided:
        return ports
    chosen = {p.ports for p in ports.values()}
    if inventory.topology != "pair" or len(chosen) != 1:
        raise next(iter(undecided.values()))
    port = next(iter(chosen))
    for name in undecided:
        names = tuple(t for p in port if p is not None for t in SPARK_TWINS[p])
        ports[name] = NodePorts(name, port, names, tuple(_roce_for(t, facts_by_node.get(name)) for t in names),
                                "peer")
    return {n.name: ports[n.name] for n in inventory.nodes}


def _existing(facts: Facts | None, iface: str, subnet: ipaddress.IPv4Network) -> ipaddress.IPv4Interface | None:
    if facts is None:
        return None
    nic = facts.interfaces.get(iface)
    if nic is None:
        return None
    for a in nic.addresses:
        if a.family == "inet":
            addr = ipaddress.IPv4Interface(f"{a.ip}/{a.prefixlen}")
            if addr.network == subnet and addr.ip not in (subnet.network_address, subnet.broadcast_address):
                return addr
    return None


def _slots(inventory: Inventory, ports: dict[str, NodePorts]) -> list[tuple[str, str, ipaddress.IPv4Network, int]]:
    """(node, interface, subnet, default host number) for every fabric interface that gets an address."""
    subnets = [ipaddress.IPv4Network(str(s)) for s in inventory.fabric_subnets()]
    names = [n.name for n in inventory.nodes]
    slots = []
    if inventory.topology == "ring":
        count = len(names)
        for i, name in enumerate(names):
            nxt = names[(i + 1) % count]
            # cable i: node i port 0 <-> node i+1 port 1, one subnet per twin
            for twin in (0, 1):
                subnet = subnets[2 * i + twin]
                slots.append((name, _twin_on(ports[name], 0, twin), subnet, 1))
                slots.append((nxt, _twin_on(ports[nxt], 1, twin), subnet, 2))
    elif inventory.topology in ("pair", "switch"):
        for i, name in enumerate(names):
            for twin, subnet in enumerate(subnets[:2]):
                slots.append((name, ports[name].interfaces[twin], subnet, 10 + i))
    return slots


def _twin_on(ports: NodePorts, port: int, twin: int) -> str:
    if ports.source == "pinned":
        return ports.interfaces[twin]
    return SPARK_TWINS[port][twin]


def plan_fabric(inventory: Inventory, facts_by_node: dict[str, Facts] | None = None) -> FabricPlan:
    """Addresses for every fabric twin. Addresses that already satisfy the inventory are kept (never renumber)."""
    facts_by_node = facts_by_node or {}
    ports = _select_all(inventory, facts_by_node)
    slots = _slots(inventory, ports)
    taken: dict[ipaddress.IPv4Network, set[ipaddress.IPv4Address]] = {}
    chosen: dict[str, dict[str, ipaddress.IPv4Interface]] = {n.name: {} for n in inventory.nodes}
    kept: dict[str, set[str]] = {n.name: set() for n in inventory.nodes}
    for node, iface, subnet, _ in slots:
        have = _existing(facts_by_node.get(node), iface, subnet)
        if have is not None and have.ip not in taken.setdefault(subnet, set()):
            taken[subnet].add(have.ip)
            chosen[node][iface] = have
            kept[node].add(iface)
    for node, iface, subnet, host in slots:
        if iface in chosen[node]:
            continue
        used = taken.setdefault(subnet, set())
        candidate = subnet.network_address + host if host < subnet.num_addresses - 1 else None
        if candidate is None or candidate in used:
            candidate = _first_free(subnet, used)
        used.add(candidate)
        chosen[node][iface] = ipaddress.IPv4Interface(f"{candidate}/{subnet.prefixlen}")
    # in the order of the node's twins, whichever addresses were kept: settings listing them (the container's
    # sshd listen addresses) must not change because a twin lost its address for a while
    ordered = {node: {i: chosen[node][i] for i in ports[node].interfaces if i in chosen[node]} for node in chosen}
    return FabricPlan(ports=ports, addresses=ordered, kept=kept)


def _first_free(subnet: ipaddress.IPv4Network, used: set[ipaddress.IPv4Address]) -> ipaddress.IPv4Address:
    """The lowest host address not in use, found by counting (a /8 is never enumerated)."""
    first, last = int(subnet.network_address) + 1, int(subnet.broadcast_address) - 1
    taken = sorted(int(a) for a in used if first <= int(a) <= last)
    candidate = first
    for address in taken:
        if address > candidate:
            break
        candidate = max(candidate, address + 1)
    if candidate > last:
        raise PlanError(f"{subnet} has no free address left for another node",
                        hint="use a larger fabric subnet (a /24 holds 250 nodes) or fewer nodes")
    return ipaddress.IPv4Address(candidate)


def render_netplan(inventory: Inventory, node: str, plan: FabricPlan,
                   routes: dict[str, list[tuple[str, str]]] | None = None) -> str:
    """routes: {interface: [(destination, via)]} (a ring's, plan/ring.py)."""
    addrs = plan.addresses.get(node, {})
    routes = routes or {}
    interfaces = [
        {"name": iface, "addresses": [str(addrs[iface])] if iface in addrs else [],
         "routes": routes.get(iface, [])}
        for iface in plan.ports[node].interfaces
    ]
    return render(
        "netplan-fabric.yaml.j2",
        cluster=inventory.cluster.name, node=node, interfaces=interfaces, mtu=inventory.fabric.mtu,
    )
