"""PURE: the cabling map. Who is at the other end of each QSFP port, read from LLDP (this node's lldpd, or the
far end's: one cable is seen from both sides), against what the inventory's topology wants there.

One judgement for preflight (which refuses a wrong cable before anything changes), doctor (which shows the map)
and `inventory init` (which proposes the topology and the ring order from it). Without LLDP on either end of a
port the map says the port is inferred from carrier, and nothing is refused on that ground.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from sparkctl.facts import Facts, LldpNeighbor
from sparkctl.inventory import Inventory
from sparkctl.knowledge.spark import spark_port_of

#: `wanted` of a port whose far end should be a switch (any system that is not one of the nodes).
SWITCH = "(switch)"


@dataclass(frozen=True)
class End:
    """One end of a cable: a node of the cluster (its name) or a foreign system (what it calls itself)."""

    node: str
    interface: str
    port: int | None = None  # the QSFP port of a Spark-named interface
    known: bool = True  # one of the cluster's nodes

    def __str__(self) -> str:
        if self.known and self.port is not None:
            return f"{self.node} port {self.port} ({self.interface})"
        return f"{self.node} {self.interface}".strip() if self.known else \
            f"{self.node or 'an unnamed system'} (not in the inventory) {self.interface}".rstrip()


@dataclass(frozen=True)
class Seen:
    far: End
    #: the node whose lldpd reported it (this port's node, or the far end's)
    reported_by: str


@dataclass(frozen=True)
class PortRow:
    """One QSFP port of one node in the map."""

    node: str
    port: int
    interfaces: tuple[str, ...]
    up: bool
    #: what the inventory wants at the far end: "spark2 port 1", "spark2", SWITCH, or "" (port not used)
    wanted: str
    seen: tuple[Seen, ...] = ()
    problem: str = ""

    @property
    def source(self) -> str:
        if not self.seen:
            return "inferred" if self.up else "-"
        reporters = sorted({s.reported_by for s in self.seen})
        return "lldp" if reporters == [self.node] else f"lldp ({', '.join(reporters)})"

    @property
    def far(self) -> str:
        ends = _unique(s.far for s in self.seen)
        if ends:
            return describe(ends)
        if not self.up:
            return "no carrier"
        return "carrier, no LLDP" + (f" (assumed {self.wanted})" if self.wanted and self.wanted != SWITCH else "")

    def to_dict(self) -> dict:
        return {"node": self.node, "port": self.port, "interfaces": list(self.interfaces), "up": self.up,
                "wanted": self.wanted, "seen": self.far, "source": self.source, "problem": self.problem}


@dataclass
class CablingMap:
    rows: list[PortRow] = field(default_factory=list)
    #: node -> why its lldpd could not be read ("ok" nodes are not listed)
    lldp_unavailable: dict[str, str] = field(default_factory=dict)

    @property
    def problems(self) -> list[PortRow]:
        return [r for r in self.rows if r.problem]

    @property
    def inferred(self) -> bool:
        """No used port's far end came from LLDP."""
        return not any(r.seen for r in self.rows)

    def row(self, node: str, port: int) -> PortRow | None:
        return next((r for r in self.rows if r.node == node and r.port == port), None)


def _unique(ends) -> list[End]:
    out: list[End] = []
    for end in ends:
        if not any((e.node, e.port, e.interface) == (end.node, end.port, end.interface) for e in out):
            out.append(end)
    return out


def describe(ends: list[End]) -> str:
    """Ends grouped by node and port: `spark3 port 1 (enp1s0f1np1, enP2p1s0f1np1)`."""
    groups: dict[tuple[str, int | None, bool], list[str]] = {}
    for end in ends:
        groups.setdefault((end.node, end.port, end.known), []).append(end.interface)
    return " and ".join(str(End(node, ", ".join(dict.fromkeys(ifaces)), port, known))
                        for (node, port, known), ifaces in groups.items())


def _port(interface: str) -> int | None:
    where = spark_port_of(interface)
    return where[0] if where else None


def resolve(neighbor: LldpNeighbor, facts: dict[str, Facts], hosts: dict[str, str] | None = None) -> End:
    """The far end of what LLDP heard: a node of the cluster by the MAC of its port (lldpd's default port id),
    else by its system name (the hostname), else by a management address, else by an inventory node's name (`hosts`
    lists them all, facts or not); otherwise a foreign system."""
    if neighbor.port_id_type == "mac" and neighbor.port_id:
        mac = neighbor.port_id.lower()
        for node, f in facts.items():
            for iface in f.interfaces.values():
                if iface.mac and iface.mac.lower() == mac:
                    return End(node, iface.name, _port(iface.name))
    name = neighbor.system
    interface = neighbor.port_name
    for node, f in facts.items():
        if name and name in {node, f.hostname, f.hostname.split(".")[0]}:
            return End(node, interface, _port(interface))
    for node, host in (hosts or {}).items():
        if host in neighbor.mgmt_ips:
            return End(node, interface, _port(interface))
    if name and name in (hosts or {}):
        # an inventory node whose facts are missing (lost in this run): still the node its name says, so a
        # healthy node's cable to it is judged, while its own ports stay unknown
        return End(name, interface, _port(interface))
    return End(name or neighbor.chassis_id, interface, _port(interface), known=False)


def lldp_sees(f: Facts, port: int) -> str:
    """What this node's own lldpd hears on a port, by the far end's own names ("" when nothing)."""
    if f.lldp is None or not f.lldp.ok:
        return ""
    heard = [f"{n.system or n.chassis_id} {n.port_name}".strip() for n in f.lldp.neighbors
             if _port(n.interface) == port]
    return ", ".join(dict.fromkeys(heard))


def observations(facts: dict[str, Facts], hosts: dict[str, str] | None = None) -> dict[tuple[str, int], list[Seen]]:
    """(node, port) -> what LLDP says is at its far end, from this node's lldpd and from the far end's."""
    seen: dict[tuple[str, int], list[Seen]] = {}
    for node, f in facts.items():
        if f.lldp is None or not f.lldp.ok:
            continue
        for neighbor in f.lldp.neighbors:
            port = _port(neighbor.interface)
            if port is None:
                continue  # the management port or anything not QSFP
            far = resolve(neighbor, facts, hosts)
            seen.setdefault((node, port), []).append(Seen(far, node))
            if far.known and far.port is not None and far.node != node:
                near = End(node, neighbor.interface, port)
                seen.setdefault((far.node, far.port), []).append(Seen(near, node))
    return seen


def _used_ports(inventory: Inventory) -> set[int]:
    """The ports the inventory lets carry the fabric (`port: auto`: whichever is cabled)."""
    if inventory.topology != "ring" and inventory.fabric.port in (0, 1):
        return {int(inventory.fabric.port)}
    return {0, 1}


def wanted_at(inventory: Inventory, node: str, port: int, used: set[int]) -> str:
    """What the inventory's topology puts at the far end of `port` of `node`."""
    if inventory.node(node).fabric.interfaces or port not in used:
        return ""
    names = [n.name for n in inventory.nodes]
    if inventory.topology == "ring":
        i = names.index(node)
        # cable i: node i port 0 <-> node i+1 port 1 (sparkctl/plan/fabric.py, _slots)
        return f"{names[(i + 1) % len(names)]} port 1" if port == 0 else f"{names[i - 1]} port 0"
    if inventory.topology == "pair":
        return next(n for n in names if n != node)
    if inventory.topology == "switch":
        return SWITCH
    return ""


def _problem(inventory: Inventory, node: str, port: int, interfaces: tuple[str, ...], wanted: str,
             seen: list[Seen], used: set[int]) -> str:
    known = _unique(s.far for s in seen if s.far.known)
    if not known:
        return ""  # a switch, or nothing the cluster knows: not a miscabling sparkctl can name
    where = f"{node} port {port} ({interfaces[0] if interfaces else '?'})"
    sees = describe(known)
    if not wanted and port not in used and inventory.topology in ("pair", "switch"):
        planned = "/".join(map(str, sorted(used))) or "?"
        return (f"{where}: a cable to {sees} is on port {port}, the inventory plans port {planned}: move it to "
                f"port {planned} (or set fabric.port: auto)")
    if wanted == SWITCH:
        return f"{where}: cabled directly to {sees}, the inventory says the nodes meet at a switch"
    if not wanted:
        return ""
    wanted_node, _, wanted_port = wanted.partition(" port ")
    if all(e.node == wanted_node and (not wanted_port or str(e.port) == wanted_port) for e in known):
        return ""
    order = " -> ".join(n.name for n in inventory.nodes)
    ring = f" (the ring in inventory order {order} -> {inventory.nodes[0].name}, port 0 to the next node's " \
           "port 1)" if inventory.topology == "ring" else ""
    return f"{where}: the inventory wants {wanted} here{ring}; LLDP sees {sees}"


def cabling_map(inventory: Inventory, facts: dict[str, Facts]) -> CablingMap:
    """The map of every reachable node's QSFP ports, in inventory order."""
    hosts = {n.name: n.host for n in inventory.nodes}
    seen = observations(facts, hosts)
    result = CablingMap()
    for node in [n.name for n in inventory.nodes if n.name in facts]:
        f = facts[node]
        if f.lldp is not None and not f.lldp.ok:
            result.lldp_unavailable[node] = f.lldp.detail or f.lldp.status
        used = _used_ports(inventory)
        for port, twins in f.ports().items():
            interfaces = tuple(twins)
            wanted = wanted_at(inventory, node, port, used)
            here = seen.get((node, port), [])
            up = bool(twins) and all(f.interface_up(t) for t in twins)
            result.rows.append(PortRow(node, port, interfaces, up, wanted, tuple(here),
                                       _problem(inventory, node, port, interfaces, wanted, here, used)))
    return result


@dataclass
class Proposal:
    """What `inventory init` may write from LLDP: None fields were not decided by LLDP."""

    topology: str | None = None
    port: int | str | None = None
    order: list[str] | None = None
    evidence: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)


def propose(names: list[str], facts: dict[str, Facts], hosts: dict[str, str] | None = None) -> Proposal:
    """Topology, port and ring order from the cables LLDP sees between these nodes (names[0] is the head)."""
    seen = observations(facts, hosts)
    links: dict[tuple[str, int], set[tuple[str, int | None]]] = {}
    foreign: dict[str, set[str]] = {}
    for (node, port), entries in seen.items():
        for s in entries:
            if s.far.known and s.far.node in facts:
                links.setdefault((node, port), set()).add((s.far.node, s.far.port))
            elif not s.far.known:
                foreign.setdefault(node, set()).add(s.far.node or "an unnamed system")
    if not links and not foreign:
        return Proposal()
    evidence = [f"LLDP: {node} port {port} <-> " + ", ".join(f"{n} port {p}" for n, p in sorted(ends, key=str))
                for (node, port), ends in sorted(links.items())]
    if not links:
        names_seen = sorted({x for xs in foreign.values() for x in xs})
        return Proposal("switch", None, None,
                        [f"LLDP: the nodes' QSFP ports face {', '.join(names_seen)}, not each other"])
    if len(names) == 2:
        ports = {p for (n, p) in links}
        cabled: int | str = ports.pop() if len(ports) == 1 else "auto"
        return Proposal("pair", cabled, list(names), evidence)
    nxt: dict[str, str] = {}
    problems = []
    for (node, port), ends in links.items():
        for far_node, far_port in ends:
            if port == 0 and far_port == 1:
                nxt[node] = far_node
            elif port == far_port:
                problems.append(f"{node} port {port} is cabled to {far_node} port {far_port}: a ring cables port 0 "
                                "to the next node's port 1")
    order = [names[0]]
    while order[-1] in nxt and nxt[order[-1]] not in order:
        order.append(nxt[order[-1]])
    if len(order) == len(names) and nxt.get(order[-1]) == order[0] and not problems:
        return Proposal("ring", "auto", order, evidence)
    return Proposal("ring" if nxt else None, None, None, evidence,
                    sorted(set(problems)) or [f"LLDP sees cables between the nodes but no ring through all "
                                              f"{len(names)} of them (followed port 0 from {names[0]}: "
                                              f"{' -> '.join(order)})"])
