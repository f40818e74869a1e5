"""The runner: walks a graph task by task, nodes in parallel, check -> apply -> check again."""

from __future__ import annotations

import threading
import time
import traceback
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from sparkctl.engine.events import Event
from sparkctl.engine.graph import Graph, UnknownSelection, did_you_mean
from sparkctl.engine.task import Change, Scope, Status, Task, TaskFailed
from sparkctl.errors import SparkctlError, Unreachable
from sparkctl.exitcodes import ExitStatus

#: The recap row for cluster-scope tasks; parentheses cannot appear in a host name, so it never clashes.
CLUSTER_ROW = "(cluster)"
NOT_SELECTED = "not selected (--only/--skip)"
RECAP_COLUMNS = ("ok", "changed", "failed", "skipped", "unreachable")


def change_dicts(changes: list[Change]) -> list[dict[str, str]]:
    """Changes as events carry them: the summary and the diff, never the private payload."""
    return [{"summary": c.summary, "diff": c.diff} if c.diff else {"summary": c.summary} for c in changes]


@dataclass
class TaskOutcome:
    task: str
    phase: str
    node: str | None  # None: cluster scope
    status: Status
    message: str | None = None
    hint: str | None = None
    details: list[str] = field(default_factory=list)
    changes: list[Change] = field(default_factory=list)
    duration: float | None = None  # None: never ran (skipped)
    would_change: bool = False
    traceback: str | None = None
    not_selected: bool = False

    @property
    def blocks_dependents(self) -> bool:
        if self.status in (Status.FAILED, Status.UNREACHABLE):
            return True
        return self.status is Status.SKIPPED and not self.not_selected

    def to_event(self) -> Event:
        return Event(
            "task_result", task=self.task, phase=self.phase, node=self.node, status=self.status.value,
            message=self.message, hint=self.hint, details=list(self.details),
            changes=change_dicts(self.changes),
            duration=self.duration, would_change=self.would_change or None, traceback=self.traceback,
            data={"reason": "not_selected"} if self.not_selected else {},
        )


@dataclass
class RunResult:
    nodes: list[str]  # the nodes of the run (after --limit), in inventory order
    outcomes: list[TaskOutcome]
    unreachable: dict[str, str]  # node -> why, whether known at start or found mid-run
    check_mode: bool
    duration: float

    def outcome(self, task: str, node: str | None = None) -> TaskOutcome | None:
        """The outcome of `task` on `node` (None: cluster scope); unreachable nodes answer unreachable."""
        for o in self.outcomes:
            if o.task == task and o.node == node:
                return o
        if node in self.unreachable:
            return TaskOutcome(task, "", node, Status.UNREACHABLE, message=self.unreachable[node])
        return None

    def recap(self) -> dict[str, dict[str, int]]:
        rows: dict[str, dict[str, int]] = {n: dict.fromkeys(RECAP_COLUMNS, 0) for n in self.nodes}
        for o in self.outcomes:
            row = rows.setdefault(o.node or CLUSTER_ROW, dict.fromkeys(RECAP_COLUMNS, 0))
            if o.status is not Status.UNREACHABLE:
                row[o.status.value] += 1
        # Like Ansible: an unreachable node counts once, whatever the number of tasks it missed.
        for node in self.unreachable:
            rows[node]["unreachable"] = 1
        return rows

    @property
    def failed(self) -> list[TaskOutcome]:
        return [o for o in self.outcomes if o.status is Status.FAILED]

    @property
    def changed(self) -> list[TaskOutcome]:
        return [o for o in self.outcomes if o.status is Status.CHANGED]

    def exit_status(self) -> ExitStatus:
        if self.failed:
            return ExitStatus.TASK_FAILED
        if self.unreachable:
            return ExitStatus.UNREACHABLE
        if self.check_mode and self.changed:
            return ExitStatus.CHANGES_PENDING
        return ExitStatus.SUCCESS

    def recap_event(self) -> Event:
        return Event("recap", nodes=self.recap(), exit_status=int(self.exit_status()),
                     duration=self.duration, check_mode=self.check_mode)


class Runner:
    """Runs a graph over nodes. Between two tasks there is a barrier, so what a task reads is never stale."""

    def __init__(self, graph: Graph, *, nodes: list[str], node_contexts: dict[str, Any], cluster_context: Any,
                 unreachable: dict[str, str], forks: int = 32, check_mode: bool = False,
                 emit: Callable[[Event], None], limit: set[str] | None = None):
        if forks < 1:
            raise ValueError("forks must be at least 1")
        for name in limit or ():
            if name not in nodes:
                raise UnknownSelection(f"--limit: unknown node '{name}'{did_you_mean(name, nodes)}")
        self.graph = graph
        self.nodes = [n for n in nodes if limit is None or n in limit]
        self.unreachable = {n: why for n, why in unreachable.items() if n in self.nodes}
        missing = [n for n in self.nodes if n not in self.unreachable and n not in node_contexts]
        if missing:
            raise ValueError(f"no context for reachable node(s): {', '.join(missing)}")
        self.node_contexts = node_contexts
        self.cluster_context = cluster_context
        self.forks = forks
        self.check_mode = check_mode
        self._emit_to = emit
        self._lock = threading.Lock()
        self._outcomes: list[TaskOutcome] = []
        self._by_key: dict[tuple[str, str | None], TaskOutcome] = {}

    def _emit(self, event: Event) -> None:
        with self._lock:
            self._emit_to(event)

    def _record(self, outcome: TaskOutcome) -> None:
        with self._lock:
            self._outcomes.append(outcome)
            self._by_key[(outcome.task, outcome.node)] = outcome
            if outcome.status is Status.UNREACHABLE and outcome.node is not None:
                self.unreachable.setdefault(outcome.node, outcome.message or "unreachable")
            self._emit_to(outcome.to_event())

    def run(self) -> RunResult:
        started = time.monotonic()
        self._emit(Event("run_start", check_mode=self.check_mode,
                         data={"nodes": list(self.nodes), "tasks": len(self.graph)}))
        for node, why in self.unreachable.items():
            self._emit(Event("task_result", node=node, status=Status.UNREACHABLE.value, message=why))
        with ThreadPoolExecutor(max_workers=max(1, min(self.forks, len(self.nodes))),
                                thread_name_prefix="sparkctl-node") as pool:
            for task in self.graph.ordered():
                if task.scope is Scope.CLUSTER:
                    self._run_on_cluster(task)
                else:
                    self._run_on_nodes(task, pool)
        result = RunResult(nodes=list(self.nodes), outcomes=list(self._outcomes),
                           unreachable=dict(self.unreachable), check_mode=self.check_mode,
                           duration=time.monotonic() - started)
        self._emit(result.recap_event())
        return result

    def _run_on_nodes(self, task: Task, pool: ThreadPoolExecutor) -> None:
        targets = [n for n in self.nodes if n not in self.unreachable]
        if not self.graph.is_selected(task.name):
            for node in targets:
                self._record(TaskOutcome(task.name, task.phase, node, Status.SKIPPED, message=NOT_SELECTED,
                                         not_selected=True))
            return
        runnable = []
        for node in targets:
            why = self._blocked_on_node(task, node)
            if why:
                self._record(TaskOutcome(task.name, task.phase, node, Status.SKIPPED, message=why))
            else:
                runnable.append(node)
        futures = [pool.submit(self._execute, task, self.node_contexts[n], n) for n in runnable]
        try:
            for future in futures:
                future.result()  # the barrier; re-raises only what is not a task outcome (e.g. a broken sink)
        except BaseException:
            # Ctrl-C or a broken sink: start nothing new; what runs already ends on its own timeouts.
            for future in futures:
                future.cancel()
            raise

    def _run_on_cluster(self, task: Task) -> None:
        if not self.graph.is_selected(task.name):
            self._record(TaskOutcome(task.name, task.phase, None, Status.SKIPPED, message=NOT_SELECTED,
                                     not_selected=True))
            return
        why = self._blocked_on_cluster(task)
        if why:
            self._record(TaskOutcome(task.name, task.phase, None, Status.SKIPPED, message=why))
            return
        self._execute(task, self.cluster_context, None)

    def _need_outcome(self, need: str, node: str | None) -> TaskOutcome | None:
        scope = self.graph.task(need).scope
        return self._by_key.get((need, None if scope is Scope.CLUSTER else node))

    @staticmethod
    def _why_blocked(need: str, outcome: TaskOutcome) -> str:
        if outcome.status is Status.SKIPPED:
            return outcome.message or f"needs {need}, skipped"  # already names the root cause
        where = outcome.node or "the cluster"
        if outcome.status is Status.UNREACHABLE:
            return f"needs {need}, {where} unreachable"
        return f"needs {need}, failed on {where}"

    def _blocked_on_node(self, task: Task, node: str) -> str | None:
        for need in self.graph.needs_closure(task.name):
            outcome = self._need_outcome(need, node)
            if outcome is not None and outcome.blocks_dependents:
                return self._why_blocked(need, outcome)
        return None

    def _blocked_on_cluster(self, task: Task) -> str | None:
        for node in self.nodes:
            if node in self.unreachable:
                return f"needs every node, {node} unreachable"
        closure = self.graph.needs_closure(task.name)
        for need in closure:
            if self.graph.task(need).scope is Scope.CLUSTER:
                outcome = self._need_outcome(need, None)
                if outcome is not None and outcome.blocks_dependents:
                    return self._why_blocked(need, outcome)
        for node in self.nodes:
            for need in closure:
                outcome = self._need_outcome(need, node)
                if outcome is not None and outcome.blocks_dependents:
                    return self._why_blocked(need, outcome)
        return None

    def _execute(self, task: Task, ctx: Any, node: str | None) -> None:
        self._emit(Event("task_start", task=task.name, phase=task.phase, node=node))
        outcome = TaskOutcome(task.name, task.phase, node, Status.OK)
        started = time.monotonic()
        try:
            self._converge(task, ctx, outcome)
        except TaskFailed as failure:
            outcome.status = Status.FAILED
            outcome.message, outcome.hint, outcome.details = failure.message, failure.hint, failure.details
        except Unreachable as lost:
            # Only a node can vanish; a cluster task losing a node is that task failing.
            outcome.status = Status.UNREACHABLE if node is not None else Status.FAILED
            outcome.message, outcome.hint = lost.message, lost.hint
        except SparkctlError as error:
            outcome.status = Status.FAILED
            outcome.message, outcome.hint = error.message, error.hint
        except Exception as error:
            outcome.status = Status.FAILED
            outcome.message = f"internal error: {type(error).__name__}: {error}"
            outcome.traceback = traceback.format_exc()
        outcome.duration = time.monotonic() - started
        self._record(outcome)

    def _converge(self, task: Task, ctx: Any, outcome: TaskOutcome) -> None:
        changes = task.check(ctx)
        if not changes:
            return
        outcome.changes = list(changes)
        outcome.status = Status.CHANGED
        if self.check_mode:
            outcome.would_change = True
            return
        self._emit(Event("task_changes", task=task.name, phase=task.phase, node=outcome.node,
                         changes=change_dicts(changes)))
        task.apply(ctx, changes)
        remaining = task.check(ctx)
        if remaining:
            outcome.status = Status.FAILED
            outcome.message = "did not converge: " + "; ".join(c.summary for c in remaining)
            outcome.details = [c.diff for c in remaining if c.diff]
