"""The runner: walks a graph, nodes in parallel, check -> apply -> check again.

Node-scope tasks that follow each other in a phase form a stage: each node walks the stage on its own, so a slow
node holds up the others only where they must meet, at a cluster-scope task (or the end of a phase). A node lost
mid-run leaves the run; the others finish what does not need it. A Ctrl-C cuts what runs and starts nothing more.
"""

from __future__ import annotations

import threading
import time
import traceback
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from sparkctl.errors import Interrupted, SparkctlError, Unreachable
from sparkctl.taskgraph.events import CONNECT_TASK, Event
from sparkctl.taskgraph.graph import Graph, UnknownSelection, did_you_mean
from sparkctl.taskgraph.outcome import (
    CLUSTER_ROW,
    CUT_MESSAGE,
    LEFT_OUT,
    NOT_SELECTED,
    RECAP_COLUMNS,
    RunResult,
    TaskOutcome,
    change_dicts,
)
from sparkctl.taskgraph.stops import Interruption, LostNodes
from sparkctl.taskgraph.task import Change, Scope, Status, Task

#: How long the recap waits for the interrupt's callbacks (transports cut, the interrupt event said).
INTERRUPT_NOTICE_S = 5.0

__all__ = ["CLUSTER_ROW", "NOT_SELECTED", "RECAP_COLUMNS", "RunResult", "Runner", "TaskOutcome", "change_dicts"]

#: How many nodes a run works on at once (`--forks`, Ansible's word), unless told otherwise.
DEFAULT_FORKS = 32


def stages(tasks: list[Task]) -> list[list[Task]]:
    """Tasks in order, grouped: a cluster-scope task alone; node-scope tasks in a row of one phase together."""
    out: list[list[Task]] = []
    for task in tasks:
        previous = out[-1][-1] if out else None
        if (task.scope is Scope.NODE and previous is not None and previous.scope is Scope.NODE
                and previous.phase == task.phase):
            out[-1].append(task)
        else:
            out.append([task])
    return out


class Runner:
    """Runs a graph over nodes. Each node-scope task's outcome is that node's; a cluster task meets every node.

    With `limit` (Ansible's meaning): node-scope tasks run on the limited nodes only; cluster-scope tasks still
    compute the cluster's state from every node (their context reads them all) but apply only the changes on
    limited nodes (`Change.node`), reporting the others as left alone. A node outside the limit that cannot be
    read makes every cluster-scope task refuse, naming it.
    """

    def __init__(self, graph: Graph, *, nodes: list[str], node_contexts: dict[str, Any], cluster_context: Any,
                 unreachable: dict[str, str], forks: int = DEFAULT_FORKS, check_mode: bool = False,
                 emit: Callable[[Event], None], limit: set[str] | None = None, lost: LostNodes | None = None,
                 interruption: Interruption | None = None, on_stage: Callable[[bool], None] | None = None,
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
        self.lost = lost if lost is not None else LostNodes()
        for node, why in unreachable.items():
            if node in self.nodes:
                self.lost.lose(node, why)
        self._unreachable_at_start = {n: w for n, w in self.lost.as_dict().items() if n in self.nodes}
        missing = [n for n in self.nodes if n not in self.lost and n not in node_contexts]
        if missing:
            raise ValueError(f"no context for reachable node(s): {', '.join(missing)}")
        self.node_contexts = node_contexts
        self.cluster_context = cluster_context
        self.forks = forks
        self.check_mode = check_mode
        self.interruption = interruption if interruption is not None else Interruption()
        #: told before each stage whether it is node tasks (True) or a cluster task (False): the contexts pin or
        #: refresh what the nodes see of each other
        self._on_stage = on_stage
        self._emit_to = emit
        #: what run_start says beyond the runner's own (the command, the cluster, versions)
        self._start = dict(start or {})
        self._lock = threading.Lock()
        self._outcomes: list[TaskOutcome] = []
        self._by_key: dict[tuple[str, str | None], TaskOutcome] = {}
        self._running: dict[tuple[str, str | None], None] = {}
        self.lost.listen(self._on_lost)
        self.interruption.on_request(self._on_interrupt)

    @property
    def unreachable(self) -> dict[str, str]:
        return {n: w for n, w in self.lost.as_dict().items() if n in self.nodes}

    def _emit(self, event: Event) -> None:
        with self._lock:
            self._emit_to(event)

    def _record(self, outcome: TaskOutcome) -> None:
        with self._lock:
            self._outcomes.append(outcome)
            self._by_key[(outcome.task, outcome.node)] = outcome
            self._running.pop((outcome.task, outcome.node), None)
            self._emit_to(outcome.to_event())

    def _on_lost(self, node: str, why: str, during: str | None) -> None:
        if node in self.nodes:
            self._emit(Event("node_lost", node=node, task=during, message=why,
                             hint="left out of the rest of this run; the other nodes go on"))

    def _on_interrupt(self) -> None:
        with self._lock:
            running = [f"{task} on {node or 'the cluster'}" for task, node in self._running]
            self._emit_to(Event("interrupt", message="interrupted: cutting " + (", ".join(running) or "nothing")
                                + "; nothing more starts", hint="press Ctrl-C again to stop at once"))

    def run(self) -> RunResult:
        started = time.monotonic()
        start: dict[str, Any] = {**self._start, "nodes": list(self.nodes), "tasks": len(self.graph)}
        if self.outside:
            start["outside_limit"] = list(self.outside)
        if self.graph.added:
            start["added_needs"] = list(self.graph.added)
        self._emit(Event("run_start", check_mode=self.check_mode, data=start))
        for node, why in self._unreachable_at_start.items():
            self._emit(Event("task_result", task=CONNECT_TASK, node=node, status=Status.UNREACHABLE.value,
                             message=why))
        for node, why in self.unreadable.items():
            self._emit(Event("warning", node=node, message=f"outside --limit and unreachable: {why}",
                             hint="the cluster-wide tasks need to read every node: bring it back, or remove it "
                                  "from the inventory"))
        self._ask_early()
        with ThreadPoolExecutor(max_workers=max(1, min(self.forks, len(self.nodes))),
                                thread_name_prefix="sparkctl-node") as pool:
            for stage in stages(self.graph.ordered()):
                if self.interruption.requested:
                    break
                if self._on_stage is not None:
                    self._on_stage(stage[0].scope is Scope.NODE)
                if stage[0].scope is Scope.CLUSTER:
                    self._run_on_cluster(stage[0])
                else:
                    self._run_stage(stage, pool)
        return self._result(time.monotonic() - started)

    def _ask_early(self) -> None:
        """Let the selected read-only cluster tasks start what they will ask of the outside world (Task.ask_early),
        in a run that will check them: not in --check (they wait on what would change), and not with a node out
        of the run from its start (they need every node)."""
        if self.check_mode or self._unreachable_at_start or self.unreadable:
            return
        for task in self.graph.ordered():
            if task.read_only and task.scope is Scope.CLUSTER and self.graph.is_selected(task.name):
                try:
                    task.ask_early(self.cluster_context)
                except Exception as exc:  # noqa: BLE001 - an early ask only saves time: the task asks at its turn
                    self._emit(Event("warning", task=task.name, message=f"could not ask early: {exc}",
                                     hint="the task asks at its turn"))

    def _result(self, duration: float) -> RunResult:
        with self._lock:
            outcomes = list(self._outcomes)
            done = set(self._by_key)
        unreachable = self.unreachable
        lost_during = {n: self.lost.during(n) for n in self.lost.mid_run() if n in self.nodes}
        undone = {n: [t.name for t in self.graph.ordered()
                      if t.scope is Scope.NODE and self.graph.is_selected(t.name) and (t.name, n) not in done]
                  for n in unreachable}
        interrupted = self.interruption.requested
        not_started = []
        if interrupted:
            # the interrupt's own event comes from the callbacks' thread (after the transports are cut): it belongs
            # before the recap, in the stream and the journal alike
            self.interruption.done.wait(INTERRUPT_NOTICE_S)
            for task in self.graph.ordered():
                wanted = [None] if task.scope is Scope.CLUSTER else [n for n in self.nodes if n not in unreachable]
                if self.graph.is_selected(task.name) and any((task.name, n) not in done for n in wanted):
                    not_started.append(task.name)
        verify = [t.name for t in self.graph.ordered() if t.phase == self.graph.verify_phase]
        result = RunResult(nodes=list(self.nodes), outcomes=outcomes, unreachable=unreachable,
                           check_mode=self.check_mode, duration=duration, lost_during=lost_during, undone=undone,
                           interrupted=interrupted, not_started=not_started, verify_tasks=verify,
                           outside=list(self.outside))
        self._emit(result.recap_event())
        return result

    # --- node scope ------------------------------------------------------------------------------

    def _run_stage(self, stage: list[Task], pool: ThreadPoolExecutor) -> None:
        targets = [n for n in self.nodes if n not in self.lost]
        futures = [pool.submit(self._walk_stage, stage, node) for node in targets]
        try:
            for future in futures:
                future.result()  # the barrier; re-raises only what is not a task outcome (e.g. a broken sink)
        except BaseException:
            # a broken sink or a KeyboardInterrupt outside the SIGINT handler: start nothing new
            self.interruption.request()
            for future in futures:
                future.cancel()
            raise

    def _walk_stage(self, stage: list[Task], node: str) -> None:
        """One node's way through a stage: its tasks in order, on its own pace."""
        for task in stage:
            if self.interruption.requested or node in self.lost:
                return
            if not self.graph.is_selected(task.name):
                self._record(TaskOutcome(task.name, task.phase, node, Status.SKIPPED, message=NOT_SELECTED,
                                         not_selected=True))
                continue
            blocked = self._blocked_on_node(task, node)
            if blocked:
                why, lost_node = blocked
                self._record(TaskOutcome(task.name, task.phase, node, Status.SKIPPED, message=why,
                                         lost_node=lost_node))
                continue
            self._execute(task, self.node_contexts[node], node)

    def _need_outcome(self, need: str, node: str | None) -> TaskOutcome | None:
        scope = self.graph.task(need).scope
        return self._by_key.get((need, None if scope is Scope.CLUSTER else node))

    @staticmethod
    def _why_blocked(need: str, outcome: TaskOutcome) -> tuple[str, str | None]:
        if outcome.not_selected:
            return f"needs {need}, {LEFT_OUT}", None
        if outcome.status is Status.SKIPPED:
            return outcome.message or f"needs {need}, skipped", outcome.lost_node  # names the root cause
        where = outcome.node or "the cluster"
        if outcome.status is Status.UNREACHABLE:
            lost = outcome.lost_node or outcome.node
            return f"needs {need}, {lost or where} unreachable", lost
        if outcome.status is Status.INTERRUPTED:
            return f"needs {need}, cut on {where}", None
        return f"needs {need}, failed on {where}", None

    def _blocked_on_node(self, task: Task, node: str) -> tuple[str, str | None] | None:
        for need in self.graph.needs_closure(task.name):
            outcome = self._need_outcome(need, node)
            if outcome is not None and outcome.blocks_dependents:
                return self._why_blocked(need, outcome)
        return None

    # --- cluster scope ---------------------------------------------------------------------------

    def _run_on_cluster(self, task: Task) -> None:
        if not self.graph.is_selected(task.name):
            self._record(TaskOutcome(task.name, task.phase, None, Status.SKIPPED, message=NOT_SELECTED,
                                     not_selected=True))
            return
        blocked = self._blocked_on_cluster(task)
        if blocked:
            why, lost_node = blocked
            self._record(TaskOutcome(task.name, task.phase, None, Status.SKIPPED, message=why,
                                     lost_node=lost_node))
            return
        if self.unreadable:
            node, lost = next(iter(self.unreadable.items()))
            self._record(TaskOutcome(task.name, task.phase, None, Status.FAILED,
                                     message=f"cannot read {node} (outside --limit): {lost}",
                                     hint="the cluster's shared state is computed from every node; bring "
                                          f"{node} back, then rerun"))
            return
        self._execute(task, self.cluster_context, None)

    def _blocked_on_cluster(self, task: Task) -> tuple[str, str | None] | None:
        out = [n for n in self.nodes if n in self.lost]
        if out and (task.needs_every_node or len(out) == len(self.nodes)):
            # a task that judges the nodes it reaches has none to judge when every node is out
            return f"needs every node, {out[0]} unreachable", out[0]
        closure = self.graph.needs_closure(task.name)
        for need in closure:
            if self.graph.task(need).scope is Scope.CLUSTER:
                outcome = self._need_outcome(need, None)
                if outcome is not None and outcome.blocks_dependents:
                    return self._why_blocked(need, outcome)
        blocked = {}
        for node in self.nodes:
            if node in self.lost:
                continue  # a task that does not need every node is judged on what was read of it
            for need in closure:
                outcome = self._need_outcome(need, node)
                if outcome is not None and outcome.blocks_dependents:
                    blocked[node] = self._why_blocked(need, outcome)
                    break
        if not blocked:
            return None
        if task.needs_every_node or len(blocked) == len([n for n in self.nodes if n not in self.lost]):
            return next(iter(blocked.values()))
        return None  # it judges the nodes whose needs were met; the others are stopped on their own row

    # --- one task --------------------------------------------------------------------------------

    def _execute(self, task: Task, ctx: Any, node: str | None) -> None:
        with self._lock:
            if self.interruption.requested:
                # Ctrl-C landed after this node's walk looked and before the start: under the lock the interrupt
                # notice is out already, and nothing starts after it (the recap lists the task as not started)
                return
            self._running[(task.name, node)] = None
            self._emit_to(Event("task_start", task=task.name, phase=task.phase, node=node))
        outcome = TaskOutcome(task.name, task.phase, node, Status.OK)
        started = time.monotonic()
        awaited = self._awaited(task, node)
        try:
            if self.interruption.requested:
                raise Interrupted(node or CLUSTER_ROW)
            why_not = task.not_applicable(ctx)
            if why_not:
                outcome.status, outcome.message, outcome.not_applicable = Status.SKIPPED, why_not, True
            elif awaited and task.read_only:
                self._pending(outcome, awaited, None)
            else:
                self._converge(task, ctx, outcome)
        except Unreachable as lost:
            self._attribute(lost, task, node, outcome)
        except SparkctlError as failure:
            if awaited:
                # what it found wrong is what the awaited need is about to change
                self._pending(outcome, awaited, failure.message)
            else:
                outcome.status = Status.FAILED
                outcome.message, outcome.hint, outcome.details = failure.message, failure.hint, failure.details
        except Interrupted:
            outcome.status = Status.INTERRUPTED
            outcome.message = CUT_MESSAGE
        except Exception as error:
            outcome.status = Status.FAILED
            outcome.message = f"internal error: {type(error).__name__}: {error}"
            outcome.traceback = traceback.format_exc()
        outcome.duration = time.monotonic() - started
        self._record(outcome)

    def _attribute(self, lost: Unreachable, task: Task, node: str | None, outcome: TaskOutcome) -> None:
        """An unreachable node is the node the error came from, never the node whose task met it."""
        where = lost.node or node
        if where is None:  # a cluster task that cannot say which node: a failure of that task
            outcome.status, outcome.message, outcome.hint = Status.FAILED, lost.message, lost.hint
            return
        self.lost.lose(where, lost.message, during=task.name)
        outcome.message, outcome.hint = lost.message, lost.hint
        if where == node:
            outcome.status = Status.UNREACHABLE
        elif node is None:
            outcome.status, outcome.lost_node = Status.UNREACHABLE, where
        else:
            outcome.status, outcome.lost_node = Status.SKIPPED, where
            outcome.message = f"needs {where}, which became unreachable: {lost.message}"

    def _awaited(self, task: Task, node: str | None) -> str | None:
        """--check: the need (nearest first) whose changes are not applied yet, so that this task's check sees
        a state that will not be the one it runs on; None outside --check or when every need is as wanted."""
        if not self.check_mode:
            return None
        nodes = [node] if node is not None else self.nodes
        with self._lock:
            by_key = dict(self._by_key)
        for need in self.graph.needs_closure(task.name):
            if self.graph.task(need).scope is Scope.CLUSTER:
                outcomes = [by_key.get((need, None))]
            else:
                outcomes = [by_key.get((need, n)) for n in nodes]
            for outcome in outcomes:
                if outcome is not None and outcome.awaits:
                    return outcome.awaits
        return None

    @staticmethod
    def _pending(outcome: TaskOutcome, awaited: str, now: str | None) -> None:
        outcome.status, outcome.pending_on, outcome.changes = Status.SKIPPED, awaited, []
        outcome.message = f"cannot know until {awaited} is applied" + (f" (now: {now})" if now else "")

    def _outside_nodes(self, changes: list[Change]) -> list[str]:
        named = {c.node for c in changes}
        return [n for n in self.outside if n in named or None in named]

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
