"""The runner: walks a graph task by task, nodes in parallel, check -> apply -> check again."""

from __future__ import annotations

import threading
import time
import traceback
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from sparkctl.engine.events import CONNECT_TASK, Event
from sparkctl.engine.graph import Graph, UnknownSelection, did_you_mean
from sparkctl.engine.task import Change, Scope, Status, Task, TaskFailed
from sparkctl.errors import SparkctlError, Unreachable
from sparkctl.exitcodes import ExitStatus

#: The recap row for cluster-scope tasks; parentheses cannot appear in a host name, so it never clashes.
CLUSTER_ROW = "(cluster)"
NOT_SELECTED = "not selected (--only/--skip)"
LEFT_OUT = "left out by --skip"
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
    #: --check only: this task cannot know its answer until that need (which would change) is applied
    pending_on: str | None = None
    #: --limit: what this cluster-scope task found to change on nodes outside the limit, left alone
    outside: list[Change] = field(default_factory=list)

    @property
    def blocks_dependents(self) -> bool:
        """A need that did not run (failed, unreachable, skipped, left out) stops what needs it; one that would
        change or cannot know yet (--check) does not: its dependents still say what they can."""
        if self.status in (Status.FAILED, Status.UNREACHABLE):
            return True
        return self.status is Status.SKIPPED and self.pending_on is None

    @property
    def awaits(self) -> str | None:
        """--check: the need whose apply this outcome waits for (itself, when it would change)."""
        if self.pending_on is not None:
            return self.pending_on
        return self.task if self.status is Status.CHANGED and self.would_change else None

    def to_event(self) -> Event:
        return Event(
            "task_result", task=self.task, phase=self.phase, node=self.node, status=self.status.value,
            message=self.message, hint=self.hint, details=list(self.details),
            changes=change_dicts(self.changes),
            duration=self.duration, would_change=self.would_change or None, traceback=self.traceback,
            data=self._reason(),
        )

    def _reason(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.not_selected:
            out["reason"] = "not_selected"
        if self.pending_on is not None:
            out.update(reason="pending", pending_on=self.pending_on)
        if self.outside:
            out["outside_limit"] = change_dicts(self.outside)
        return out


@dataclass
class RunResult:
    nodes: list[str]  # the nodes of the run (after --limit), in inventory order
    outcomes: list[TaskOutcome]
    unreachable: dict[str, str]  # node -> why, whether known at start or found mid-run
    check_mode: bool
    duration: float
    #: the tasks of the graph's verify phase (empty: the playbook has none)
    verify_tasks: list[str] = field(default_factory=list)
    #: --limit: the nodes outside it (read, never changed)
    outside: list[str] = field(default_factory=list)

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

    @property
    def pending(self) -> list[TaskOutcome]:
        """--check: the outcomes that cannot be known until what they need is applied."""
        return [o for o in self.outcomes if o.pending_on is not None]

    def exit_status(self) -> ExitStatus:
        if self.failed:
            return ExitStatus.TASK_FAILED
        if self.unreachable:
            return ExitStatus.UNREACHABLE
        if self.check_mode and (self.changed or self.pending):
            return ExitStatus.CHANGES_PENDING
        return ExitStatus.SUCCESS

    def verification(self) -> tuple[bool | None, str | None]:
        """(True, None) when every task of the verify phase ran and passed; (False, why not); (None, None) when
        the playbook has no verify phase or nothing was applied (--check)."""
        if not self.verify_tasks or self.check_mode:
            return None, None
        for task in self.verify_tasks:
            found = [o for o in self.outcomes if o.task == task]
            if not found:
                return False, f"{task} did not run"
            for o in found:
                if o.status is Status.OK:
                    continue
                if o.not_selected:
                    return False, f"{task} was not selected"
                where = f" on {o.node}" if o.node else ""
                return False, f"{task} {o.status.value}{where}" + (f": {o.message}" if o.message else "")
        return True, None

    def recap_event(self) -> Event:
        verified, why_not = self.verification()
        data: dict[str, Any] = {}
        if verified is not None:
            data["verified"] = verified
            if why_not:
                data["not_verified"] = why_not
        if self.pending:
            data["pending"] = len(self.pending)
        left = sum(len(o.outside) for o in self.outcomes)
        if left:
            data["outside_limit"] = left
        return Event("recap", nodes=self.recap(), exit_status=int(self.exit_status()),
                     duration=self.duration, check_mode=self.check_mode, data=data)


class Runner:
    """Runs a graph over nodes. Between two tasks there is a barrier, so what a task reads is never stale.

    With `limit` (Ansible's meaning): node-scope tasks run on the limited nodes only; cluster-scope tasks still
    compute the cluster's state from every node (their context reads them all) but apply only the changes on
    limited nodes (`Change.node`), reporting the others as left alone. A node outside the limit that cannot be
    read makes every cluster-scope task refuse, naming it.
    """

    def __init__(self, graph: Graph, *, nodes: list[str], node_contexts: dict[str, Any], cluster_context: Any,
                 unreachable: dict[str, str], forks: int = 32, check_mode: bool = False,
                 emit: Callable[[Event], None], limit: set[str] | None = None,
                 start: dict[str, Any] | None = None):
        if forks < 1:
            raise ValueError("forks must be at least 1")
        for name in limit or ():
            if name not in nodes:
                raise UnknownSelection(f"--limit: unknown node '{name}'{did_you_mean(name, nodes)}")
        self.graph = graph
        self.nodes = [n for n in nodes if limit is None or n in limit]
        self.outside = [n for n in nodes if n not in self.nodes]
        #: nodes outside the limit that could not be read: cluster-scope tasks refuse
        self.unreadable = {n: why for n, why in unreachable.items() if n in self.outside}
        self.unreachable = {n: why for n, why in unreachable.items() if n in self.nodes}
        missing = [n for n in self.nodes if n not in self.unreachable and n not in node_contexts]
        if missing:
            raise ValueError(f"no context for reachable node(s): {', '.join(missing)}")
        self.node_contexts = node_contexts
        self.cluster_context = cluster_context
        self.forks = forks
        self.check_mode = check_mode
        self._emit_to = emit
        #: what run_start says beyond the engine's own (the command, the cluster, versions)
        self._start = dict(start or {})
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
        start: dict[str, Any] = {**self._start, "nodes": list(self.nodes), "tasks": len(self.graph)}
        if self.outside:
            start["outside_limit"] = list(self.outside)
        if self.graph.added:
            start["added_needs"] = list(self.graph.added)
        self._emit(Event("run_start", check_mode=self.check_mode, data=start))
        for node, why in self.unreachable.items():
            self._emit(Event("task_result", task=CONNECT_TASK, node=node, status=Status.UNREACHABLE.value,
                             message=why))
        for node, why in self.unreadable.items():
            self._emit(Event("warning", node=node, message=f"outside --limit and unreachable: {why}",
                             hint="the cluster-wide tasks need to read every node: bring it back, or remove it "
                                  "from the inventory"))
        with ThreadPoolExecutor(max_workers=max(1, min(self.forks, len(self.nodes))),
                                thread_name_prefix="sparkctl-node") as pool:
            for task in self.graph.ordered():
                if task.scope is Scope.CLUSTER:
                    self._run_on_cluster(task)
                else:
                    self._run_on_nodes(task, pool)
        verify = [t.name for t in self.graph.ordered() if t.phase == self.graph.verify_phase]
        result = RunResult(nodes=list(self.nodes), outcomes=list(self._outcomes),
                           unreachable=dict(self.unreachable), check_mode=self.check_mode,
                           duration=time.monotonic() - started, verify_tasks=verify, outside=list(self.outside))
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
        if self.unreadable:
            node, lost = next(iter(self.unreadable.items()))
            self._record(TaskOutcome(task.name, task.phase, None, Status.FAILED,
                                     message=f"cannot read {node} (outside --limit): {lost}",
                                     hint="the cluster's shared state is computed from every node; bring "
                                          f"{node} back, then rerun"))
            return
        self._execute(task, self.cluster_context, None)

    def _need_outcome(self, need: str, node: str | None) -> TaskOutcome | None:
        scope = self.graph.task(need).scope
        return self._by_key.get((need, None if scope is Scope.CLUSTER else node))

    @staticmethod
    def _why_blocked(need: str, outcome: TaskOutcome) -> str:
        if outcome.not_selected:
            return f"needs {need}, {LEFT_OUT}"
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

    def _awaited(self, task: Task, node: str | None) -> str | None:
        """--check: the need (nearest first) whose changes are not applied yet, so that this task's check sees
        a state that will not be the one it runs on; None outside --check or when every need is as wanted."""
        if not self.check_mode:
            return None
        nodes = [node] if node is not None else self.nodes
        for need in self.graph.needs_closure(task.name):
            if self.graph.task(need).scope is Scope.CLUSTER:
                outcomes = [self._by_key.get((need, None))]
            else:
                outcomes = [self._by_key.get((need, n)) for n in nodes]
            for outcome in outcomes:
                if outcome is not None and outcome.awaits:
                    return outcome.awaits
        return None

    def _execute(self, task: Task, ctx: Any, node: str | None) -> None:
        self._emit(Event("task_start", task=task.name, phase=task.phase, node=node))
        outcome = TaskOutcome(task.name, task.phase, node, Status.OK)
        started = time.monotonic()
        awaited = self._awaited(task, node)
        try:
            if awaited and task.read_only:
                self._pending(outcome, awaited, None)
            else:
                self._converge(task, ctx, outcome)
        except (TaskFailed, SparkctlError) as failure:
            if awaited and not isinstance(failure, Unreachable):
                # what it found wrong is what the awaited need is about to change
                self._pending(outcome, awaited, failure.message)
            else:
                self._fail(outcome, failure)
        except Exception as error:
            outcome.status = Status.FAILED
            outcome.message = f"internal error: {type(error).__name__}: {error}"
            outcome.traceback = traceback.format_exc()
        outcome.duration = time.monotonic() - started
        self._record(outcome)

    def _outside_nodes(self, changes: list[Change]) -> list[str]:
        named = {c.node for c in changes}
        return [n for n in self.outside if n in named or None in named]

    @staticmethod
    def _pending(outcome: TaskOutcome, awaited: str, now: str | None) -> None:
        outcome.status, outcome.pending_on, outcome.changes = Status.SKIPPED, awaited, []
        outcome.message = f"cannot know until {awaited} is applied" + (f" (now: {now})" if now else "")

    @staticmethod
    def _fail(outcome: TaskOutcome, error: TaskFailed | SparkctlError) -> None:
        outcome.status = Status.FAILED
        outcome.message, outcome.hint = error.message, error.hint
        if isinstance(error, TaskFailed):
            outcome.details = error.details
        elif isinstance(error, Unreachable) and outcome.node is not None:
            # Only a node can vanish; a cluster task losing a node is that task failing.
            outcome.status = Status.UNREACHABLE

    def _within_limit(self, outcome: TaskOutcome, changes: list[Change]) -> list[Change]:
        """A cluster-scope task's changes on limited nodes; the others are kept on the outcome, not applied."""
        if outcome.node is not None or not self.outside:
            return changes
        mine: list[Change] = []
        for change in changes:
            (mine if change.node in self.nodes else outcome.outside).append(change)
        return mine

    def _converge(self, task: Task, ctx: Any, outcome: TaskOutcome) -> None:
        changes = self._within_limit(outcome, task.check(ctx))
        if outcome.outside:
            self._emit(Event("warning", task=task.name, phase=task.phase,
                             message=f"left alone outside --limit: {len(outcome.outside)} change(s)",
                             details=[c.summary if c.node is None or c.node in c.summary
                                      else f"{c.node}: {c.summary}" for c in outcome.outside],
                             hint=f"run with --limit {','.join(self._outside_nodes(outcome.outside))} (or without "
                                  "--limit) to change them"))
        if not changes:
            if outcome.outside:
                outcome.message = f"{len(outcome.outside)} change(s) outside --limit left alone"
            return
        outcome.changes = list(changes)
        outcome.status = Status.CHANGED
        if self.check_mode:
            outcome.would_change = True
            return
        self._emit(Event("task_changes", task=task.name, phase=task.phase, node=outcome.node,
                         changes=change_dicts(changes)))
        task.apply(ctx, changes)
        remaining = self._within_limit(TaskOutcome(task.name, task.phase, outcome.node, Status.OK),
                                       task.check(ctx))
        if remaining:
            outcome.status = Status.FAILED
            outcome.message = "did not converge: " + "; ".join(c.summary for c in remaining)
            outcome.details = [c.diff for c in remaining if c.diff]
