"""What a task sees: one node's connection, facts (gathered lazily, re-read after a change) and the plan."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

from sparkctl.errors import Unreachable
from sparkctl.facts import Facts, gather_facts
from sparkctl.facts.script import SideRead
from sparkctl.inventory import Inventory, Node
from sparkctl.plan import ClusterPlan, PlanError, plan_cluster
from sparkctl.plan.collector import collectors_on
from sparkctl.plan.container import cluster_label
from sparkctl.plan.gateway import GATEWAY_CONTAINER
from sparkctl.plan.paths import network_state_dir, node_home, state_dir
from sparkctl.rules.serving import serving_enabled
from sparkctl.taskgraph.events import Event
from sparkctl.taskgraph.stops import LostNodes
from sparkctl.taskgraph.task import TaskFailed
from sparkctl.tasks.early import EarlyAsks
from sparkctl.tasks.options import RunOptions
from sparkctl.tasks.read_ahead import ReadsAhead, answer
from sparkctl.transport.base import CommandResult, Transport, q, text_of
from sparkctl.transport.framing import Framing, Section

#: Causes a failed command's last lines name, whatever the command: what to call them and what to do.
KNOWN_CAUSES = {
    # strerror(ENOSPC), as every tool on the node prints it
    "No space left on device": ("no space left on the device",
                                "the disk of {node} is full where sparkctl writes: free space there (df -h), then "
                                "run again"),
    # the docker CLI when its daemon does not answer (docker/cli, client.ErrorConnectionFailed)
    "Cannot connect to the Docker daemon": ("the docker daemon does not answer",
                                            "on {node}: sudo systemctl start docker (systemctl status docker says "
                                            "why it stopped), then run again"),
}


def known_cause(lines: list[str], node: str) -> tuple[str, str] | None:
    """(what to call it, what to do) when a failed command's last lines name a cause of KNOWN_CAUSES."""
    for marker, (cause, fix) in KNOWN_CAUSES.items():
        if any(marker in line for line in lines):
            return cause, fix.format(node=node)
    return None


T = TypeVar("T")


@dataclass(frozen=True)
class HandOver(Generic[T]):
    """The key of a read one task does for a later one in its own round trip, and the type of what it reads: the
    task that reads and the one that takes name the same object (a key spelled twice, once wrong, would silently
    cost a round trip)."""

    name: str

    def at(self, node: str) -> HandOver[T]:
        """The key of one node's read."""
        return HandOver(f"{self.name}/{node}")


def serving_containers(inventory: Inventory, node: str) -> tuple[str, ...]:
    """The containers of what serves on `node`, besides the engine's: the gateway on the cluster's head, the figures
    collectors of the worlds headed there (none when the inventory serves nothing)."""
    if not serving_enabled(inventory):
        return ()
    return ((GATEWAY_CONTAINER,) if node == inventory.head.name else ()) + tuple(collectors_on(inventory, node))


def gather_node_facts(transport: Transport, inventory: Inventory, node: Node,
                      side_reads: Mapping[str, tuple[str, float] | SideRead] | None = None) -> Facts:
    """One round trip: everything sparkctl needs to know about one node of this inventory (and the later
    tasks' reads ahead, tasks/read_ahead.py). Its one ask of docker reads the engine's container and what serves
    beside it (the gateway, the collectors), so serve.gateway and serve.collector ask docker nothing more, and where
    the Engine API answers, the cluster's labelled containers too (container.retire's list)."""
    return gather_facts(transport, node.name,
                        container_names=(inventory.container.name, *serving_containers(inventory, node.name)),
                        image_refs=(inventory.container.image,), hf_cache=inventory.container.hf_cache,
                        reach_addrs=(str(node.host),), guard_dirs=(network_state_dir(inventory.cluster.name),),
                        side_reads=side_reads, label=cluster_label(inventory.cluster.name))


class ProofRecords(Protocol):
    """Where proofs a later run may rely on are kept (the controller's state dir; runs/proofs.py)."""

    def get(self, key: str) -> Any | None: ...

    def put(self, key: str, value: Any | None) -> None: ...


class NodeContext:
    def __init__(self, cluster: ClusterContext, node: Node, transport: Transport):
        self.cluster = cluster
        self.node = node
        self.name: str = node.name
        self.transport = transport
        self._facts: Facts | None = None
        #: what was last read of the node: a peer plans from it once the node is lost
        self._last_known: Facts | None = None
        #: in a stage of node tasks, what its peers plan from: its facts as the stage began (begin_stage)
        self._pinned: Facts | None = None
        self._lock = threading.Lock()
        self.facts_round_trips = 0
        #: the reads ahead sent with the first facts read: (those facts, changes applied then)
        self._ahead: tuple[Facts, int] | None = None
        self._ahead_sent = False

    @property
    def inventory(self) -> Inventory:
        return self.cluster.inventory

    @property
    def user(self) -> str:
        return self.node.user or self.inventory.user

    @property
    def options(self) -> RunOptions:
        return self.cluster.options

    def facts(self, refresh: bool = False) -> Facts:
        """This node's facts, for a task of this node: read now if not read since the last change."""
        self._raise_if_lost()
        with self._lock:
            if self._facts is None or refresh:
                try:
                    self._facts = self._gather()
                except Unreachable as exc:
                    exc.node = exc.node or self.name
                    raise
                self._last_known = self._facts
                self.facts_round_trips += 1
                self.cluster.bump()
            return self._facts

    def _gather(self) -> Facts:
        # the run's first read of the node carries the later tasks' reads ahead (tasks/read_ahead.py)
        side = {} if self._ahead_sent else self.cluster.reads_ahead.side_reads(self.name)
        self._ahead_sent = True
        changes = self.cluster.changes_applied
        try:
            facts = self._read_facts(side)
        except Unreachable as exc:
            if not exc.closed:
                raise
            # closed under us (sshd restarted, the session killed): reading is safe to repeat, on a new connection
            facts = self._read_facts()
        if facts.side_reads:
            self._ahead = (facts, changes)
        return facts

    def _read_facts(self, side_reads: Mapping[str, tuple[str, float] | SideRead] | None = None) -> Facts:
        """One round trip."""
        return gather_node_facts(self.transport, self.inventory, self.node, side_reads)

    def read(self, name: str, script: str, framing: Framing, *, timeout: float = 60.0) -> CommandResult:
        """Run task `name`'s read-only script (framed with `framing`), or take what its read ahead read, when
        that was the same script and nothing changed since (tasks/read_ahead.py). A read not to run beside the
        next run's facts is simply `run` (and `remember` may keep what the next run will render instead)."""
        stdout = self._read_ahead(name, script, framing, timeout)
        if stdout is not None:
            return CommandResult(command=script, exit_code=0, stdout=stdout, stderr="")
        return self.run(script, timeout=timeout)

    def read_output(self, name: str, command: str, *, timeout: float = 60.0, use_ahead: bool = True) -> CommandResult:
        """Task `name`'s read-only `command`: what its read ahead printed when it succeeded (exit 0) and counts,
        else the command run now (so a failure is always met first hand, with its stderr). `use_ahead=False`:
        run now all the same (kept for the next run as usual)."""
        framing = Framing()
        section = self._read_ahead_section(name, command, framing, timeout)
        if use_ahead and section is not None and section.ok:
            return CommandResult(command=command, exit_code=0, stdout=section.output, stderr="")
        return self.run(command, timeout=timeout)

    def read_file(self, name: str, path: str) -> str | None:
        """Task `name`'s read of the file at `path` (None: absent), as transport.read reads it; taken from its
        read ahead when that read it and counts."""
        framing = Framing()
        section = self._read_ahead_section(name, text_of(q(path)), framing, 60.0)
        if section is not None and section.ok:
            return section.output
        return self.transport.read(path)

    def remember(self, name: str, script: str, framing: Framing, *, timeout: float = 60.0,
                 root: bool = False) -> None:
        """Keep `script` (framed with `framing`) as task `name`'s read for the next run's facts to carry (`root`:
        in their root shell)."""
        self.cluster.reads_ahead.remember(self.name, name, script, framing, timeout, root)

    def read_root_ahead(self, name: str, script: str, framing: Framing) -> str | None:
        """Task `name`'s root read (tasks/read_ahead.py): kept for the next run's facts to run in their root shell,
        and what it printed there in this run, when that was the same script and nothing changed since. Never run
        here: on None the task reads the same things its own way."""
        return self._read_ahead(name, script, framing, 60.0, root=True)

    def read_beside_root(self, name: str, script: str, framing: Framing, *, lean: str, root: tuple[str, str] | None,
                         timeout: float = 60.0) -> tuple[CommandResult, str | None]:
        """Task `name`'s read `script`, part of which a root read ahead reads instead where the node allows it
        (`root`: that read's name and script; `lean`: `script` without that part). When the root read counts:
        `lean`, read as `read` reads it, and what the root read printed. Otherwise `script` as `read` reads it, and
        `lean` kept for the next run, whose facts carry the root read."""
        if root is None:
            return self.read(name, script, framing, timeout=timeout), None
        inside = self.read_root_ahead(*root, framing)
        if inside is not None:
            return self.read(name, lean, framing, timeout=timeout), inside
        result = self.read(name, script, framing, timeout=timeout)
        self.remember(name, lean, framing, timeout=timeout)
        return result, None

    def _read_ahead_section(self, name: str, command: str, framing: Framing, timeout: float) -> Section | None:
        """`command` as a read ahead of its own: its one section, or None when there is none that counts. Framed
        in braces, not a subshell (a process of its own): a read ahead runs in a subshell already, and a command that
        ends it (`exit`, `exec`) only leaves its section without an end, which does not count."""
        stdout = self._read_ahead(name, framing.section("out", command), framing, timeout)
        return None if stdout is None else framing.split(stdout).get("out")

    def _read_ahead(self, name: str, script: str, framing: Framing, timeout: float,
                    root: bool = False) -> str | None:
        """Record `script` as task `name`'s read (for the next run's facts to carry); what its read ahead printed
        in this run, when that was the same script and nothing changed since."""
        reads = self.cluster.reads_ahead
        normalized = reads.remember(self.name, name, script, framing, timeout, root)
        with self._lock:
            ahead, facts = self._ahead, self._facts
        if ahead is None or ahead[0] is not facts or ahead[1] != self.cluster.changes_applied:
            return None
        stdout = answer(facts.side_reads.get(name), reads.sent(self.name, name), normalized, framing, root)
        if stdout is not None and self.options.verbosity >= 1:
            self.log(f"{name}: read ahead with the facts")
        return stdout

    def known_facts(self) -> Facts | None:
        """This node's facts as a PEER's task needs them (to plan): read now while the node is in the run; once
        it is lost, what was last read of it (None if nothing was). A loss found here is the node's, never the
        peer's: the node leaves the run and the peer goes on."""
        if self.name in self.cluster.lost:
            return self._last_known
        if self._pinned is not None:
            return self._pinned
        try:
            return self.facts()
        except Unreachable as exc:
            self.cluster.lost.lose(exc.node or self.name, exc.message, during="reading its facts for a peer")
        return self._last_known

    def _raise_if_lost(self) -> None:
        why = self.cluster.lost.why(self.name)
        if why is not None:
            raise Unreachable(why, node=self.name)

    def has_facts(self) -> bool:
        """Whether facts read since the last change are at hand (no read needed)."""
        with self._lock:
            return self._facts is not None

    def invalidate(self) -> None:
        """Something on the node changed: the next facts() reads it again."""
        with self._lock:
            self._facts = None
        self.cluster.bump()

    def plan(self) -> ClusterPlan:
        plan = self.cluster.plan()
        self._raise_if_lost()  # planned from what was last read of it: nothing left to do on it in this run
        return plan

    def state_dir(self) -> str:
        """sparkctl's state dir on this node (the path the container spec mounts)."""
        return state_dir(self.inventory, node_home(self.inventory, self.node, self.facts()))

    def hf_cache_dir(self) -> str:
        """The node side of the container's HF cache mount."""
        return self.plan().nodes[self.name].container.mounts[0][0].rstrip("/")

    def run(self, cmd: str, *, sudo: bool = False, timeout: float = 60.0, input: str | None = None) -> CommandResult:
        self._raise_if_lost()
        try:
            result = self.transport.run(cmd, sudo=sudo, timeout=timeout, input=input)
        except Unreachable as exc:
            exc.node = exc.node or self.name
            raise
        if self.options.verbosity >= 2:
            self.log(f"$ {cmd}\n{result.stdout}{result.stderr}".rstrip())
        elif self.options.verbosity >= 1:
            self.log(f"$ {cmd.splitlines()[0][:200]}  -> {result.exit_code}")
        return result

    def must(self, cmd: str, what: str, *, sudo: bool = False, timeout: float = 60.0,
             input: str | None = None, hint: str | None = None) -> CommandResult:
        """Run and raise TaskFailed with the command's last error lines when it fails."""
        return self.raise_unless_ok(self.run(cmd, sudo=sudo, timeout=timeout, input=input), what, hint)

    def raise_unless_ok(self, result: CommandResult, what: str, hint: str | None = None) -> CommandResult:
        """`result`, or TaskFailed with the command's last error lines when it failed."""
        if not result.ok:
            tail = (result.stderr or result.stdout).strip().splitlines()[-3:]
            reason = "timed out" if result.timed_out else f"exit {result.exit_code}"
            known = known_cause(tail, self.name)
            if known is not None:
                reason, hint = known[0], hint or known[1]
            raise TaskFailed(f"{what} failed on {self.name} ({reason})", hint=hint, details=tail)
        return result

    def warn(self, message: str, hint: str | None = None, task: str | None = None) -> None:
        self.cluster.emit(Event(event="warning", node=self.name, task=task, message=message, hint=hint))

    def log(self, message: str) -> None:
        self.cluster.emit(Event(event="log", node=self.name, message=message))


class ClusterContext:
    def __init__(self, inventory: Inventory, options: RunOptions, emit: Callable[[Event], None],
                 new_transport: Callable[[str], Transport] | None = None, lost: LostNodes | None = None,
                 records: ProofRecords | None = None, limit: set[str] | None = None):
        self.inventory = inventory
        self.records = records
        #: changes applied so far in this run, by any task (a proof on record is then not relied on)
        self.changes_applied = 0
        #: --limit: the nodes a run may change. `nodes` holds every reachable node all the same: what the
        #: cluster shares (keys, known hosts, hostfile, mesh) is computed from all of them.
        self.limit = frozenset(limit) if limit else None
        self._new_transport = new_transport
        #: nodes out of the run (shared with the runner): never reached again, planned from what was last read
        self.lost = lost if lost is not None else LostNodes()
        self.options = options
        self.emit = emit
        self.nodes: dict[str, NodeContext] = {}
        self._generation = 0
        self._stage_pins: dict[str, Any] | None = None  # the facts the last node stage pinned
        self._plan: tuple[int, ClusterPlan] | None = None
        # Two small locks, never held while waiting for a node: a node's facts() bumps the generation while
        # holding its own lock, and plan() gathers facts of every node.
        self._generation_lock = threading.Lock()
        self._plan_lock = threading.Lock()
        self._handed_over: dict[str, tuple[tuple[int, int], Any]] = {}
        #: what a task asked the outside world once in this run and must not ask again when it checks again after
        #: its apply (a revision resolved on the Hub: model.pin)
        self.asked_once: dict[str, Any] = {}
        #: later tasks' read scripts, sent with each node's first facts read (tasks/read_ahead.py)
        self.reads_ahead = ReadsAhead(records)
        #: what read-only cluster tasks asked of the outside world as the run began (tasks/early.py)
        self.early = EarlyAsks(self._changes_applied)
        self.started = time.monotonic()

    def add(self, ctx: NodeContext) -> None:
        self.nodes[ctx.name] = ctx

    def note(self, event: Event) -> None:
        """Every event of the run passes here first (runs/session.py): count the changes applied."""
        if event.event == "task_changes":
            with self._generation_lock:
                self.changes_applied += 1

    def _changes_applied(self) -> int:
        with self._generation_lock:
            return self.changes_applied

    def bump(self) -> None:
        with self._generation_lock:
            self._generation += 1

    def warn(self, message: str, hint: str | None = None, task: str | None = None, node: str | None = None,
             details: list[str] | None = None) -> None:
        self.emit(Event(event="warning", node=node, task=task, message=message, hint=hint, details=details or []))

    def hand_over(self, key: HandOver[T], value: T) -> None:
        """Reads a task did on behalf of the NEXT task (they rode in its round trip), tagged with the current
        generation."""
        with self._generation_lock:
            self._handed_over[key.name] = ((self._generation, self.changes_applied), value)

    def take_over(self, key: HandOver[T]) -> T | None:
        """What hand_over left, once, and only if no node's facts were read or invalidated and no change was
        applied since (else None: read again). A task that changes something re-checks, and that re-check hands
        over anew."""
        with self._generation_lock:
            stamp, value = self._handed_over.pop(key.name, (None, None))
            return value if stamp == (self._generation, self.changes_applied) else None

    def in_limit(self, node: str) -> bool:
        """May this run change `node` (no --limit, or --limit names it)?"""
        return self.limit is None or node in self.limit

    def outside_limit(self, node: str) -> str:
        """" (outside --limit)" for a node the run only reads, for messages."""
        return "" if self.in_limit(node) else " (outside --limit)"

    def head(self) -> NodeContext:
        """The head node's context (read even when --limit leaves it out)."""
        head = self.inventory.head.name
        if head not in self.nodes:
            raise TaskFailed(f"the head node {head} cannot be read in this run")
        return self.nodes[head]

    def new_transport(self, node: str) -> Transport:
        """A FRESH connection to the node's management address (proves the path still works)."""
        if self._new_transport is None:
            raise TaskFailed("no way to open a new connection (internal)")
        return self._new_transport(node)

    def begin_stage(self, node_scope: bool) -> None:
        """Called by the runner before each stage. Before node tasks: read again, at this barrier and in
        parallel, the facts an earlier change made stale, and pin every node's facts as what its PEERS plan from
        until the stage ends: a node never waits for a slower peer in the middle of its own tasks (a node's tasks
        change only that node, and its own checks read it fresh). Before a cluster task: unpin, reads are fresh."""
        for ctx in self.nodes.values():
            ctx._pinned = None
        if not node_scope:
            return
        stale = [c for c in self.nodes.values() if c._facts is None and c._last_known is not None
                 and c.name not in self.lost]
        if stale:
            with ThreadPoolExecutor(max_workers=min(self.options.forks, len(stale))) as pool:
                list(pool.map(lambda c: c.known_facts(), stale))
        for ctx in self.nodes.values():
            ctx._pinned = ctx._facts  # None when never read: a peer then reads it when it needs it
        # a new generation only when what peers plan from moved: the same facts pinned again keep the plan and
        # what a task handed over (a no-op's verify.fabric takes container.ssh's reads across the model stage)
        pins = {name: ctx._pinned for name, ctx in self.nodes.items()}
        before, self._stage_pins = self._stage_pins, pins
        if before is None or any(pin is not before.get(name) for name, pin in pins.items()):
            self.bump()

    def facts_by_node(self) -> dict[str, Facts]:
        """Every node's facts as planning needs them: a lost node's as last read (absent if never read)."""
        missing = [ctx for ctx in self.nodes.values() if ctx._facts is None and ctx.name not in self.lost]
        if len(missing) > 1:
            with ThreadPoolExecutor(max_workers=min(self.options.forks, len(missing))) as pool:
                list(pool.map(lambda c: c.known_facts(), missing))
        known = {name: ctx.known_facts() for name, ctx in self.nodes.items()}
        return {name: facts for name, facts in known.items() if facts is not None}

    def run_on_all(self, scripts: dict[str, str], *, sudo: bool = False,
                   timeout: float = 60.0) -> dict[str, CommandResult]:
        """Run one script per node, in parallel; results by node."""
        if not scripts:
            return {}
        with ThreadPoolExecutor(max_workers=min(self.options.forks, len(scripts))) as pool:
            futures = {n: pool.submit(self.nodes[n].run, s, sudo=sudo, timeout=timeout) for n, s in scripts.items()}
            return {n: f.result() for n, f in futures.items()}

    def read_on_all(self, name: str, commands: dict[str, str], *, timeout: float = 60.0) -> dict[str, CommandResult]:
        """Task `name`'s read-only command per node, in parallel; results by node. What one node reads this way
        may depend on every other (pings, tries): it is taken from the read ahead (NodeContext.read_output)
        only while every node's facts are still its first of the run. A node read again meanwhile (a link come
        up: network.verify waits for it) may have changed what the others would see."""
        if not commands:
            return {}
        first = all(node.facts_round_trips == 1 and node.has_facts() for node in self.nodes.values())
        with ThreadPoolExecutor(max_workers=min(self.options.forks, len(commands))) as pool:
            futures = {n: pool.submit(self.nodes[n].read_output, name, c, timeout=timeout, use_ahead=first)
                       for n, c in commands.items()}
            return {n: f.result() for n, f in futures.items()}

    def each_node(self, work: dict[str, Callable[[], None]]) -> None:
        """Run each node's work (its own steps in order) on all nodes at once; the first failure is raised after
        every node finished (a node's half-done work is never abandoned mid-way)."""
        if not work:
            return
        with ThreadPoolExecutor(max_workers=min(self.options.forks, len(work))) as pool:
            futures = [pool.submit(step) for step in work.values()]
            errors = [e for e in (f.exception() for f in futures) if e is not None]
        if errors:
            raise errors[0]

    def plan(self) -> ClusterPlan:
        """The desired state from the CURRENT facts of every node (recomputed after any change)."""
        while True:
            generation = self._generation
            facts = self.facts_by_node()
            with self._plan_lock:
                if self._plan is not None and self._plan[0] == generation == self._generation:
                    return self._plan[1]
                if generation != self._generation:
                    continue  # facts changed while we read them: read again
                try:
                    self._plan = (generation, plan_cluster(self.inventory, facts))
                except PlanError as exc:
                    raise TaskFailed(exc.message, hint=exc.hint) from exc
                return self._plan[1]
