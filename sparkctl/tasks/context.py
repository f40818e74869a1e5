"""What a task sees: one node's connection, facts (gathered lazily, re-read after a change) and the plan."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from sparkctl.engine.events import Event
from sparkctl.engine.task import TaskFailed
from sparkctl.facts import Facts, gather_facts
from sparkctl.inventory import Inventory, Node
from sparkctl.plan import ClusterPlan, PlanError, plan_cluster
from sparkctl.plan.paths import node_home, state_dir
from sparkctl.transport.base import CommandResult, Transport


@dataclass
class RunOptions:
    check: bool = False
    diff: bool = False
    verbosity: int = 0
    #: seconds the node waits for sparkctl's confirmation before it reverts a netplan change by itself
    netplan_confirm_timeout: float = 60.0
    become_password: str | None = field(default=None, repr=False)


def gather_node_facts(transport: Transport, inventory: Inventory, node: Node) -> Facts:
    """One round trip: everything sparkctl needs to know about one node of this inventory."""
    return gather_facts(transport, node.name, container_names=(inventory.container.name,),
                        image_refs=(inventory.container.image,), hf_cache=inventory.container.hf_cache,
                        reach_addrs=(str(node.host),))


class NodeContext:
    def __init__(self, cluster: ClusterContext, node: Node, transport: Transport):
        self.cluster = cluster
        self.node = node
        self.name: str = node.name
        self.transport = transport
        self._facts: Facts | None = None
        self._lock = threading.Lock()
        self.facts_round_trips = 0

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
        with self._lock:
            if self._facts is None or refresh:
                self._facts = gather_node_facts(self.transport, self.inventory, self.node)
                self.facts_round_trips += 1
                self.cluster.bump()
            return self._facts

    def invalidate(self) -> None:
        """Something on the node changed: the next facts() reads it again."""
        with self._lock:
            self._facts = None
        self.cluster.bump()

    def plan(self) -> ClusterPlan:
        return self.cluster.plan()

    def state_dir(self) -> str:
        """sparkctl's state dir on this node (the path the container spec mounts)."""
        return state_dir(self.inventory, node_home(self.inventory, self.node, self.facts()))

    def hf_cache_dir(self) -> str:
        """The node side of the container's HF cache mount."""
        return self.plan().nodes[self.name].container.mounts[0][0].rstrip("/")

    def run(self, cmd: str, *, sudo: bool = False, timeout: float = 60.0, input: str | None = None) -> CommandResult:
        result = self.transport.run(cmd, sudo=sudo, timeout=timeout, input=input)
        if self.options.verbosity >= 2:
            self.log(f"$ {cmd}\n{result.stdout}{result.stderr}".rstrip())
        elif self.options.verbosity >= 1:
            self.log(f"$ {cmd.splitlines()[0][:200]}  -> {result.exit_code}")
        return result

    def must(self, cmd: str, what: str, *, sudo: bool = False, timeout: float = 60.0,
             input: str | None = None, hint: str | None = None) -> CommandResult:
        """Run and raise TaskFailed with the command's last error lines when it fails."""
        result = self.run(cmd, sudo=sudo, timeout=timeout, input=input)
        if not result.ok:
            tail = (result.stderr or result.stdout).strip().splitlines()[-3:]
            reason = "timed out" if result.timed_out else f"exit {result.exit_code}"
            raise TaskFailed(f"{what} failed on {self.name} ({reason})", hint=hint, details=tail)
        return result

    def warn(self, message: str, hint: str | None = None, task: str | None = None) -> None:
        self.cluster.emit(Event(event="warning", node=self.name, task=task, message=message, hint=hint))

    def log(self, message: str) -> None:
        self.cluster.emit(Event(event="log", node=self.name, message=message))


class ClusterContext:
    def __init__(self, inventory: Inventory, options: RunOptions, emit: Callable[[Event], None],
                 new_transport: Callable[[str], Transport] | None = None, limit: set[str] | None = None):
        self.inventory = inventory
        #: --limit: the nodes a run may change. `nodes` holds every reachable node all the same: what the
        #: cluster shares (keys, known hosts, hostfile, mesh) is computed from all of them.
        self.limit = frozenset(limit) if limit else None
        self._new_transport = new_transport
        self.options = options
        self.emit = emit
        self.nodes: dict[str, NodeContext] = {}
        self._generation = 0
        self._plan: tuple[int, ClusterPlan] | None = None
        # Two small locks, never held while waiting for a node: a node's facts() bumps the generation while
        # holding its own lock, and plan() gathers facts of every node.
        self._generation_lock = threading.Lock()
        self._plan_lock = threading.Lock()
        self._handed_over: dict[str, tuple[int, Any]] = {}
        self.started = time.monotonic()

    def add(self, ctx: NodeContext) -> None:
        self.nodes[ctx.name] = ctx

    def bump(self) -> None:
        with self._generation_lock:
            self._generation += 1

    def warn(self, message: str, hint: str | None = None, task: str | None = None) -> None:
        self.emit(Event(event="warning", task=task, message=message, hint=hint))

    def hand_over(self, key: str, value: Any) -> None:
        """Reads a task did on behalf of the NEXT task (they rode in its round trip), tagged with the current
        generation."""
        with self._generation_lock:
            self._handed_over[key] = (self._generation, value)

    def take_over(self, key: str) -> Any | None:
        """What hand_over left, once, and only if no node's facts were read or invalidated since (else None:
        read again). A task that changes something re-checks, and that re-check hands over anew."""
        with self._generation_lock:
            generation, value = self._handed_over.pop(key, (None, None))
            return value if generation == self._generation else None

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

    def facts_by_node(self) -> dict[str, Facts]:
        missing = [ctx for ctx in self.nodes.values() if ctx._facts is None]
        if len(missing) > 1:
            with ThreadPoolExecutor(max_workers=min(32, len(missing))) as pool:
                list(pool.map(lambda c: c.facts(), missing))
        return {name: ctx.facts() for name, ctx in self.nodes.items()}

    def run_on_all(self, scripts: dict[str, str], *, sudo: bool = False,
                   timeout: float = 60.0) -> dict[str, CommandResult]:
        """Run one script per node, in parallel; results by node."""
        if not scripts:
            return {}
        with ThreadPoolExecutor(max_workers=min(32, len(scripts))) as pool:
            futures = {n: pool.submit(self.nodes[n].run, s, sudo=sudo, timeout=timeout) for n, s in scripts.items()}
            return {n: f.result() for n, f in futures.items()}

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
