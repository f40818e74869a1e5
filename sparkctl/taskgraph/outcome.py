"""What a run produced: one outcome per task and node, and the run's result (recap, exit status, what a lost
node or a Ctrl-C left undone)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from sparkctl.exitcodes import ExitStatus
from sparkctl.taskgraph.events import Event
from sparkctl.taskgraph.task import Change, Status

#: The recap row for cluster-scope tasks; parentheses cannot appear in a host name, so it never clashes.
CLUSTER_ROW = "(cluster)"
NOT_SELECTED = "not selected (--only/--skip)"
LEFT_OUT = "left out by --skip"
RECAP_COLUMNS = ("ok", "changed", "failed", "skipped", "unreachable")
#: A recap column only runs stopped by Ctrl-C have.
INTERRUPTED_COLUMN = "interrupted"
CUT_MESSAGE = "cut by Ctrl-C while it ran (its commands are done or not done on the node: the next run checks)"


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
    #: skipped because the task has nothing to do for this inventory (Task.not_applicable): never blocks
    not_applicable: bool = False
    #: the node whose loss made this outcome (a cluster task cut or skipped, a peer's task skipped)
    lost_node: str | None = None
    #: --check only: this task cannot know its answer until that need (which would change) is applied
    pending_on: str | None = None
    #: --limit: what this cluster-scope task found to change on nodes outside the limit, left alone
    outside: list[Change] = field(default_factory=list)

    @property
    def blocks_dependents(self) -> bool:
        """A need that did not run (failed, unreachable, cut, skipped, left out) stops what needs it; one that
        would change or cannot know yet (--check) does not: its dependents still say what they can."""
        if self.status in (Status.FAILED, Status.UNREACHABLE, Status.INTERRUPTED):
            return True
        return self.status is Status.SKIPPED and self.pending_on is None and not self.not_applicable

    @property
    def awaits(self) -> str | None:
        """--check: the need whose apply this outcome waits for (itself, when it would change)."""
        if self.pending_on is not None:
            return self.pending_on
        return self.task if self.status is Status.CHANGED and self.would_change else None

    def to_event(self) -> Event:
        data: dict[str, Any] = {}
        if self.not_selected:
            data["reason"] = "not_selected"
        if self.not_applicable:
            data["reason"] = "not_applicable"
        if self.pending_on is not None:
            data.update(reason="pending", pending_on=self.pending_on)
        if self.outside:
            data["outside_limit"] = change_dicts(self.outside)
        if self.lost_node:
            data["lost_node"] = self.lost_node
        return Event(
            "task_result", task=self.task, phase=self.phase, node=self.node, status=self.status.value,
            message=self.message, hint=self.hint, details=list(self.details),
            changes=change_dicts(self.changes),
            duration=self.duration, would_change=self.would_change or None, traceback=self.traceback,
            data=data,
        )


@dataclass
class RunResult:
    nodes: list[str]  # the nodes of the run (after --limit), in inventory order
    outcomes: list[TaskOutcome]
    unreachable: dict[str, str]  # node -> why, whether known at start or found mid-run
    check_mode: bool
    duration: float
    #: nodes lost during the run -> the task that was running when the loss was noticed
    lost_during: dict[str, str | None] = field(default_factory=dict)
    #: per lost node, its tasks that never ran (graph order)
    undone: dict[str, list[str]] = field(default_factory=dict)
    interrupted: bool = False
    #: Ctrl-C: tasks that had not started on some node of the run (graph order)
    not_started: list[str] = field(default_factory=list)
    #: the tasks of the graph's verify phase (empty: the playbook has none)
    verify_tasks: list[str] = field(default_factory=list)
    #: --limit: the nodes outside it (read, never changed)
    outside: list[str] = field(default_factory=list)
    #: per node, the round trips its connection made in the run (benchmarks/bootstrap_noop.py prints them)
    round_trips: dict[str, int] = field(default_factory=dict)

    def outcome(self, task: str, node: str | None = None) -> TaskOutcome | None:
        """The outcome of `task` on `node` (None: cluster scope); unreachable nodes answer unreachable."""
        for o in self.outcomes:
            if o.task == task and o.node == node:
                return o
        if node in self.unreachable:
            return TaskOutcome(task, "", node, Status.UNREACHABLE, message=self.unreachable[node])
        return None

    def recap(self) -> dict[str, dict[str, int]]:
        columns = (*RECAP_COLUMNS, INTERRUPTED_COLUMN) if self.interrupted else RECAP_COLUMNS
        rows: dict[str, dict[str, int]] = {n: dict.fromkeys(columns, 0) for n in self.nodes}
        for o in self.outcomes:
            row = rows.setdefault(o.node or CLUSTER_ROW, dict.fromkeys(columns, 0))
            # Like Ansible: an unreachable node counts once, whatever the number of tasks it missed. A cluster
            # task cut by a lost node counts on the cluster row.
            if o.status is not Status.UNREACHABLE or o.node is None:
                row[o.status.value] += 1
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

    @property
    def cut(self) -> list[TaskOutcome]:
        return [o for o in self.outcomes if o.status is Status.INTERRUPTED]

    @property
    def left_undone(self) -> list[str]:
        """Tasks skipped or cut on the nodes still in the run (or the cluster) because a node was lost."""
        out: list[str] = []
        for o in self.outcomes:
            if o.lost_node and o.status in (Status.SKIPPED, Status.UNREACHABLE) and o.task not in out:
                out.append(o.task)
        return out

    def exit_status(self) -> ExitStatus:
        if self.interrupted:
            return ExitStatus.INTERRUPTED
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

    def recap_data(self) -> dict[str, Any]:
        """What the recap says beyond the counts: which node is lost, why, during what, and what was left undone;
        what a Ctrl-C cut and what it kept from starting."""
        data: dict[str, Any] = {}
        verified, why_not = self.verification()
        if verified is not None:
            data["verified"] = verified
            if why_not:
                data["not_verified"] = why_not
        if self.pending:
            data["pending"] = len(self.pending)
        left = sum(len(o.outside) for o in self.outcomes)
        if left:
            data["outside_limit"] = left
        if self.unreachable:
            data["lost"] = {node: {"reason": why, "during": self.lost_during.get(node),
                                   "undone": list(self.undone.get(node, []))}
                            for node, why in self.unreachable.items()}
            if self.left_undone:
                data["left_undone"] = self.left_undone
        if self.interrupted:
            data["interrupted"] = {"cut": [{"task": o.task, "node": o.node} for o in self.cut],
                                   "not_started": list(self.not_started)}
        return data

    def recap_event(self) -> Event:
        return Event("recap", nodes=self.recap(), exit_status=int(self.exit_status()),
                     duration=self.duration, check_mode=self.check_mode, data=self.recap_data())
