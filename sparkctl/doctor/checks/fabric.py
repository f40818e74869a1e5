"""PURE fabric checks: ports, speed, addresses, subnets, MTU, netplan files, and the jumbo pings across links."""

from __future__ import annotations

import ipaddress
from collections.abc import Callable

from sparkctl.doctor.catalog import (
    FABRIC_ADDRESS_DUPLICATE,
    FABRIC_ADDRESS_EXTRA,
    FABRIC_ADDRESS_FOREIGN,
    FABRIC_ADDRESS_MISSING,
    FABRIC_JUMBO_PING,
    FABRIC_LINK_DEAD,
    FABRIC_LINK_LOCAL,
    FABRIC_MTU_MISMATCH,
    FABRIC_NO_PLAN,
    FABRIC_PORTS_DIFFER,
    FABRIC_SPEED_LOW,
    FABRIC_TWINS_SAME_SUBNET,
    FINDINGS,
    NETPLAN_CONFLICT,
    NETPLAN_DRIFT,
)
from sparkctl.doctor.findings import CLUSTER, Finding, Phase, finding
from sparkctl.doctor.snapshot import Snapshot
from sparkctl.knowledge.spark import PORT_SPEED_MBPS
from sparkctl.rules.fabric import InterfaceDrift, interface_drift, twins_sharing_subnet
from sparkctl.rules.netplan import conflicting_stanzas
from sparkctl.rules.twins import ABSENT, NO_CARRIER, SET_DOWN, WRONG_PORT, TwinFault, twin_faults

PHASE: Phase = "network"



def _planned(s: Snapshot, node: str) -> tuple[list[str], dict[str, ipaddress.IPv4Interface]]:
    assert s.plan is not None
    return list(s.plan.fabric.ports[node].interfaces), dict(s.plan.fabric.addresses.get(node, {}))


def _peer_twins(s: Snapshot, node: str, iface: str) -> list[tuple[str, str]]:
    """(peer, peer interface) on the same planned subnet as this interface."""
    assert s.plan is not None
    for link in s.plan.fabric.links(node):
        if link.interface == iface:
            return [(peer, pif) for peer, pif, _ in link.peers]
    return []


# FAR_END_DOWN is no root cause (twin_faults says it under the end set down): no finding of its own.
_FAULT_IDS = {SET_DOWN: "fabric.port_down", NO_CARRIER: "fabric.no_carrier", WRONG_PORT: "fabric.wrong_port",
              ABSENT: "fabric.interface_missing"}
_SUMMARIES = {SET_DOWN: "set down (administratively down)", NO_CARRIER: "without carrier",
              WRONG_PORT: "without carrier: the cable is in another port", ABSENT: "missing"}


def check_ports(s: Snapshot) -> list[Finding]:
    """Each planned twin that is not Up, by its cause across the cable (rules/twins.py): the root cause once, on
    its node, with what it causes elsewhere (the far end's carrier, the pings and logins across it) under it."""
    assert s.plan is not None
    out = []
    for fault in twin_faults(s.inventory, s.plan.fabric, s.facts):
        names = " and ".join(fault.interfaces)
        nics = [s.facts[fault.node].interfaces.get(i) for i in fault.interfaces]
        states = "; ".join(f"{i}: absent" if n is None else f"{i}: state {n.operstate}, <{','.join(n.flags)}>"
                           for i, n in zip(fault.interfaces, nics, strict=True))
        summary = f"fabric {'twins' if len(nics) > 1 else 'twin'} {names} {_SUMMARIES[fault.cause]}"
        if _far_end_silent(s, fault):
            # a node that is off leaves its cables without carrier: node.unreachable says it, on that node
            far = " and ".join(fault.far_nodes)
            out.append(finding(FINDINGS[_FAULT_IDS[fault.cause]], fault.node, summary, phase=PHASE, severity="info",
                               evidence=f"{fault.sentence()} ({states}); {far} does not answer (node.unreachable)",
                               fix=f"judged again once {far} answers: a node that is off has no carrier on its "
                                   "cables"))
            continue
        out.append(finding(FINDINGS[_FAULT_IDS[fault.cause]], fault.node, summary,
                           evidence=f"{fault.sentence()} ({states})",
                           fix=s.bootstrap("network") if fault.repairable else fault.fix(), phase=PHASE,
                           details=(*fault.consequences, *_across(s, fault)), severity="error"))
    for node in s.order:
        f = s.facts[node]
        for iface in s.plan.fabric.ports[node].interfaces:
            nic = f.interfaces.get(iface)
            if nic is not None and f.interface_up(iface) and nic.speed_mbps and nic.speed_mbps < PORT_SPEED_MBPS:
                out.append(finding(FABRIC_SPEED_LOW, node, f"{iface} links below 200 Gb/s",
                                   evidence=f"{nic.speed_mbps // 1000} Gb/s, expected 200 Gb/s",
                                   fix="check the cable; a switch port may have negotiated 100G"))
    if s.inventory.topology in ("pair", "switch"):
        used = {n: s.plan.fabric.ports[n].ports for n in s.order}
        if len(set(used.values())) > 1:
            out.append(finding(FABRIC_PORTS_DIFFER, CLUSTER, "the nodes use different QSFP ports",
                               evidence=", ".join(f"{n}: port {'/'.join(map(str, p))}" for n, p in used.items()),
                               fix="works (each node's settings use its own names); NVIDIA recommends the same port"))
    return out


def _far_end_silent(s: Snapshot, fault: TwinFault) -> bool:
    """No carrier, and every node at the cable's other end does not answer: nothing here to blame yet."""
    return (fault.cause == NO_CARRIER and bool(fault.far_ends) and not fault.far_end_seen
            and all(node in s.unreachable for node in fault.far_nodes))


def _across(s: Snapshot, fault: TwinFault) -> list[str]:
    """What failed across the subnets of these twins because of them: lost addresses, pings, ssh logins."""
    assert s.plan is not None
    ends = [(fault.node, i) for i in fault.interfaces] + list(fault.far_ends)
    nets = {address.network for n, i in ends
            if (address := s.plan.fabric.addresses.get(n, {}).get(i)) is not None}
    out = []
    for node, iface in ends:
        planned = s.plan.fabric.addresses.get(node, {}).get(iface)
        if node in s.facts and planned is not None and str(planned) not in {
                str(a) for a in s.facts[node].addresses_of(iface)}:
            out.append(f"{node} {iface} is without its address {planned} (the renderer gives it back with the "
                       "carrier)")
    return out + _failures_toward(s, lambda ip: _in(ip, nets))


def _failures_toward(s: Snapshot, match: Callable[[str], bool], sources: set[str] | None = None) -> list[str]:
    """The failed pings and ssh logins (from the nodes, or those of `sources`, and their containers) to addresses
    that `match`."""
    out = []
    for node in s.order if sources is None else [n for n in s.order if n in sources]:
        probe = s.probe(node)
        for ping in probe.pings:
            if ping.verdict != "ok" and match(ping.peer_ip):
                out.append(f"the jumbo ping {node} {ping.interface} -> {ping.peer} {ping.peer_ip} fails")
        for where, probes in (("", probe.ssh), ("'s container", probe.container_ssh)):
            for p in probes:
                if not p.ok and match(p.target.rpartition("@")[2]):
                    out.append(f"ssh from {node}{where} to {p.peer}{where} ({p.target}) fails: {p.error or 'failed'}")
    return out


def _in(ip: str, nets: set[ipaddress.IPv4Network]) -> bool:
    try:
        address = ipaddress.ip_address(ip)
    except ValueError:
        return False
    return any(address in net for net in nets)


def _drift(s: Snapshot, node: str) -> list[InterfaceDrift]:
    ifaces, planned = _planned(s, node)
    return interface_drift(s.facts[node], ifaces, planned, s.inventory.fabric.mtu)


def check_addresses(s: Snapshot) -> list[Finding]:
    """The drift network.netplan would repair, as findings; a Down twin's lost address is the port's finding."""
    out = []
    fix = s.bootstrap("network")
    owners: dict[str, list[tuple[str, str]]] = {}
    for node in s.order:
        f = s.facts[node]
        ifaces, planned = _planned(s, node)
        planned_nets = {a.network for a in planned.values()}
        for iface in ifaces:
            for a in f.addresses_of(iface):
                if a.family == "inet":
                    owners.setdefault(a.ip, []).append((node, iface))
        for d in _drift(s, node):
            want = planned.get(d.interface, "no address")
            if d.kind == "unplanned" and d.is_link_local:
                out.append(finding(FABRIC_LINK_LOCAL, node, f"link-local address left on {d.interface}",
                                   evidence=f"{d.have} on {d.interface}; the plan has {want} (link-local: [] in "
                                            "netplan)",
                                   fix=f"{fix} (removes it), or sudo ip addr del {d.have} dev {d.interface}"))
            elif d.kind == "unplanned":
                network = ipaddress.ip_interface(d.have).network
                if d.interface in planned and network == planned[d.interface].network:
                    out.append(finding(FABRIC_ADDRESS_EXTRA, node,
                                       f"{d.interface} has a second address in its subnet",
                                       evidence=f"{d.have} on {d.interface} besides the planned {want}",
                                       fix=f"{fix} (removes unplanned addresses)"))
                elif network not in planned_nets:  # the other twin's subnet: twins_same_subnet below
                    out.append(finding(FABRIC_ADDRESS_FOREIGN, node,
                                       f"{d.interface} has an address outside its subnet",
                                       evidence=f"{d.have} on {d.interface}; planned {want}",
                                       fix=f"{fix} (removes unplanned addresses)"))
            elif d.kind == "missing" and f.interface_up(d.interface):
                have = [str(a) for a in f.addresses_of(d.interface) if a.family == "inet"]
                out.append(finding(FABRIC_ADDRESS_MISSING, node, f"{d.interface} lacks its planned address",
                                   evidence=f"{d.interface} has {', '.join(have) or 'no IPv4 address'}; "
                                            f"planned {want}",
                                   fix=fix))
        for net, names in twins_sharing_subnet(f, ifaces).items():
            out.append(finding(FABRIC_TWINS_SAME_SUBNET, node, "two fabric twins share one subnet",
                               evidence=f"{' and '.join(sorted(names))} both in {net}; one subnet per twin is "
                                        "planned (the legacy scheme causes ARP/route confusion and NCCL failures)",
                               fix=fix))
    for ip, where in owners.items():
        nodes = sorted({n for n, _ in where})
        if len(where) > 1 and not ipaddress.ip_address(ip).is_link_local:
            # to it, and from the nodes holding it to its subnet (replies go to whichever holder answers first)
            nets = {a.network for n, i in where for a in s.facts[n].addresses_of(i) if a.ip == ip}
            def to_it(target: str, ip: str = ip) -> bool:
                return target == ip

            def to_its_subnet(target: str, ip: str = ip, nets: set = nets) -> bool:
                return target != ip and _in(target, nets)

            failing = tuple(_failures_toward(s, to_it)
                            + _failures_toward(s, to_its_subnet, sources=set(nodes)))
            for node in nodes:
                out.append(finding(FABRIC_ADDRESS_DUPLICATE, node, f"address {ip} is used twice",
                                   evidence="; ".join(f"{n} {i}" for n, i in where),
                                   fix=fix, details=failing))
    return out


def _mtu_problem(s: Snapshot, node: str, iface: str) -> bool:
    nic = s.facts[node].interfaces.get(iface) if node in s.facts else None
    return nic is not None and nic.mtu != s.inventory.fabric.mtu


def check_mtu(s: Snapshot) -> list[Finding]:
    out = []
    mtu = s.inventory.fabric.mtu
    for node in s.order:
        for d in _drift(s, node):
            if d.kind != "mtu":
                continue
            iface = d.interface
            peers = ", ".join(f"{p} {pif}: {s.facts[p].interfaces[pif].mtu}" for p, pif in _peer_twins(s, node, iface)
                              if p in s.facts and pif in s.facts[p].interfaces)
            out.append(finding(FABRIC_MTU_MISMATCH, node, f"{iface} has MTU {d.have}, not {mtu}",
                               evidence=f"MTU {d.have} on {iface}, planned {mtu}"
                                        + (f"; peer {peers}" if peers else "")
                                        + ("; MTU 1500 caps NCCL bandwidth" if d.have == "1500" else ""),
                               fix=s.bootstrap('network')))
    return out


def check_netplan(s: Snapshot) -> list[Finding]:
    out = []
    path = s.inventory.fabric.netplan_file
    for node in s.order:
        f = s.facts[node]
        ifaces, _ = _planned(s, node)
        for other, keys in conflicting_stanzas(f.netplan_files, path, ifaces).items():
            out.append(finding(NETPLAN_CONFLICT, node, f"{other} also configures the fabric",
                               evidence=f"stanza(s) for {', '.join(keys)} in {other} besides {path}: netplan merges "
                                        "them (addresses pile up)",
                               fix=f"{s.bootstrap('network')} (moves them out, backed up)"))
        assert s.plan is not None
        desired = s.plan.nodes[node].netplan
        current = next((x for x in f.netplan_files if x.path == path), None)
        if desired and (current is None or (current.content is not None and current.content != desired)):
            state = "missing" if current is None else "changed"
            out.append(finding(NETPLAN_DRIFT, node, f"{path} is {state}",
                               evidence=f"{path}: {'absent' if current is None else 'differs from the plan'} "
                                        "(`sparkctl cluster bootstrap --check --diff` shows how)",
                               fix=s.bootstrap('network')))
    return out


def check_links(s: Snapshot) -> list[Finding]:
    """Jumbo pings; a link whose ends already have a finding (MTU, address, port) is explained there."""
    out = []
    assert s.plan is not None
    size = s.inventory.fabric.mtu - 28
    for node in s.order:
        for ping in s.probe(node).pings:
            if ping.verdict == "ok":
                continue
            peer_if = next((pif for p, pif in _peer_twins(s, node, ping.interface) if p == ping.peer), None)
            if _mtu_problem(s, node, ping.interface) or (peer_if and _mtu_problem(s, ping.peer, peer_if)):
                continue
            if _end_broken(s, node, ping.interface) or (peer_if and _end_broken(s, ping.peer, peer_if)):
                continue
            duplicated = s.duplicated_ips()
            mine = {a.ip for a in s.facts[node].addresses_of(ping.interface)}
            if ping.peer_ip in duplicated or mine & duplicated:
                continue  # fabric.address_duplicate explains it (the failure is listed under it)
            if ping.verdict == "mtu":
                out.append(finding(FABRIC_JUMBO_PING, node, f"jumbo frames do not cross {ping.interface}",
                                   evidence=f"ping -M do -s {size} -I {ping.interface} {ping.peer_ip} ({ping.peer}) "
                                            "fails, a small ping passes: an MTU below "
                                            f"{s.inventory.fabric.mtu} on the path",
                                   fix="set MTU 9216 on the switch ports (the nodes are at 9000)"))
            else:
                out.append(finding(FABRIC_LINK_DEAD, node, f"no answer across {ping.interface}",
                                   evidence=f"ping -I {ping.interface} {ping.peer_ip} ({ping.peer}) gets no reply",
                                   fix=f"check the cable and {ping.peer}'s firewall; {s.bootstrap('network')}"))
    return out


def _end_broken(s: Snapshot, node: str, iface: str) -> bool:
    if node not in s.facts or s.plan is None:
        return True
    f = s.facts[node]
    planned = s.plan.fabric.addresses.get(node, {}).get(iface)
    have = {str(a) for a in f.addresses_of(iface)}
    return not f.interface_up(iface) or (planned is not None and str(planned) not in have)


def fabric_checks(s: Snapshot) -> list[Finding]:
    if s.inventory.topology == "single":
        return []
    if s.plan is None:
        return [finding(FABRIC_NO_PLAN, CLUSTER, "no fabric plan can be made",
                        evidence=s.plan_error or "", fix="see the port findings; plug the cables")]
    out = check_ports(s) + check_addresses(s) + check_mtu(s) + check_netplan(s) + check_links(s)
    if s.plan_error:
        out.append(finding(FABRIC_NO_PLAN, CLUSTER, "a node was planned from the inventory alone",
                           evidence=s.plan_error, severity="info"))
    return out


CHECKS = [fabric_checks]
