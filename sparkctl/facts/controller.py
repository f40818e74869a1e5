"""The controller's own addresses: which of a node's interfaces carry the path back to sparkctl."""

from __future__ import annotations

import netifaces


def gather_local_controller_addrs(*, include_loopback: bool = True) -> list[str]:
    """Every IPv4 address of this machine (the one running sparkctl), loopback first when included."""
    addrs: list[str] = []
    for ifname in netifaces.interfaces():
        for entry in netifaces.ifaddresses(ifname).get(netifaces.AF_INET, []):
            ip = entry.get("addr")
            if not ip or ip in addrs or (not include_loopback and ip.startswith("127.")):
                continue
            addrs.append(ip)
    return addrs
