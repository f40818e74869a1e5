"""The task graph: tasks, the graph, the runner and events.

It knows nothing about Sparks, click or rich; playbooks and the CLI build on it.
"""

from sparkctl.taskgraph.events import EVENT_KINDS, Event, EventBus
from sparkctl.taskgraph.graph import Graph, GraphError, UnknownSelection
from sparkctl.taskgraph.outcome import CLUSTER_ROW, NOT_SELECTED, RunResult, TaskOutcome
from sparkctl.taskgraph.runner import Runner
from sparkctl.taskgraph.stops import Interruption, LostNodes
from sparkctl.taskgraph.task import Change, Scope, Status, Task, TaskFailed

__all__ = [
    "CLUSTER_ROW",
    "EVENT_KINDS",
    "NOT_SELECTED",
    "Change",
    "Event",
    "EventBus",
    "Graph",
    "GraphError",
    "Interruption",
    "LostNodes",
    "RunResult",
    "Runner",
    "Scope",
    "Status",
    "Task",
    "TaskFailed",
    "TaskOutcome",
    "UnknownSelection",
]
