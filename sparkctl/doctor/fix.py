"""--fix: which bootstrap tasks own each finding (the repair is a bootstrap run of just those: runs/doctor.py)."""

from __future__ import annotations

from sparkctl.doctor.findings import Diagnosis, Finding
from sparkctl.engine import Graph

# Finding id (or id prefix ending in ".") -> bootstrap tasks or phases that repair it. Not listed: sparkctl
# cannot repair it (a cable, an account, a foreign process); the finding's fix says what to do by hand.
FIX_TASKS: dict[str, tuple[str, ...]] = {
    "fabric.address_": ("network.netplan", "network.verify"),
    "fabric.link_local": ("network.netplan", "network.verify"),
    "fabric.twins_same_subnet": ("network.netplan", "network.verify"),
    "fabric.mtu_mismatch": ("network.netplan", "network.verify"),
    "netplan.": ("network.netplan", "network.verify"),
    "ssh.mesh_broken": ("ssh.keys", "ssh.mesh", "ssh.verify"),
    "container.missing": ("container", "mpi"),
    "container.exited": ("container", "mpi"),
    "container.restarting": ("container", "mpi"),
    "container.spec_drift": ("container", "mpi"),
    "container.ssh_broken": ("container.state", "container.ssh"),
    "container.ssh_exposed": ("container", "mpi"),
    "env.": ("container", "mpi"),
    "nccl.ib_hca_missing": ("container", "mpi"),
    "nccl.socket_fallback": ("container", "mpi"),
    "mpi.": ("mpi",),
    "model.": ("model",),
    "hf.token_missing": ("model",),
    "serve.": ("serve",),
}


def tasks_for(finding: Finding) -> tuple[str, ...]:
    for key, tasks in FIX_TASKS.items():
        if finding.id == key or (key.endswith(".") or key.endswith("_")) and finding.id.startswith(key):
            return tasks
    return ()


def repair_selection(diagnosis: Diagnosis, graph: Graph) -> tuple[set[str], list[Finding]]:
    """(tasks/phases to run with --only, the errors sparkctl cannot repair). Entries the graph lacks (a phase
    not built yet) count as not repairable."""
    only: set[str] = set()
    manual: list[Finding] = []
    for finding in diagnosis.errors:
        known = [t for t in tasks_for(finding) if t in graph or t in graph.phases]
        if known:
            only.update(known)
        else:
            manual.append(finding)
    return only, manual
