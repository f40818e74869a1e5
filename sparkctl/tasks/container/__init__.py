"""Phase container: the trtllm-multinode container on every node, its mounted files and its ssh mesh."""

from sparkctl.taskgraph.task import Task
from sparkctl.tasks.container.image import ContainerImageTask
from sparkctl.tasks.container.relay import ContainerRelayTask
from sparkctl.tasks.container.remove import ContainerRemoveTask
from sparkctl.tasks.container.retire import ContainerRetireTask
from sparkctl.tasks.container.run import ContainerRunTask
from sparkctl.tasks.container.ssh import ContainerSshTask
from sparkctl.tasks.container.state import ContainerStateTask

TASKS: list[Task] = [ContainerImageTask(), ContainerStateTask(), ContainerRelayTask(), ContainerRetireTask(),
                     ContainerRunTask(), ContainerSshTask()]
DOWN_TASKS: list[Task] = [ContainerRemoveTask()]
