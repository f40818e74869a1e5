"""PURE: what answers on each node's management network that is not meant to. Each node's listeners that hold its
management address (or every address) were asked from another node of the cluster (a lone node's from this
machine); a port that accepted is a finding unless it is sshd's, the endpoint's on the head, or one firewall.allow
lets in. The container's sshd is check_exposure's (container.py)."""

from __future__ import annotations

from sparkctl.doctor.catalog import NODE_EXPOSED_PORT
from sparkctl.doctor.findings import Finding, finding
from sparkctl.doctor.snapshot import Snapshot
from sparkctl.rules.serving import serving_enabled


def meant_ports(s: Snapshot, node: str) -> set[int]:
    """The ports that answer on the node's management network by design."""
    inventory = s.inventory
    meant = {inventory.ssh_target(node).port, int(inventory.container.ssh_port)}
    if node == inventory.head.name and serving_enabled(inventory):
        meant.add(inventory.endpoint_port())
    if inventory.firewall != "off":
        for span in inventory.firewall.spans():
            if span.proto == "tcp":
                meant |= set(range(span.first, span.last + 1))
    return meant


def check_exposed_ports(s: Snapshot) -> list[Finding]:
    out = []
    for asker in s.order:
        for node, ip, port in s.probe(asker).answered:
            if node not in s.facts or port in meant_ports(s, node):
                continue
            owner = s.facts[node].listening_tcp.get(port) or "a process sparkctl could not name (sudo shows it)"
            where = "this machine" if asker == node else asker
            off = s.inventory.firewall == "off"
            fix = ("remove `firewall: off` and rerun bootstrap: sparkctl's firewall drops it" if off else
                   f"{s.bootstrap('network.firewall')} (sparkctl's firewall drops it)")
            out.append(finding(
                # with sparkctl's firewall on, something undid it; off, the user chose to leave the nodes open
                NODE_EXPOSED_PORT, node, f"port {port} ({owner}) answers on {node}'s management network",
                severity="warning" if off else None,
                evidence=f"a TCP connection from {where} to {ip}:{port} is accepted; {owner} listens there",
                fix=f"{fix}; if it is meant to answer, add {port}/tcp to firewall.allow; else bind it to loopback or "
                    "a fabric address, or stop it"))
    return out


CHECKS = [check_exposed_ports]
