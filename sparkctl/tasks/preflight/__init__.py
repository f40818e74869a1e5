"""Phase preflight: read-only checks that stop a run before anything changes."""

from sparkctl.taskgraph.task import Task
from sparkctl.tasks.preflight.checks import ClusterPreflight, NodePreflight

TASKS: list[Task] = [NodePreflight(), ClusterPreflight()]
