"""The task-graph engine: tasks, the graph, the runner, events and the run journal.

It knows nothing about Sparks, click or rich; playbooks and the CLI build on it.
"""

from sparkctl.engine.events import EVENT_KINDS, Event, EventBus, redacted
from sparkctl.engine.graph import Graph, GraphError, UnknownSelection
from sparkctl.engine.journal import Journal, latest_runs, read_run, runs_dir
from sparkctl.engine.runner import CLUSTER_ROW, NOT_SELECTED, Runner, RunResult, TaskOutcome
from sparkctl.engine.task import Change, Scope, Status, Task, TaskFailed

__all__ = [
    "CLUSTER_ROW",
    "EVENT_KINDS",
    "NOT_SELECTED",
    "Change",
    "Event",
    "EventBus",
    "Graph",
    "GraphError",
    "Journal",
    "RunResult",
    "Runner",
    "Scope",
    "Status",
    "Task",
    "TaskFailed",
    "TaskOutcome",
    "UnknownSelection",
    "latest_runs",
    "read_run",
    "redacted",
    "runs_dir",
]
