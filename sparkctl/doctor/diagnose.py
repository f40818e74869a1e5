"""Every doctor check over one snapshot (PURE): a check that crashes is itself reported, never fatal."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import replace

from sparkctl.doctor.catalog import DOCTOR_CHECK_FAILED, DOCTOR_OUTSIDE_UNREADABLE
from sparkctl.doctor.checks import bench as checks_bench
from sparkctl.doctor.checks import cabling as checks_cabling
from sparkctl.doctor.checks import container as checks_container
from sparkctl.doctor.checks import exposure as checks_exposure
from sparkctl.doctor.checks import fabric as checks_fabric
from sparkctl.doctor.checks import mpi as checks_mpi
from sparkctl.doctor.checks import networkmanager as checks_nm
from sparkctl.doctor.checks import node as checks_node
from sparkctl.doctor.checks import overrides as checks_overrides
from sparkctl.doctor.checks import ranks as checks_ranks
from sparkctl.doctor.checks import roce as checks_roce
from sparkctl.doctor.checks import serve as checks_serve
from sparkctl.doctor.checks import ssh as checks_ssh
from sparkctl.doctor.checks import system as checks_system
from sparkctl.doctor.checks import tls as checks_tls
from sparkctl.doctor.checks import vllm as checks_vllm
from sparkctl.doctor.findings import CLUSTER, Diagnosis, Finding, finding, sort_findings
from sparkctl.doctor.snapshot import Snapshot
from sparkctl.inventory.placement import World

log = logging.getLogger(__name__)

CHECKS: list[Callable[[Snapshot], list[Finding]]] = [
    *checks_node.CHECKS, *checks_cabling.CHECKS, *checks_fabric.CHECKS, *checks_nm.CHECKS, *checks_ssh.CHECKS,
    *checks_container.CHECKS, *checks_exposure.CHECKS, *checks_mpi.CHECKS, *checks_serve.CHECKS, *checks_tls.CHECKS,
    *checks_bench.CHECKS, *checks_system.CHECKS,
    *checks_roce.CHECKS, *checks_overrides.CHECKS, *checks_ranks.CHECKS, *checks_vllm.CHECKS,
]
#: The checks of one serving world (its server, unit, collector, NCCL lines, ranks): with several worlds, run on each
#: world's view of the snapshot (Snapshot.for_world), their findings naming the model
WORLD_CHECKS: frozenset[Callable[[Snapshot], list[Finding]]] = frozenset({
    checks_serve.check_server, checks_serve.check_unit, checks_serve.check_collector, checks_serve.check_nccl,
    checks_ranks.check_rendezvous, checks_ranks.check_flags, checks_vllm.check_ranks_one_node})


def run_checks(snapshot: Snapshot) -> Diagnosis:
    findings: list[Finding] = []
    worlds = snapshot.inventory.worlds()
    several = len(worlds) > 1
    for check in CHECKS:
        if several and check in WORLD_CHECKS:
            for world in worlds:
                named = _named_world(snapshot, world)
                findings += [replace(f, summary=f"{named}: {f.summary}")
                             for f in _run(check, snapshot.for_world(world))]
        else:
            findings += _run(check, snapshot)
    nodes = snapshot.diagnosed
    if snapshot.limit is not None:
        findings = [f for f in findings if f.node in snapshot.limit or f.node == CLUSTER]
        findings += outside_unreadable(snapshot)
    try:
        cabling = checks_cabling.snapshot_cabling(snapshot)
    except Exception:  # noqa: BLE001 - the map is a view; check_cabling has reported why it failed
        cabling = None
    return Diagnosis(sort_findings(findings, nodes), nodes=nodes, cabling=cabling)


def _run(check: Callable[[Snapshot], list[Finding]], snapshot: Snapshot) -> list[Finding]:
    try:
        return check(snapshot)
    except Exception as exc:  # noqa: BLE001 - one broken check must not hide the others' findings
        log.debug("check %s failed", check.__name__, exc_info=True)
        return [finding(DOCTOR_CHECK_FAILED, CLUSTER, f"check {check.__name__} failed",
                        evidence=f"{type(exc).__name__}: {exc}",
                        fix="please report this with `sparkctl doctor --bundle`")]


def _named_world(snapshot: Snapshot, world: World) -> str:
    """A world as findings name it: its model's name, and its replica's number when it has several."""
    replicas = sum(1 for w in snapshot.inventory.worlds() if w.model == world.model)
    return world.model + (f" (replica {world.replica + 1})" if replicas > 1 else "")


def outside_unreadable(snapshot: Snapshot) -> list[Finding]:
    """--limit: a node outside it that could not be read leaves the cluster-wide checks without its side."""
    return [finding(DOCTOR_OUTSIDE_UNREADABLE, CLUSTER,
                    f"{node} (outside --limit) could not be read: what the cluster shares is judged without it",
                    evidence=why, fix=f"bring {node} back, then run doctor again")
            for node, why in snapshot.unreachable.items() if node not in (snapshot.limit or ())]
