"""PURE container checks: present, running, as planned, its port, its NCCL/UCX/Open MPI env, its ssh mesh.

The env comparison is verify.fabric's own (sparkctl.rules.interface_settings), mapped to doctor's ids.
"""

from __future__ import annotations

import re

from sparkctl.doctor.catalog import (
    CONTAINER_EXITED,
    CONTAINER_MISSING,
    CONTAINER_RESTARTING,
    CONTAINER_SPEC_DRIFT,
    CONTAINER_SSH_BROKEN,
    CONTAINER_SSH_EXPOSED,
    CONTAINER_SSH_UNCHECKED,
    CONTAINER_UNREAD,
    FINDINGS,
    PORT_TAKEN,
)
from sparkctl.doctor.checks.ssh import UNCHECKED_FIX, blame, unchecked_evidence
from sparkctl.doctor.findings import Finding, Phase, finding
from sparkctl.doctor.snapshot import Snapshot
from sparkctl.engines import Engine, EngineName
from sparkctl.facts import ContainerInfo
from sparkctl.plan.container import SPEC_LABEL
from sparkctl.rules.container import SSHD_NAMES, spec_differences
from sparkctl.rules.interface_settings import Mismatch, node_mismatches

PHASE: Phase = "container"



def _restarting(info: ContainerInfo) -> bool:
    return info.status == "restarting" or (info.running and info.restart_count > 2)


def running_container(s: Snapshot, node: str) -> ContainerInfo | None:
    """The container, when it runs for good (one that keeps restarting is container.restarting, and what fails
    with it — its ssh, its hostfile — is explained there)."""
    info = s.facts[node].containers.get(s.inventory.container.name)
    return info if info is not None and info.exists and info.running and not _restarting(info) else None


def _logs(s: Snapshot, node: str) -> tuple[str, ...]:
    return tuple(s.probe(node).container_logs.splitlines()[-10:])


def _port_owner(s: Snapshot, node: str, port: int) -> str | None:
    probe = s.probe(node)
    if port in probe.port_owners:
        return probe.port_owners[port]
    if port in s.facts[node].listening_tcp:
        return s.facts[node].listening_tcp[port] or "an unknown process"
    return None


def check_containers(s: Snapshot) -> list[Finding]:
    out = []
    name = s.inventory.container.name
    port = int(s.inventory.container.ssh_port)
    for node in s.order:
        f = s.facts[node]
        if not f.docker_access:
            continue  # node.docker_group / node.docker_missing say why
        info = f.containers.get(name)
        if info is not None and info.status == "unknown":
            out.append(finding(CONTAINER_UNREAD, node, f"the state of container {name} could not "
                               "be read", evidence=f"{info.error or '`docker inspect` did not say'}: not known to "
                               "be missing or stopped", fix=f"run doctor again; `docker inspect {name}` on the node "
                               "shows what docker says"))
            continue
        owner = _port_owner(s, node, port)
        # without sudo, ss names no process: a running container's port is then taken to be its own sshd
        foreign = owner is not None and not owner.startswith(SSHD_NAMES) and not (
            owner == "an unknown process" and info is not None and info.running)
        if foreign or (owner is not None and (info is None or not info.running)):
            out.append(finding(PORT_TAKEN, node, f"port {port} (container ssh) is taken by {owner}",
                               evidence=f"{owner} listens on {port}; the container's sshd must listen there, or the "
                                        "container exits at once",
                               fix=f"stop {owner} on {node} (sudo ss -ltnp 'sport = :{port}'), or set "
                                   "container.ssh_port to a free port", details=_logs(s, node)))
            continue
        if info is None or not info.exists:
            out.append(finding(CONTAINER_MISSING, node, f"container {name} does not exist",
                               evidence=f"`docker inspect {name}` finds nothing; expected it running",
                               fix=s.bootstrap('container')))
            continue
        if _restarting(info):
            out.append(finding(CONTAINER_RESTARTING, node, f"container {name} keeps restarting",
                               evidence=f"status {info.status}, {info.restart_count} restarts",
                               fix=f"docker logs {name} on {node}; then {s.bootstrap('container')}",
                               details=_logs(s, node)))
            continue
        if not info.running:
            out.append(finding(CONTAINER_EXITED, node, f"container {name} is not running",
                               evidence=f"status {info.status}; expected running",
                               fix=f"{s.bootstrap('container')} (docker logs {name} shows why it stopped)",
                               details=_logs(s, node)))
        if s.plan is None:
            continue
        spec = s.plan.nodes[node].container
        differences = spec_differences(spec, info)
        # env settings that do not fit the node are reported as env.* findings, with the reason
        explained = {m.setting for m in node_mismatches(node, info.env, f, s.inventory.engine())}
        rest = [d for d in differences if not any(d.startswith(f"env {k}:") for k in explained)]
        if rest or (not differences and info.labels.get(SPEC_LABEL) != spec.spec_hash()):
            out.append(finding(CONTAINER_SPEC_DRIFT, node, f"container {name} differs from the plan",
                               evidence="; ".join(rest) or "spec label differs (docker args or entrypoint)",
                               fix=f"{s.bootstrap('container')} (recreates it; --check --diff shows what differs)"))
    return out


#: each engine's finding for a rank whose own address or control interface (Engine.own_settings) is off the fabric
_WRONG_ADDRESS: dict[EngineName, str] = {"vllm": "vllm.wrong_nic", "sglang": "sglang.wrong_address"}


def _env_id(m: Mismatch, engine: Engine) -> str:
    if m.setting in engine.own_settings():
        return _WRONG_ADDRESS[engine.name]
    if m.setting == "NCCL_IB_HCA":
        return "nccl.ib_hca_missing" if "does not exist" in m.has or m.names == "(unset)" else \
            "nccl.ib_hca_partial" if "leaves out" in m.has else "env.iface_down"
    if m.names == "(unset)" or m.names == "all":
        return "env.unset"
    if "management" in m.has:
        return "env.management_iface"
    if "is Down" in m.has or "which is Down" in m.has:
        return "env.iface_down"
    return "env.iface_absent"


_DOWN = re.compile(r"(\S+) is Down|maps to (\S+), which is Down|(?:device )?([^\s:]+)(?::\d+)? does not exist|"
                   r"no interface matches '([^']+)'")


def _port_explains(s: Snapshot, node: str, m: Mismatch) -> bool:
    """A planned fabric twin (or its RoCE device) that is Down or missing: the fabric finding reports the port,
    the env itself is right."""
    hit = _DOWN.search(m.has)
    if not hit or s.plan is None:
        return False
    ports = s.plan.fabric.ports[node]
    f = s.facts[node]
    broken = {i for i in ports.interfaces if not f.interface_up(i)}
    broken |= {dev for dev, i in zip(ports.roce_devices, ports.interfaces, strict=False) if i in broken}
    return next(g for g in hit.groups() if g) in broken


def check_env(s: Snapshot) -> list[Finding]:
    out: list[Finding] = []
    if s.inventory.topology == "single":
        return out  # no fabric: NCCL and Open MPI stay on the node
    engine = s.inventory.engine()
    for node in s.order:
        info = running_container(s, node)
        if info is None:
            continue
        for m in node_mismatches(node, info.env, s.facts[node], engine):
            if _port_explains(s, node, m):
                continue
            out.append(finding(FINDINGS[_env_id(m, engine)], node, f"container env {m.setting} does not fit {node}",
                               evidence=f"{m.setting}={m.names}: {m.has}",
                               fix=f"{m.fix}: {s.bootstrap('container')}", phase=PHASE, severity=m.severity))
    return out


def check_container_ssh(s: Snapshot) -> list[Finding]:
    out = []
    for node in s.order:
        if running_container(s, node) is None:
            continue
        for probe in s.probe(node).container_ssh:
            if probe.ok:
                continue
            if probe.peer not in s.facts or running_container(s, probe.peer) is None:
                continue  # the peer's container is down: reported there
            if s.link_broken(node, probe.peer, probe.target):
                continue  # the address is not Up on the peer: the fabric findings say why
            if probe.unchecked:
                out.append(finding(CONTAINER_SSH_UNCHECKED, node,
                                   f"ssh from {node}'s container to {probe.peer}'s could not be checked",
                                   evidence=unchecked_evidence(node, probe, f"ssh {probe.target} true (in the "
                                                               "container)"), fix=UNCHECKED_FIX))
                continue
            out.append(finding(CONTAINER_SSH_BROKEN, blame(node, probe),
                               f"ssh from {node}'s container to {probe.peer}'s fails",
                               evidence=f"in {node}'s container: ssh {probe.target} true: {probe.error or 'failed'}; "
                                        "mpirun needs it",
                               fix=s.bootstrap('container')))
    return out


def check_exposure(s: Snapshot) -> list[Finding]:
    port = int(s.inventory.container.ssh_port)
    return [finding(CONTAINER_SSH_EXPOSED, node, "the container's sshd answers on the management address",
                    evidence=f"a TCP connection to {ip}:{port} from {node} is accepted; the mesh belongs on the "
                             "fabric (an older sparkctl or a hand-started container listens everywhere)",
                    fix=f"{s.bootstrap('container')} (recreates it listening on the fabric addresses only)")
            for node in s.order if running_container(s, node) is not None for ip in s.probe(node).exposed]


CHECKS = [check_containers, check_env, check_container_ssh, check_exposure]
