"""PURE: sparkctl's firewall on a node (docs/firewall.md): its own nftables table, `inet sparkctl`, whose input
chain drops what comes from outside the cluster but sshd, the endpoint on the head, established traffic, ICMP,
DHCP's answers and `firewall.allow`; the fabric twins and loopback keep everything. DGX OS ships the nftables
backend (iptables-nft): Docker's rules are tables of their own, and a table of sparkctl's own never touches them.

Loaded by `nft -f` (one transaction that replaces the table whole), kept in /etc/sparkctl/firewall.nft and loaded
at boot by a oneshot unit of its own. What the node really holds is the table in `nft list ruleset` (the facts read
it; its rules keep no counters, so a listing changes only with a rule), whose sha256 right after a load is recorded
beside the file: a listing that differs later is drift.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass

from sparkctl.facts.firewall_files import INSTALL_TARGET, RULES_PATH, TABLE, UNIT_NAME
from sparkctl.inventory import Inventory
from sparkctl.plan.fabric import FabricPlan
from sparkctl.plan.render import render

#: what reads the table as the node holds it (root: nft needs CAP_NET_ADMIN even to list)
LIST_COMMAND = f"nft list table inet {TABLE}"


@dataclass(frozen=True)
class FirewallSpec:
    cluster: str
    node: str
    #: interfaces whose traffic is all let in: the node's fabric twins
    fabric: tuple[str, ...]
    ssh_port: int
    #: firewall.ssh_from split by family; None: sshd from anywhere
    ssh_from: tuple[str, ...] | None
    #: ports let in on the management side: "8355", "9100-9110"
    tcp: tuple[str, ...]
    udp: tuple[str, ...]

    def rules(self) -> str:
        v4 = v6 = None
        if self.ssh_from is not None:
            v4 = [n for n in self.ssh_from if ipaddress.ip_network(n).version == 4]
            v6 = [n for n in self.ssh_from if ipaddress.ip_network(n).version == 6]
        return render("firewall.nft.j2", cluster=self.cluster, node=self.node, unit=UNIT_NAME, table=TABLE,
                      fabric=self.fabric, ssh_port=self.ssh_port, ssh_v4=v4, ssh_v6=v6, tcp=self.tcp, udp=self.udp)

    def unit(self) -> str:
        return render("firewall.service.j2", cluster=self.cluster, rules=RULES_PATH, wanted_by=INSTALL_TARGET)

    def summary(self) -> str:
        """What answers on the management side, in words."""
        ssh = f"sshd :{self.ssh_port}" + (f" from {', '.join(self.ssh_from)}" if self.ssh_from else "")
        ports = [f"{p}/tcp" for p in self.tcp] + [f"{p}/udp" for p in self.udp]
        return ", ".join([ssh, *ports])


def firewall_spec(inventory: Inventory, node: str, fabric: FabricPlan, serving: bool) -> FirewallSpec | None:
    """The node's firewall; None with `firewall: off`. `serving`: the head lets in the endpoint's port."""
    settings = inventory.firewall
    if settings == "off":
        return None
    target = inventory.ssh_target(node)
    tcp: list[str] = []
    if node == inventory.head.name and serving:
        tcp.append(str(inventory.endpoint_port()))  # the gateway's
    udp: list[str] = []
    for span in settings.spans():
        (udp if span.proto == "udp" else tcp).append(span.nft)
    ports = fabric.ports.get(node)
    return FirewallSpec(cluster=inventory.cluster.name, node=node, fabric=tuple(ports.interfaces) if ports else (),
                        ssh_port=target.port, ssh_from=tuple(settings.ssh_from) if settings.ssh_from else None,
                        tcp=tuple(dict.fromkeys(tcp)), udp=tuple(dict.fromkeys(udp)))
