"""Phase mpi: the Open MPI hostfile in every container, proven by mpirun from the head."""

from sparkctl.taskgraph.task import Task
from sparkctl.tasks.mpi.hostfile import HostfileTask

TASKS: list[Task] = [HostfileTask()]
