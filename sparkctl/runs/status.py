"""`sparkctl cluster status` end to end: every node's facts once, and the hostfile inside each running container."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from sparkctl.errors import SparkctlError
from sparkctl.facts import Facts
from sparkctl.inventory import Inventory
from sparkctl.plan import plan_cluster
from sparkctl.plan.paths import HOSTFILE_PATH
from sparkctl.rules.serving import without_mpi
from sparkctl.runs.bench_records import bench_history
from sparkctl.runs.lock import peek
from sparkctl.runs.session import Session
from sparkctl.taskgraph.runner import DEFAULT_FORKS
from sparkctl.transport.base import Transport, q


@dataclass
class ClusterStatus:
    facts: dict[str, Facts]
    unreachable: dict[str, str]
    #: the planned container spec hash per node, when a plan could be made from the facts
    spec_hashes: dict[str, str] = field(default_factory=dict)
    #: the planned hostfile, when a plan could be made
    hostfile: str | None = None
    #: the recorded `fabric bench` results of this cluster, newest first
    bench_history: list[dict] = field(default_factory=list)
    #: the nodes to show (--limit; all when none), in inventory order
    shown: list[str] = field(default_factory=list)
    #: who is changing the cluster right now (a run holding its lock), if anyone
    busy: str | None = None


def container_hostfile(inventory: Inventory) -> Callable[[Transport, Facts], None]:
    """For Session.gather: the hostfile inside a running container (one more round trip) into the node's facts,
    "" when it cannot be read, None when no container runs or the cluster has no mpirun (vLLM: no hostfile)."""
    def read(transport: Transport, facts: Facts) -> None:
        info = facts.containers.get(inventory.container.name)
        if info is None or not info.running or without_mpi(inventory) is not None:
            return
        result = transport.exec_in(inventory.container.name, f"cat {q(HOSTFILE_PATH)}", timeout=20)
        facts.container_hostfile = result.stdout if result.ok else ""
    return read


def holder_now(inventory: Inventory, session: Session) -> str | None:
    """Who holds the cluster lock now, asked of the first reachable node (a run locks every node)."""
    first = next(iter(session.transports.items()), None)
    if first is None:
        return None
    held = peek(inventory.cluster.name, dict([first]))
    return next(iter(held.values()), None)


def cluster_status(inventory: Inventory, limit: set[str] | None = None, forks: int = DEFAULT_FORKS) -> ClusterStatus:
    """Every node is read (the planned spec and hostfile depend on all of them); --limit picks the rows."""
    with Session(inventory, limit=limit, forks=forks) as session:
        facts = session.gather(also=container_hostfile(inventory))
        status = ClusterStatus(facts, dict(session.unreachable), shown=session.limited,
                               busy=holder_now(inventory, session), bench_history=bench_history(inventory.cluster.name))
    try:
        plan = plan_cluster(inventory, facts)
    except SparkctlError:
        return status
    status.spec_hashes = {n: p.container.spec_hash() for n, p in plan.nodes.items()}
    status.hostfile = plan.hostfile
    return status
