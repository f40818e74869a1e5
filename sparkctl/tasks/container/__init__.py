"""Phase container: the trtllm-multinode container on every node, its mounted files and its ssh mesh."""

from sparkctl.tasks.container.image import ContainerImageTask
from sparkctl.tasks.container.remove import ContainerRemoveTask
from sparkctl.tasks.container.run import ContainerRunTask
from sparkctl.tasks.container.ssh import ContainerSshTask
from sparkctl.tasks.container.state import ContainerStateTask

TASKS = [ContainerImageTask(), ContainerStateTask(), ContainerRunTask(), ContainerSshTask()]
DOWN_TASKS = [ContainerRemoveTask()]
