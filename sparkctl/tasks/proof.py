"""The MPI proof on record: a no-op rerun does not run mpirun again when nothing it depends on changed since the
last probe that passed.

What the probe depends on, fingerprinted from what the run already read (facts, plan): sparkctl's version, the
probe program and its mpirun line, the node order and the planned hostfile; per node its hostname, its
container (id, image, start time, restarts, status, every env value), each planned fabric interface (state,
carrier, MTU, IPv4 addresses), its fabric routes and forwarding, and its firewall rules. Proven live every run
instead, before the MPI phase: the container ssh mesh (container.ssh) and each container's hostfile
(mpi.hostfile). The record is not used when anything changed earlier in the same run, when it is older
than MAX_AGE_S, or with --reprove.
"""

from __future__ import annotations

import hashlib
import json
import time
from typing import Any

from sparkctl import __version__
from sparkctl.plan.mpi import mpirun_line, probe_program, probe_source
from sparkctl.tasks.context import ClusterContext

KEY = "mpi"
#: A proof older than this is made again whatever the fingerprint says.
MAX_AGE_S = 24 * 3600.0


def mpi_fingerprint(ctx: ClusterContext) -> str:
    """sha256 of everything the MPI probe's verdict depends on (see the module doc), from the current facts."""
    inv = ctx.inventory
    plan = ctx.plan()
    order = [n.name for n in inv.nodes]
    nodes: list[Any] = []
    for name in order:
        facts = ctx.nodes[name].facts() if name in ctx.nodes else None
        if facts is None:
            nodes.append([name, None])
            continue
        info = facts.containers.get(inv.container.name)
        container = None if info is None else [info.id, info.image_id, info.started_at, info.restart_count,
                                               info.status, sorted(info.env.items())]
        interfaces = []
        for iface in plan.fabric.ports[name].interfaces if name in plan.fabric.ports else ():
            nic = facts.interfaces.get(iface)
            interfaces.append([iface, None if nic is None else
                               [nic.operstate, nic.carrier, nic.mtu, sorted(str(a) for a in nic.ipv4())]])
        planned = plan.fabric.ports[name].interfaces if name in plan.fabric.ports else ()
        conf = {k: v for k, v in facts.ipv4_conf.items()
                if k == "ip_forward" or k.split(".")[0] in (*planned, "all", "default")}
        nodes.append([name, facts.hostname, container, interfaces, sorted(str(r) for r in facts.routes_on(planned)),
                      sorted(conf.items()), facts.firewall])
    body = json.dumps([__version__, probe_source(), mpirun_line(len(order), probe_program('"$_r"')), order,
                       plan.hostfile, nodes], sort_keys=True, default=str)
    return hashlib.sha256(body.encode()).hexdigest()


def proven(ctx: ClusterContext) -> dict | None:
    """The record of the last probe that passed, when this run may rely on it instead of running mpirun."""
    if ctx.records is None or ctx.changes_applied or ctx.options.reprove:
        return None
    record = ctx.records.get(KEY)
    if not isinstance(record, dict) or time.time() - float(record.get("at", 0)) > MAX_AGE_S:
        return None
    return record if record.get("fingerprint") == mpi_fingerprint(ctx) else None


def record(ctx: ClusterContext, summary: str) -> None:
    """The probe passed: keep its fingerprint (only when nothing changed while it ran)."""
    if ctx.records is not None:
        ctx.records.put(KEY, {"fingerprint": mpi_fingerprint(ctx), "at": time.time(), "summary": summary})


def forget(ctx: ClusterContext) -> None:
    """The probe failed or could not run: no later run may skip it on the strength of an older pass."""
    if ctx.records is not None:
        ctx.records.put(KEY, None)


def since(record_: dict) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(float(record_.get("at", 0))))
