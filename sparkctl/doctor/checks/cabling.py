"""PURE cabling checks: a cable LLDP sees somewhere the inventory does not want it; a node whose lldpd cannot be
read (its ports' far ends are then inferred from carrier, or seen from the other end)."""

from __future__ import annotations

from sparkctl.doctor.catalog import FABRIC_CABLE_WRONG, FABRIC_LLDP_UNAVAILABLE
from sparkctl.doctor.findings import Finding, Phase, finding
from sparkctl.doctor.snapshot import Snapshot
from sparkctl.rules.cabling import CablingMap, cabling_map

PHASE: Phase = "preflight"
LLDPD_INSTALL = "sudo apt-get install lldpd && sudo systemctl enable --now lldpd"


def snapshot_cabling(s: Snapshot) -> CablingMap | None:
    if s.inventory.topology == "single":
        return None
    return cabling_map(s.inventory, s.facts)


def check_cabling(s: Snapshot) -> list[Finding]:
    cabling = snapshot_cabling(s)
    if cabling is None:
        return []
    out = []
    reorder = s.inventory.topology == "ring"
    for row in cabling.problems:
        out.append(finding(FABRIC_CABLE_WRONG, row.node, f"port {row.port} is cabled to another place "
                                                                   "than the inventory says",
                           evidence=row.problem,
                           fix=("move the cable, or reorder `nodes:` in the inventory to the cabling "
                                "(`sparkctl inventory init <hosts>` writes the order LLDP sees)") if reorder else
                               "move the cable as the evidence says (a person must: sparkctl cannot move cables)"))
    for node, why in cabling.lldp_unavailable.items():
        out.append(finding(FABRIC_LLDP_UNAVAILABLE, node, "the cabling map is inferred for this node "
                                                                    "(LLDP cannot be read)",
                           evidence=why, fix=f"optional, a person's choice (lldpd announces the node on every "
                                             f"link): {LLDPD_INSTALL}"))
    return out


CHECKS = [check_cabling]
