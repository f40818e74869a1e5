"""PURE: why a planned fabric twin is not Up, judged across the cable, for preflight, the network tasks and doctor.

One cable carries both twins of a port, and a CX-7 end set down drops the link for the far end too, so a twin
without carrier is first explained by the other end of its cable:
- set down here ("administratively down"): the network phase brings it Up (Up is part of the planned state);
- no carrier because the far end is set down: named, and repaired there, never "check the cable";
- no carrier with both ends up: the cable or the port (a person);
- no carrier while another port of the node has it: the cable is in another port than the inventory plans;
- no such interface: the driver or the card.
A root cause is reported once (the twins of one port together), with what it causes elsewhere under it.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from sparkctl.facts import Facts
from sparkctl.inventory import Inventory
from sparkctl.knowledge.spark import spark_port_of
from sparkctl.plan.fabric import FabricPlan

SET_DOWN = "set_down"
FAR_END_DOWN = "far_end_down"
NO_CARRIER = "no_carrier"
WRONG_PORT = "wrong_port"
ABSENT = "absent"


@dataclass(frozen=True)
class TwinFault:
    """Planned twins of one node and port that are not Up, for one cause."""

    node: str
    interfaces: tuple[str, ...]
    cause: str
    #: the other ends of these twins' cable, (node, interface) each, where the topology says (a pair, a ring)
    far_ends: tuple[tuple[str, str], ...] = ()
    #: whether the far ends were looked at (their facts are known)
    far_end_seen: bool = False
    #: WRONG_PORT: the node's other ports that do have carrier
    cabled_ports: tuple[int, ...] = ()
    #: what this causes elsewhere, as sentences (the far end's lost carrier)
    consequences: tuple[str, ...] = ()

    @property
    def repairable(self) -> bool:
        """A twin set down is brought Up by network.netplan; a far end set down is repaired on the far end."""
        return self.cause in (SET_DOWN, FAR_END_DOWN)

    @property
    def port(self) -> int | None:
        where = spark_port_of(self.interfaces[0])
        return where[0] if where else None

    @property
    def far_nodes(self) -> list[str]:
        return list(dict.fromkeys(n for n, _ in self.far_ends))

    def sentence(self) -> str:
        plural = len(self.interfaces) > 1
        here = f"{self.node} {' and '.join(self.interfaces)}"
        has = "have" if plural else "has"
        far = " and ".join(self.far_nodes)
        if self.cause == SET_DOWN:
            return (f"{here} {'are' if plural else 'is'} administratively down; the network phase "
                    "(network.netplan) brings it Up, Up is part of the planned state")
        if self.cause == FAR_END_DOWN:
            return f"{here} {has} no carrier because {far}'s end{'s are' if plural else ' is'} administratively down"
        if self.cause == WRONG_PORT:
            return (f"{here} {has} no carrier: the cable is in port {'/'.join(map(str, self.cabled_ports))} of "
                    f"{self.node}, the inventory plans port {self.port}")
        if self.cause == ABSENT:
            return f"{here} {'do' if plural else 'does'} not exist (the CX-7 driver or card: `ibdev2netdev`)"
        ends = "; ".join(f"{n}'s end{'s' if len(i) > 1 else ''} {' and '.join(i)}" for n, i in self._far_by_node())
        if self.far_ends and self.far_end_seen:
            return f"{here} {has} no carrier with both ends up ({ends} not set down): the cable or the port"
        if self.far_ends:
            return f"{here} {has} no carrier; the far end ({ends}) was not looked at: the cable, the port, or that end"
        return f"{here} {has} no carrier: the cable, the port, or the switch port"

    def fix(self) -> str:
        names = " ".join(self.interfaces)
        if self.cause == SET_DOWN:
            return (f"sparkctl brings {'them' if len(self.interfaces) > 1 else 'it'} Up (network.netplan); by hand: "
                    + "; ".join(f"sudo ip link set {i} up" for i in self.interfaces))
        if self.cause == FAR_END_DOWN:
            return f"repaired on {' and '.join(self.far_nodes)} (the end that is set down)"
        if self.cause == WRONG_PORT:
            return f"move the cable to port {self.port} on both nodes, or set fabric.port: auto in the inventory"
        if self.cause == ABSENT:
            return f"check the CX-7 driver (`ibdev2netdev` lists {names}?), or pin fabric.interfaces for this node"
        return f"reseat or replace the QSFP cable {self._cable()}"

    def _far_by_node(self) -> list[tuple[str, list[str]]]:
        by_node: dict[str, list[str]] = {}
        for node, iface in self.far_ends:
            by_node.setdefault(node, []).append(iface)
        return list(by_node.items())

    def _cable(self) -> str:
        def where(node: str, ifaces: list[str] | tuple[str, ...]) -> str:
            port = spark_port_of(ifaces[0])
            return f"{node} port {port[0]}" if port else f"{node} {' and '.join(ifaces)}"

        here = where(self.node, self.interfaces)
        if not self.far_ends:
            return f"in {here} (and its switch port)"
        return f"between {here} and " + " and ".join(where(n, i) for n, i in self._far_by_node())


def far_ends(inventory: Inventory, plan: FabricPlan) -> dict[tuple[str, str], tuple[str, str]]:
    """(node, twin) -> (node, twin) at the other end of its cable. A twin's subnet holds exactly the two ends of
    its cable in a pair and a ring; behind a switch the far end is the switch, not a node."""
    if inventory.topology not in ("pair", "ring"):
        return {}
    out = {}
    for node in plan.addresses:
        for link in plan.links(node):
            if len(link.peers) == 1:
                peer, peer_iface, _ = link.peers[0]
                out[(node, link.interface)] = (peer, peer_iface)
    return out


def _fault(inventory: Inventory, node: str, iface: str, facts: dict[str, Facts],
           ends: dict[tuple[str, str], tuple[str, str]]) -> TwinFault | None:
    f = facts[node]
    nic = f.interfaces.get(iface)
    far = ends.get((node, iface))
    far_ends = (far,) if far else ()
    seen = far is not None and far[0] in facts
    if nic is None:
        return None if f.interface_up(iface) else TwinFault(node, (iface,), ABSENT)
    if nic.up:
        return None
    if nic.admin_down:
        return TwinFault(node, (iface,), SET_DOWN, far_ends, seen)
    if far is not None and seen and facts[far[0]].interface_admin_down(far[1]):
        return TwinFault(node, (iface,), FAR_END_DOWN, far_ends, seen)
    port = spark_port_of(iface)
    if port is not None and isinstance(inventory.fabric.port, int) and not inventory.node(node).fabric.interfaces:
        cabled = tuple(p for p, twins in f.ports().items() if p != port[0] and any(f.interface_up(t) for t in twins))
        if cabled:
            return TwinFault(node, (iface,), WRONG_PORT, far_ends, seen, cabled)
    return TwinFault(node, (iface,), NO_CARRIER, far_ends, seen)


def _merge(a: TwinFault, b: TwinFault) -> TwinFault:
    return replace(a, interfaces=a.interfaces + b.interfaces, far_ends=a.far_ends + b.far_ends,
                   far_end_seen=a.far_end_seen and b.far_end_seen, consequences=a.consequences + b.consequences)


def twin_faults(inventory: Inventory, plan: FabricPlan, facts: dict[str, Facts]) -> list[TwinFault]:
    """Planned twins (of the nodes whose facts are known) that are not Up, ROOT CAUSES ONLY, in inventory order:
    a far end's lost carrier is said under the end that is set down; a dead cable, or a cable in another port
    than planned, seen from both ends is one fault, on the first node, the other end under it. A far end set down
    is always found as that end's own fault, so FAR_END_DOWN is never a root. The twins of one port with one
    cause are one fault."""
    if inventory.topology == "single":
        return []
    ends = far_ends(inventory, plan)
    found: dict[tuple[str, str], TwinFault] = {}
    for node in (n.name for n in inventory.nodes if n.name in facts):
        for iface in plan.ports[node].interfaces:
            fault = _fault(inventory, node, iface, facts, ends)
            if fault is not None:
                found[(node, iface)] = fault
    order = list(found)
    caused: dict[tuple[str, str], list[TwinFault]] = {}
    roots = []
    for key, fault in found.items():
        far = fault.far_ends[0] if fault.far_ends else None
        if far is not None and far in found and (
            fault.cause == FAR_END_DOWN  # the end set down is the cause
            # one cable seen from both ends (dead, or in another port at both): said once, on the first node
            or (fault.cause in (NO_CARRIER, WRONG_PORT) and found[far].cause == fault.cause
                and order.index(far) < order.index(key))):
            caused.setdefault(far, []).append(fault)
        else:
            roots.append(key)
    grouped: dict[tuple[str, int | None, str], tuple[TwinFault, list[TwinFault]]] = {}
    for key in roots:
        fault = found[key]
        group = (fault.node, fault.port, fault.cause)
        if group in grouped:
            first, effects = grouped[group]
            grouped[group] = (_merge(first, fault), effects + caused.get(key, []))
        else:
            grouped[group] = (fault, list(caused.get(key, [])))
    return [replace(fault, consequences=_consequences(effects)) for fault, effects in grouped.values()]


def _consequences(faults: list[TwinFault]) -> tuple[str, ...]:
    by_node: dict[tuple[str, str], TwinFault] = {}
    for f in faults:
        key = (f.node, f.cause)
        by_node[key] = _merge(by_node[key], f) if key in by_node else f
    return tuple(f.sentence() if f.cause in (FAR_END_DOWN, WRONG_PORT) else
                 f"{f.node} {' and '.join(f.interfaces)} {'have' if len(f.interfaces) > 1 else 'has'} no carrier "
                 "either (the same cable)" for f in by_node.values())
