"""PURE ssh checks: the host ssh mesh, both directions, from the probes' BatchMode logins."""

from __future__ import annotations

from sparkctl.doctor.catalog import SSH_MESH_BROKEN, SSH_MESH_UNCHECKED
from sparkctl.doctor.findings import Finding, finding
from sparkctl.doctor.snapshot import Snapshot, SshProbe

# These errors come from the far end refusing us; the others (host key, timeouts) are the near end's or the path's.
_REFUSED_BY_PEER = ("Permission denied", "Too many authentication failures")


def blame(source: str, probe: SshProbe) -> str:
    """The node a failed login points at: the target when it refused the key, else the node that tried."""
    return probe.peer if any(e in probe.error for e in _REFUSED_BY_PEER) else source


def unchecked_evidence(node: str, probe: SshProbe, command: str) -> str:
    """Why a pair whose try could not run (its sshd reset or timed out the handshake, after retries) is not
    reported as broken, nor as proven."""
    return (f"on {node}: {command}: {probe.error or 'no answer'} (the handshake was reset or timed out, tried "
            "again, same): not known to be broken")


UNCHECKED_FIX = "run doctor again; if it stays, look at the peer's load and sshd's MaxStartups"


def check_host_mesh(s: Snapshot) -> list[Finding]:
    out = []
    fix = s.bootstrap('ssh')
    for node in s.order:
        for probe in s.probe(node).ssh:
            if probe.ok or s.link_broken(node, probe.peer, probe.target):
                continue
            if probe.unchecked:
                out.append(finding(SSH_MESH_UNCHECKED, node,
                                   f"ssh {node} -> {probe.peer} could not be checked",
                                   evidence=unchecked_evidence(node, probe, f"ssh -o BatchMode=yes {probe.target} "
                                                               "true"), fix=UNCHECKED_FIX))
                continue
            where = blame(node, probe)
            out.append(finding(SSH_MESH_BROKEN, where, f"ssh {node} -> {probe.peer} fails",
                               evidence=f"on {node}: ssh -o BatchMode=yes {probe.target} true: "
                                        f"{probe.error or 'failed'}; expected a passwordless login",
                               fix=fix))
    return out


CHECKS = [check_host_mesh]
