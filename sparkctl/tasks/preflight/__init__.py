"""Phase preflight: read-only checks that stop a run before anything changes."""

from sparkctl.tasks.preflight.checks import ClusterPreflight, NodePreflight

TASKS = [NodePreflight(), ClusterPreflight()]
