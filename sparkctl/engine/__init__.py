"""The task-graph engine: tasks, the graph, the runner and events.

It knows nothing about Sparks, click or rich; playbooks and the CLI build on it.
"""

from sparkctl.engine.events import EVENT_KINDS, Event, EventBus
from sparkctl.engine.graph import Graph, GraphError, UnknownSelection
from sparkctl.engine.outcome import CLUSTER_ROW, NOT_SELECTED, RunResult, TaskOutcome
from sparkctl.engine.runner import Runner
from sparkctl.engine.stops import Interruption, LostNodes
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
