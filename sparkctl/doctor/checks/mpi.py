"""PURE MPI checks: the hostfile in every container names, in order, addresses its nodes really own."""

from __future__ import annotations

from sparkctl.doctor.catalog import MPI_HOSTFILE_MISMATCH
from sparkctl.doctor.checks.container import running_container
from sparkctl.doctor.findings import Finding, Phase, finding
from sparkctl.doctor.snapshot import Snapshot
from sparkctl.plan.paths import HOSTFILE_PATH
from sparkctl.rules.interface_settings import hostfile_mismatches

PHASE: Phase = "mpi"


def check_hostfiles(s: Snapshot) -> list[Finding]:
    out: list[Finding] = []
    fix = s.bootstrap('mpi')
    order = s.order
    running = {n: c for n in order if (c := running_container(s, n)) is not None}
    # the PLANNED env: a container env that does not fit its node is an env.* finding of its own
    envs = {n: (s.plan.nodes[n].container.env if s.plan else c.env) for n, c in running.items()}
    if len(order) < 2:
        return []
    for node in order:
        text = s.probe(node).container_hostfile
        if node not in envs or text is None:
            continue
        if not text.strip():
            out.append(finding(MPI_HOSTFILE_MISMATCH, node, f"no hostfile in {node}'s container",
                               evidence=f"{HOSTFILE_PATH} is missing or empty; expected one fabric address per node",
                               fix=fix))
            continue
        problems = hostfile_mismatches(order, text, envs, s.facts)
        lines = [ln.split()[0] for ln in text.splitlines() if ln.strip() and not ln.startswith("#")]
        if len(lines) > len(order) and len(order) == len(s.all_nodes):
            extra = ", ".join(lines[len(order):])
            out.append(finding(MPI_HOSTFILE_MISMATCH, node, f"the hostfile in {node}'s container has "
                               "more lines than nodes", evidence=f"extra: {extra}", fix=fix))
        for m in problems:
            if _down_twin_explains(s, m.node, m.names):
                continue
            out.append(finding(MPI_HOSTFILE_MISMATCH, node,
                               f"the hostfile in {node}'s container does not match {m.node}",
                               evidence=f"{HOSTFILE_PATH} {m.names}: {m.has}", fix=fix))
    return out


def _down_twin_explains(s: Snapshot, node: str, names: str) -> bool:
    """The line is the node's planned address on a twin that is Down (its address went with it):
    fabric.port_down reports that; the hostfile itself is right."""
    if s.plan is None or node not in s.facts:
        return False
    ip = names.split()[-1]
    return any(str(a.ip) == ip and not s.facts[node].interface_up(iface)
               for iface, a in s.plan.fabric.addresses.get(node, {}).items())


CHECKS = [check_hostfiles]
