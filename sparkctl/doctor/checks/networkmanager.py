"""PURE NetworkManager checks, where nmcli answers: a profile competing with netplan's for a fabric twin, a twin
NetworkManager renders but does not manage, NetworkManager stopped while it renders the fabric."""

from __future__ import annotations

import shlex

from sparkctl.doctor.catalog import NM_COMPETING_PROFILE, NM_NOT_RUNNING, NM_TWIN_UNMANAGED, NM_UNREAD
from sparkctl.doctor.findings import Finding, Phase, finding
from sparkctl.doctor.snapshot import Snapshot
from sparkctl.rules.fabric import management_names
from sparkctl.rules.networkmanager import competing_profiles, nm_renders, unmanaged_twins

PHASE: Phase = "network"


def _planned_twins(s: Snapshot, node: str) -> list[str]:
    assert s.plan is not None
    return list(s.plan.fabric.ports[node].interfaces)


def check_networkmanager(s: Snapshot) -> list[Finding]:
    if s.inventory.topology == "single" or s.plan is None:
        return []
    out = []
    fix = s.bootstrap("network")
    for node in s.order:
        f = s.facts[node]
        if f.nm is None:
            continue
        twins = _planned_twins(s, node)
        if f.nm.status == "error":
            # nmcli gave no answer to read (timed out on a loaded node, or an error other than "not running"):
            # nothing is known about NetworkManager, so nothing is reported broken
            if nm_renders(f.netplan_files, twins):
                out.append(finding(NM_UNREAD, node,
                                   "NetworkManager's state could not be read (nmcli gave no usable answer)",
                                   evidence=f"nmcli: {f.nm.detail or 'no answer'}",
                                   fix="run doctor again; `nmcli device status` on the node shows whether it "
                                       "answers"))
            continue
        if not f.nm.running:
            if nm_renders(f.netplan_files, twins):
                out.append(finding(NM_NOT_RUNNING, node,
                                   "NetworkManager renders the fabric's netplan but is not running",
                                   evidence=f"nmcli: {f.nm.detail or f.nm.status}; netplan renders "
                                            f"{', '.join(twins)} with NetworkManager",
                                   fix="sudo systemctl enable --now NetworkManager"))
            continue
        management = management_names(f, hosts=[s.node(node).host])
        for c in competing_profiles(f, twins, management):
            p = c.profile
            out.append(finding(NM_COMPETING_PROFILE, node,
                               f"NetworkManager profile {p.name!r} competes with netplan's for {c.interface}",
                               evidence=f"{p.name} ({p.uuid}, {p.filename}): {c.why}; NetworkManager activates "
                                        "it instead of netplan's profile when it chooses again",
                               fix=f"{fix} (removes it, backed up), or sudo nmcli connection delete uuid "
                                   f"{shlex.quote(p.uuid)}"))
        for twin in unmanaged_twins(f, twins):
            out.append(finding(NM_TWIN_UNMANAGED, node,
                               f"NetworkManager renders {twin} but does not manage it",
                               evidence=f"nmcli device: {twin} unmanaged; netplan renders {twin} with "
                                        "NetworkManager, so its profile never activates there",
                               fix=f"{fix} (netplan apply resets NetworkManager's device state); if it stays "
                                   "unmanaged, look for unmanaged-devices in /etc/NetworkManager/ and NM_UNMANAGED "
                                   "in udev rules"))
    return out


CHECKS = [check_networkmanager]
