"""Phase verify: each container's real settings against its node's real interfaces, and an MPI probe."""

from sparkctl.taskgraph.task import Task
from sparkctl.tasks.verify.fabric import FabricVerify

TASKS: list[Task] = [FabricVerify()]
