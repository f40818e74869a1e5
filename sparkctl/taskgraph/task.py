"""The task contract: check (read-only) -> changes -> apply (exactly those) -> check again."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import ClassVar, Generic, TypeVar

from sparkctl.errors import SparkctlError

#: What a task's check and apply work on: one node's context, or the cluster's (sparkctl/tasks/context.py)
C = TypeVar("C")
#: What a change carries from check to apply (each task its own kind)
P = TypeVar("P")


class Scope(str, Enum):
    NODE = "node"
    CLUSTER = "cluster"


class Status(str, Enum):
    OK = "ok"
    CHANGED = "changed"
    FAILED = "failed"
    SKIPPED = "skipped"
    UNREACHABLE = "unreachable"
    INTERRUPTED = "interrupted"  # cut by Ctrl-C while it ran


@dataclass
class Change(Generic[P]):
    """One thing a task would change: a one-line summary, a diff for files, a payload for apply (the task's own
    kind: apply reads only what its check put there).

    `node`: where a cluster-scope task's change happens. With --limit, only changes on the limited nodes are
    applied; the others are reported as left alone (a change naming no node touches the whole cluster)."""

    summary: str
    diff: str | None = None
    payload: P | None = field(default=None, repr=False, compare=False)
    node: str | None = None

    def carried(self) -> P:
        """The payload, for apply: a task whose changes carry one always puts it there in check."""
        if self.payload is None:
            raise TypeError(f"{self.summary}: this change carries nothing")
        return self.payload


class TaskFailed(SparkctlError):
    """Raised by check or apply: the task failed on this node (or cluster) with a one-line reason."""


class Task(Generic[C, P]):
    """A step of a playbook. Subclasses set the class attributes and implement check/apply.

    `check(ctx)` must not change anything; an empty list means the node (or cluster) is as wanted.
    `apply(ctx, changes)` does exactly those changes. The runner checks again after apply; a non-empty
    second check is a failure ("did not converge").
    For node scope, ctx is one node's context; for cluster scope, the cluster context.
    """

    name: ClassVar[str]
    phase: ClassVar[str]
    scope: ClassVar[Scope] = Scope.NODE
    needs: ClassVar[tuple[str, ...]] = ()
    #: Cluster scope: whether the task must reach every node. False for tasks that only judge facts already
    #: read (a node lost mid-run is judged on what was last read of it), so the other nodes can go on.
    needs_every_node: ClassVar[bool] = True
    description: ClassVar[str] = ""
    #: What check looks at and what apply changes, in words (playbooks.md).
    checks: ClassVar[str] = ""
    changes: ClassVar[str] = ""
    #: The check only proves what the tasks it needs set up and changes nothing (a verify step): in --check,
    #: while one of those would still change, it cannot know, and says so without trying.
    read_only: ClassVar[bool] = False

    def not_applicable(self, ctx: C) -> str | None:
        """Why this task has nothing to do for this inventory (e.g. TensorRT-LLM's MPI hostfile when vLLM serves),
        or None. Said as a skip with that reason; what needs it still runs."""
        return None

    def ask_early(self, ctx: C) -> None:
        """A read-only cluster task: start, in the background, what its check will ask of the outside world (the
        runner calls it as the run begins); its check takes the answer only where nothing changed since
        (tasks/early.py). Asks nothing by default."""

    def check(self, ctx: C) -> list[Change[P]]:
        raise NotImplementedError

    def apply(self, ctx: C, changes: list[Change[P]]) -> None:
        raise NotImplementedError
