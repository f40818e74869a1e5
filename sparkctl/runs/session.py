"""A session: one connection per node of an inventory, opened in parallel, closed on the way out; and a run of
a task graph over it."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any

from sparkctl import __version__
from sparkctl.errors import Interrupted
from sparkctl.facts import Facts
from sparkctl.inventory import Inventory
from sparkctl.runs.interrupts import ctrl_c_stops
from sparkctl.runs.lock import ClusterLock, Holder
from sparkctl.runs.opening import Opened, Opening, check_known_hosts, connect_options, node_address
from sparkctl.runs.preload import preload
from sparkctl.runs.proofs import ProofFile
from sparkctl.runs.request import RunRequest, check_limit, selected
from sparkctl.taskgraph import Event, Graph, Interruption, LostNodes, Runner, RunResult
from sparkctl.taskgraph.runner import DEFAULT_FORKS
from sparkctl.tasks.context import ClusterContext, NodeContext, gather_node_facts
from sparkctl.transport.base import Transport
from sparkctl.transport.connect import NodeAddress, connect_all, open_transport
from sparkctl.transport.shell import ShellTransport


def run_identity(inventory: Inventory, command: str, request: RunRequest, session: Session) -> dict[str, Any]:
    """What run_start says about the run itself: the command, the cluster, sparkctl's version, the limit and
    why each unreachable node is (errors.Unreachable.kind)."""
    out: dict[str, Any] = {"command": command, "cluster": inventory.cluster.name, "sparkctl": __version__}
    if request.limit:
        out["limit"] = [n for n in session.names if n in request.limit]
    if session.unreachable_kinds:
        out["unreachable"] = dict(session.unreachable_kinds)
    return out


def with_endpoint(emit: Callable[[Event], None]) -> Callable[[Event], None]:
    """`emit`, whose recap also carries the endpoint and the smoke test's result when the run served (the
    closing lines of a serving run say where to send requests): the first model's, as a request that names none
    gets it."""
    smoke: dict[str, Any] = {}

    def sink(event: Event) -> None:
        if event.event == "log" and isinstance(event.data.get("smoke"), dict) and not smoke:
            smoke.update(event.data["smoke"])
        if event.event == "recap" and smoke:
            event.data.setdefault("endpoint", smoke.get("endpoint"))
            event.data.setdefault("smoke", {k: v for k, v in smoke.items() if k != "endpoint"})
        emit(event)
    return sink


def after_start(emit: Callable[[Event], None], notes: list[Event]) -> Callable[[Event], None]:
    """`emit`, which sends `notes` right after the run's first event (run_start)."""
    if not notes:
        return emit
    pending = list(notes)

    def sink(event: Event) -> None:
        emit(event)
        while pending and event.event == "run_start":
            emit(pending.pop(0))
    return sink


@contextmanager
def held_lock(session: Session, command: str, request: RunRequest,
              emit: Callable[[Event], None]) -> Iterator[list[Event]]:
    """The cluster lock for a run that may change the nodes (not --check): taken here, or already by the
    session's Opening. Yields what to say once the run has started: a stale lock taken over."""
    if request.options.check:
        yield []
        return
    def warn(node: str, message: str) -> None:
        emit(Event("warning", node=node, message=message))

    opened = session.opened
    if opened is None:
        lock = ClusterLock(session.inventory.cluster.name, session.transports, Holder.now(command, request.limit),
                           warn=warn, forks=session.forks)
        lock.acquire()
    elif opened.lock is None:
        raise opened.lock_error or RuntimeError("the opening took no cluster lock")
    else:
        lock = opened.lock
        lock.warn = warn
    try:
        yield [Event("warning", node=node, message=(
            f"took over a stale cluster lock: {gone.describe() if gone else 'a run'} ended without releasing it "
            "(killed, or its connection lost); this run checks everything again"))
            for node, gone in lock.stale.items()]
    finally:
        lock.release()


class Session:
    """Connections to every node of the inventory, each opened once and reused. `limit` only names the nodes a
    run may change (and the ones a report shows): what the cluster shares is read from all of them.

    `transports` holds the nodes reached, `unreachable` why each other one was not.
    """

    def __init__(self, inventory: Inventory, *, limit: set[str] | None = None, forks: int = DEFAULT_FORKS,
                 become_password: str | None = None, interruption: Interruption | None = None,
                 opening: Opening | None = None):
        check_limit(inventory, limit)
        check_known_hosts(inventory)
        self.inventory = inventory
        self.limit = set(limit) if limit else None
        self.forks = forks
        #: a Ctrl-C cuts every connection of the session, those opened later too
        self.interruption = interruption if interruption is not None else Interruption()
        self._options = connect_options(inventory, become_password)
        #: connections (and maybe the cluster lock) opened before the session, by the command (runs/opening.py)
        self._opening = opening
        self.opened: Opened | None = None
        self.names = [n.name for n in inventory.nodes]
        self.transports: dict[str, Transport] = {}
        self.unreachable: dict[str, str] = {}
        #: what kind of failure each unreachable node met (errors.Unreachable.kind): network, auth, host_key, lost
        self.unreachable_kinds: dict[str, str] = {}

    def __enter__(self) -> Session:
        if self._opening is not None:
            self.opened = self._opening.hand_over()
            if self.interruption.requested and self.opened.lock is not None:
                # released before the connections are cut (a clean release leaves no stale record), and not run
                self.opened.lock.release()
                self.opened.lock, self.opened.lock_error = None, Interrupted(self.names[0])
            transports: dict[str, ShellTransport] = self.opened.transports
            unreachable = self.opened.unreachable
        else:
            transports, unreachable = connect_all([self.address(name) for name in self.names], forks=self.forks,
                                                  **self._options)
        self.transports = {n: transports[n] for n in self.names if n in transports}
        self.unreachable = {n: str(unreachable[n]) for n in self.names if n in unreachable}
        for transport in self.transports.values():
            self.interruption.on_request(transport.interrupt)
        self.unreachable_kinds = {n: unreachable[n].kind for n in self.unreachable}
        return self

    def __exit__(self, *exc: object) -> None:
        for transport in self.transports.values():
            transport.close()

    @property
    def limited(self) -> list[str]:
        """The nodes of --limit (all when none), in inventory order."""
        return [n for n in self.names if self.limit is None or n in self.limit]

    def address(self, name: str) -> NodeAddress:
        return node_address(self.inventory, name)

    def open(self, name: str) -> Transport:
        """A NEW connection to the node's management address (proves the path still works); raises Unreachable."""
        if self.interruption.requested:
            raise Interrupted(name)
        transport = open_transport(self.address(name), **self._options)
        self.interruption.on_request(transport.interrupt)
        return transport

    def gather(self, also: Callable[[Transport, Facts], None] | None = None) -> dict[str, Facts]:
        """Every reached node's facts, in parallel (one round trip each); a node lost while its facts are read
        moves to `unreachable`. `also(transport, facts)` runs on the same connection right after (and may fill in
        the facts' fields for what it read)."""
        def one(name: str) -> tuple[str, Facts | None, str]:
            try:
                facts = gather_node_facts(self.transports[name], self.inventory, self.inventory.node(name))
                if also is not None:
                    also(self.transports[name], facts)
            except Exception as exc:  # noqa: BLE001 - a node lost while gathering is unreachable, the rest go on
                return name, None, str(exc) or type(exc).__name__
            if not facts.user and not facts.hostname:
                return name, None, f"{name}: the node stopped answering while its facts were read"
            return name, facts, ""

        out: dict[str, Facts] = {}
        if not self.transports:
            return out
        with ThreadPoolExecutor(max_workers=max(1, min(self.forks, len(self.transports)))) as pool:
            for name, facts, error in pool.map(one, list(self.transports)):
                if facts is None:
                    self.unreachable[name] = error
                    self.unreachable_kinds[name] = "lost"
                else:
                    out[name] = facts
        return out


def run_playbook(inventory: Inventory, graph: Graph, request: RunRequest, emit: Callable[[Event], None],
                 command: str = "bootstrap", opening: Opening | None = None) -> RunResult:
    """Walk `graph` over the inventory's nodes (changing those of --limit), reporting through `emit`. A run that
    may change something holds the cluster lock on the nodes (runs.lock) from before the first task to the
    end; --check does not need it. `opening`: the connections (and lock) the command started to open for this
    run (runs/opening.py)."""
    check_limit(inventory, request.limit)
    graph = selected(graph, request)
    preload()
    options = request.options
    interruption = Interruption()
    with ctrl_c_stops(interruption), Session(inventory, limit=request.limit, forks=request.forks,
                                             become_password=options.become_password,
                                             interruption=interruption, opening=opening) as session, \
            held_lock(session, command, request, emit) as notes:
        emit = with_endpoint(after_start(emit, notes))
        lost = LostNodes(session.unreachable)
        cluster = ClusterContext(inventory, options, emit, new_transport=session.open, lost=lost,
                                 records=ProofFile(inventory.cluster.name), limit=request.limit)
        for node in inventory.nodes:
            if node.name in session.transports:
                cluster.add(NodeContext(cluster, node, session.transports[node.name]))
        def emit_noted(event: Event) -> None:
            cluster.note(event)
            emit(event)

        runner = Runner(graph, nodes=session.names, node_contexts=cluster.nodes, cluster_context=cluster,
                        unreachable=dict(session.unreachable), forks=request.forks, check_mode=options.check,
                        emit=emit_noted, limit=request.limit, lost=lost, interruption=interruption,
                        on_stage=cluster.begin_stage, start=run_identity(inventory, command, request, session))
        result = runner.run()
        cluster.reads_ahead.save()
        result.round_trips = {n: t.round_trips for n, t in session.transports.items()}
    return result
