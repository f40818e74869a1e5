"""Phase serve: each world's config on its nodes, its units (the head's runs the TP mpirun, or each rank its server)
that bring it back, its figures collector where the engine needs one, the gateway in front of every world, a smoke
test through the gateway."""

from sparkctl.taskgraph.task import Task
from sparkctl.tasks.serve.collector import ServeCollectorTask
from sparkctl.tasks.serve.config import ServeConfigTask
from sparkctl.tasks.serve.deployment import ServeRecordTask, ServeSwitchTask
from sparkctl.tasks.serve.gateway import GatewayRemoveTask, ServeGatewayTask
from sparkctl.tasks.serve.launch import ServeLaunchTask
from sparkctl.tasks.serve.smoke import ServeSmokeTask
from sparkctl.tasks.serve.unit import ServeUnitRemoveTask, ServeUnitTask

#: serve.switch is of phase container: it stands between the pull and the first container made again
TASKS: list[Task] = [ServeSwitchTask(), ServeConfigTask(), ServeUnitTask(), ServeLaunchTask(), ServeCollectorTask(),
                     ServeGatewayTask(), ServeSmokeTask(), ServeRecordTask()]
#: the unit goes first: its stop reaches the server in the container
DOWN_TASKS: list[Task] = [ServeUnitRemoveTask(), GatewayRemoveTask()]
