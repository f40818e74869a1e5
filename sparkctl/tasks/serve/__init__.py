"""Phase serve: the TensorRT-LLM config on every node, the unit on the head that runs the TP mpirun and brings it
back, the gateway in front of it, a smoke test through the gateway."""

from sparkctl.taskgraph.task import Task
from sparkctl.tasks.serve.config import ServeConfigTask
from sparkctl.tasks.serve.deployment import ServeRecordTask, ServeSwitchTask
from sparkctl.tasks.serve.gateway import GatewayRemoveTask, ServeGatewayTask
from sparkctl.tasks.serve.launch import ServeLaunchTask
from sparkctl.tasks.serve.smoke import ServeSmokeTask
from sparkctl.tasks.serve.unit import ServeUnitRemoveTask, ServeUnitTask

#: serve.switch is of phase container: it stands between the pull and the first container made again
TASKS: list[Task] = [ServeSwitchTask(), ServeConfigTask(), ServeUnitTask(), ServeLaunchTask(), ServeGatewayTask(),
                     ServeSmokeTask(), ServeRecordTask()]
#: the unit goes first: its stop reaches the server in the container
DOWN_TASKS: list[Task] = [ServeUnitRemoveTask(), GatewayRemoveTask()]
