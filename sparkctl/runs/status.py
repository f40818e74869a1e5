"""`sparkctl cluster status` end to end: every node's facts once, and the hostfile inside each running container."""

from __future__ import annotations

from dataclasses import dataclass, field

from sparkctl.errors import SparkctlError
from sparkctl.facts import Facts
from sparkctl.inventory import Inventory
from sparkctl.plan import plan_cluster
from sparkctl.plan.paths import HOSTFILE_PATH
from sparkctl.runs.session import Session
from sparkctl.transport.base import Transport, q


@dataclass
class ClusterStatus:
    facts: dict[str, Facts]
    unreachable: dict[str, str]
    #: the planned container spec hash per node, when a plan could be made from the facts
    spec_hashes: dict[str, str] = field(default_factory=dict)
    #: the planned hostfile, when a plan could be made
    hostfile: str | None = None
    #: the nodes to show (--limit; all when none), in inventory order
    shown: list[str] = field(default_factory=list)


def container_hostfile(inventory: Inventory):
    """For Session.gather: the hostfile inside a running container (one more round trip), "" when it cannot be
    read, None when no container runs."""
    def read(transport: Transport, facts: Facts) -> str | None:
        info = facts.containers.get(inventory.container.name)
        if info is None or not info.running:
            return None
        result = transport.exec_in(inventory.container.name, f"cat {q(HOSTFILE_PATH)}", timeout=20)
        return result.stdout if result.ok else ""
    return read


def cluster_status(inventory: Inventory, limit: set[str] | None = None, forks: int = 32) -> ClusterStatus:
    """Every node is read (the planned spec and hostfile depend on all of them); --limit picks the rows."""
    with Session(inventory, limit=limit, forks=forks) as session:
        facts = session.gather(also=container_hostfile(inventory))
        status = ClusterStatus(facts, dict(session.unreachable), shown=session.limited)
    try:
        plan = plan_cluster(inventory, facts)
    except SparkctlError:
        return status
    status.spec_hashes = {n: p.container.spec_hash() for n, p in plan.nodes.items()}
    status.hostfile = plan.hostfile
    return status
