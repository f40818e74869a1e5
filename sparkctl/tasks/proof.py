"""Proofs on record: a no-op rerun does not prove again what nothing it depends on changed since it last passed.

The mesh pairs (PairProofs): each ordered pair of the host ssh mesh and of the container ssh mesh is kept with the
fingerprint of everything its login depends on (tasks/ssh/proofs.py, tasks/container/proofs.py say what); a rerun
tries exactly the pairs whose fingerprint changed, or that were never proven, or whose proof is older than MAX_AGE_S.
A pair that fails, or cannot be checked, leaves the record (doctor's broken pairs too: runs/doctor.py).

The MPI probe: it does not run mpirun again when nothing it depends on changed since the last probe that passed.

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
from collections.abc import Iterable
from typing import Any

from sparkctl import __version__
from sparkctl.plan.mpi import mpirun_line, probe_program, probe_source
from sparkctl.tasks.context import ClusterContext, ProofRecords

KEY = "mpi"
#: A proof older than this is made again whatever the fingerprint says.
MAX_AGE_S = 24 * 3600.0


def digest(*parts: Any) -> str:
    """A short sha256 of anything json can write (what is not, by its str)."""
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:32]


def fabric_state(ctx: ClusterContext, name: str) -> list[Any]:
    """What a node's fabric is now, from its facts: each planned interface (state, carrier, MTU, IPv4 addresses),
    its routes on them, their forwarding and rp_filter settings, its firewall's rules. A node lost meanwhile raises
    (errors.Unreachable): nothing of this run is then kept on record."""
    facts = ctx.nodes[name].facts() if name in ctx.nodes else None
    if facts is None:
        return [name, None]
    plan = ctx.plan()
    planned = plan.fabric.ports[name].interfaces if name in plan.fabric.ports else ()
    interfaces = []
    for iface in planned:
        nic = facts.interfaces.get(iface)
        interfaces.append([iface, None if nic is None else
                           [nic.operstate, nic.carrier, nic.mtu, sorted(str(a) for a in nic.ipv4())]])
    conf = {k: v for k, v in facts.ipv4_conf.items()
            if k == "ip_forward" or k.split(".")[0] in (*planned, "all", "default")}
    return [name, interfaces, sorted(str(r) for r in facts.routes_on(planned)), sorted(conf.items()), facts.firewall,
            facts.firewall_digest]


def pair_id(node: str, peer: str, target: str) -> str:
    """How a mesh pair is named in the record: from `node` to `peer` at `target` (an address, or user@address)."""
    return f"{node} {peer} {target}"


class PairProofs:
    """The record of one mesh's pairs: pair id -> [fingerprint, when it was proven]."""

    def __init__(self, records: ProofRecords | None, key: str, *, reprove: bool = False):
        self._records = records
        self._key = key
        self._reprove = reprove
        self._now = time.time()
        self.entries = self._valid(records.get(key) if records is not None else None)

    def _valid(self, data: Any) -> dict[str, tuple[str, float]]:
        """The entries as kept by keep(), those not too old; anything else in the file is not relied on."""
        if not isinstance(data, dict):
            return {}
        return {pair: (str(v[0]), float(v[1])) for pair, v in data.items()
                if isinstance(pair, str) and isinstance(v, list) and len(v) == 2 and isinstance(v[0], str)
                and isinstance(v[1], (int, float)) and self._now - float(v[1]) <= MAX_AGE_S}

    def covers(self, pairs: Iterable[str]) -> bool:
        """Are all these pairs on record (whatever their fingerprint)? Then a read need not carry their tries."""
        return not self._reprove and all(pair in self.entries for pair in pairs)

    def proven(self, fingerprints: dict[str, str]) -> set[str]:
        """The pairs whose proof on record still holds: the same fingerprint, not too old, no --reprove."""
        if self._reprove:
            return set()
        return {pair for pair, fp in fingerprints.items() if self.entries.get(pair, ("",))[0] == fp}

    def keep(self, fingerprints: dict[str, str], passed: set[str], taken: set[str]) -> None:
        """After a proof: the pairs just `passed` with their fingerprint now, those `taken` from the record as they
        were; every other pair of this mesh leaves the record (failed, not checked, or no longer planned)."""
        entries = {pair: self.entries[pair] for pair in taken if pair in self.entries}
        entries.update({pair: (fingerprints[pair], self._now) for pair in passed if pair in fingerprints})
        if self._records is not None and entries != self.entries:
            self._records.put(self._key, {pair: list(v) for pair, v in sorted(entries.items())} or None)
            self.entries = entries

    def forget(self, pairs: Iterable[str]) -> None:
        """These pairs were seen broken (by doctor): the next run proves them, whatever their fingerprint."""
        gone = set(pairs)
        left = {pair: v for pair, v in self.entries.items() if pair not in gone}
        if self._records is not None and left != self.entries:
            self._records.put(self._key, {pair: list(v) for pair, v in sorted(left.items())} or None)
            self.entries = left


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
        nodes.append([facts.hostname, container, fabric_state(ctx, name)])
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
