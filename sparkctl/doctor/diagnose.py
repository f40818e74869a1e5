"""One doctor pass: connect, gather facts once per node, plan, probe (one round trip per node), check."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from sparkctl.doctor import checks_container, checks_fabric, checks_mpi, checks_node, checks_serve, checks_ssh
from sparkctl.doctor.findings import CLUSTER, Diagnosis, Finding, sort_findings
from sparkctl.doctor.probes import run_probes
from sparkctl.doctor.snapshot import Snapshot, doctor_plan
from sparkctl.errors import BadInput
from sparkctl.facts import gather_facts
from sparkctl.session import node_specs
from sparkctl.transport.connect import connect_all

log = logging.getLogger(__name__)

CHECKS: list[Callable[[Snapshot], list[Finding]]] = [
    *checks_node.CHECKS, *checks_fabric.CHECKS, *checks_ssh.CHECKS, *checks_container.CHECKS,
    *checks_mpi.CHECKS, *checks_serve.CHECKS,
]


@dataclass
class DoctorRequest:
    limit: set[str] | None = None
    forks: int = 32
    become_password: str | None = None
    #: also read the containers' logs (for a support bundle)
    want_logs: bool = False


def run_checks(snapshot: Snapshot) -> Diagnosis:
    """PURE: every check over one snapshot. A check that crashes is itself reported, never fatal."""
    findings: list[Finding] = []
    for check in CHECKS:
        try:
            findings += check(snapshot)
        except Exception as exc:  # noqa: BLE001 - one broken check must not hide the others' findings
            log.debug("check %s failed", check.__name__, exc_info=True)
            findings.append(Finding("doctor.check_failed", "warning", CLUSTER, f"check {check.__name__} failed",
                                    evidence=f"{type(exc).__name__}: {exc}",
                                    fix="please report this with `sparkctl doctor --bundle`"))
    nodes = snapshot.all_nodes
    return Diagnosis(sort_findings(findings, nodes), nodes=nodes)


def take_snapshot(inventory: Any, request: DoctorRequest) -> Snapshot:
    known = {n.name for n in inventory.nodes}
    if request.limit and request.limit - known:
        raise BadInput(f"--limit: no node named {', '.join(sorted(request.limit - known))} in the inventory",
                       hint=f"nodes: {', '.join(sorted(known))}")
    specs = [s for s in node_specs(inventory) if not request.limit or s.node in request.limit]
    ssh = inventory.ssh
    transports, unreachable_exc = connect_all(
        specs, forks=request.forks, known_hosts_path=ssh.known_hosts, use_ssh_config=ssh.use_ssh_config,
        connect_timeout=ssh.connect_timeout, become_password=request.become_password)
    unreachable = {n: str(e) for n, e in unreachable_exc.items()}
    try:
        before = time.time()
        facts = _gather(inventory, transports, request.forks, unreachable)
        after = time.time()
        plan, plan_error = doctor_plan(inventory, facts)
        probes = run_probes({n: t for n, t in transports.items() if n in facts}, inventory, plan, facts,
                            want_logs=request.want_logs, forks=request.forks)
        for node, probe in probes.items():
            if probe.error and "connection lost" in probe.error:
                unreachable[node] = probe.error  # powered off between the facts and the probes
                facts.pop(node, None)
    finally:
        for t in transports.values():
            t.close()
    order = [n.name for n in inventory.nodes]
    return Snapshot(inventory, {n: facts[n] for n in order if n in facts},
                    {n: unreachable[n] for n in order if n in unreachable}, probes, plan, plan_error,
                    become_password_given=bool(request.become_password), controller_time=(before + after) / 2,
                    controller_time_slack=(after - before) / 2)


def _gather(inventory: Any, transports: dict, forks: int, unreachable: dict[str, str]) -> dict:
    def one(name: str):
        try:
            facts = gather_facts(transports[name], name, container_names=(inventory.container.name,),
                                 image_refs=(inventory.container.image,), hf_cache=inventory.container.hf_cache,
                                 reach_addrs=(str(inventory.node(name).host),))
        except Exception as exc:  # noqa: BLE001 - a node lost while gathering is unreachable, the rest go on
            return name, None, str(exc) or type(exc).__name__
        if not facts.user and not facts.hostname:
            return name, None, f"{name}: the node stopped answering while its facts were read"
        return name, facts, None

    facts = {}
    if not transports:
        return facts
    with ThreadPoolExecutor(max_workers=max(1, min(forks, len(transports)))) as pool:
        for name, got, error in pool.map(one, list(transports)):
            if got is None:
                unreachable[name] = error
            else:
                facts[name] = got
    return facts


def diagnose(inventory: Any, request: DoctorRequest | None = None) -> tuple[Diagnosis, Snapshot]:
    snapshot = take_snapshot(inventory, request or DoctorRequest())
    return run_checks(snapshot), snapshot
