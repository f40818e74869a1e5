"""PURE: how a node's live fabric interfaces differ from the plan, and which of its interfaces are management.

One judgement for `network.netplan` (which repairs what it finds) and for doctor (which reports it), so a
doctor that says "healthy" and a bootstrap that changes nothing always agree.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable
from dataclasses import dataclass

from sparkctl.facts import Facts
from sparkctl.knowledge.spark import MANAGEMENT_NAMES

Network = ipaddress.IPv4Network | ipaddress.IPv6Network


@dataclass(frozen=True)
class InterfaceDrift:
    """One way a planned fabric interface differs from the plan.

    kind: "absent" (no such netdev), "missing" (the planned address is not there), "unplanned" (an IPv4
    address the plan does not give it, link-local ones included), "mtu".
    """

    interface: str
    kind: str
    have: str = ""
    want: str = ""

    @property
    def is_link_local(self) -> bool:
        return self.kind == "unplanned" and ipaddress.ip_interface(self.have).ip.is_link_local


def management_names(facts: Facts, hosts: Iterable[str] = ()) -> set[str]:
    """Interfaces sparkctl never configures or names in a setting: the one carrying the session, those holding
    the addresses the node is reached by, Spark's management port and Wi-Fi (by name), any other Wi-Fi."""
    names = set(MANAGEMENT_NAMES) | set(facts.management_interfaces)
    for host in hosts:
        names |= set(facts.interfaces_holding(host))
    return names | {n for n in facts.interfaces if n.startswith("wl")}


def interface_drift(facts: Facts, interfaces: Iterable[str], planned: dict[str, ipaddress.IPv4Interface],
                    mtu: int) -> list[InterfaceDrift]:
    """Per planned interface, in order: absent, or its missing planned address, its unplanned IPv4 addresses
    and a wrong MTU."""
    out = []
    for iface in interfaces:
        nic = facts.interfaces.get(iface)
        if nic is None:
            out.append(InterfaceDrift(iface, "absent"))
            continue
        want = str(planned[iface]) if iface in planned else ""
        have = [str(a) for a in nic.ipv4()]
        if want and want not in have:
            out.append(InterfaceDrift(iface, "missing", want=want))
        out += [InterfaceDrift(iface, "unplanned", have=a, want=want) for a in have if a != want]
        if nic.mtu != mtu:
            out.append(InterfaceDrift(iface, "mtu", have=str(nic.mtu), want=str(mtu)))
    return out


def twins_sharing_subnet(facts: Facts, interfaces: Iterable[str]) -> dict[Network, list[str]]:
    """Subnets that more than one fabric twin has an address in (the legacy scheme: ARP and route confusion,
    NCCL failures), with those twins in order. Link-local addresses do not count."""
    by_net: dict[Network, list[str]] = {}
    for iface in interfaces:
        for a in facts.addresses_of(iface):
            if a.family != "inet" or a.is_link_local:
                continue
            holders = by_net.setdefault(a.network, [])
            if iface not in holders:
                holders.append(iface)
    return {net: names for net, names in by_net.items() if len(names) > 1}


def management_addresses(facts: Facts) -> list[str]:
    """The node's IPv4 addresses on its management interfaces (what the container mesh must not answer on)."""
    return [a.ip for name in facts.management_interfaces if name in facts.interfaces
            for a in facts.interfaces[name].ipv4()]


WILDCARDS = ("*", "0.0.0.0", "::")


def listening_on_management(facts: Facts, port: int) -> list[str]:
    """The addresses by which `port` answers on the management network (a wildcard listener answers on all)."""
    mgmt = management_addresses(facts)
    out = []
    for address in facts.listening_addresses.get(port, []):
        if address in WILDCARDS:
            out += [a for a in mgmt if a not in out]
        elif address in mgmt and address not in out:
            out.append(address)
    return out


def exposure_script(addresses: list[str], port: int) -> str:
    """Shell (bash) that tries a TCP connection to each address's `port` from the node itself: `open <ip>` or
    `closed <ip>` per address."""
    # `exec 3<`: the connection opened by that bash itself (a bare redirection is made in a child of its own)
    return "\n".join(f"if timeout 2 bash -c 'exec 3</dev/tcp/{ip}/{int(port)}' 2>/dev/null; then echo 'open {ip}'; "
                     f"else echo 'closed {ip}'; fi" for ip in addresses if is_ipv4(ip)) or "true"


def exposed(output: str) -> list[str]:
    """The addresses exposure_script found open."""
    return [line.split()[1] for line in output.splitlines() if line.startswith("open ") and len(line.split()) == 2]


def is_ipv4(text: str) -> bool:
    try:
        return isinstance(ipaddress.ip_address(text), ipaddress.IPv4Address)
    except ValueError:
        return False
