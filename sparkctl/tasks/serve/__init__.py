"""Phase serve: the TensorRT-LLM config on every node, the TP mpirun from the head, the gateway in front of it, a
smoke test through the gateway."""

from sparkctl.tasks.serve.config import ServeConfigTask
from sparkctl.tasks.serve.gateway import GatewayRemoveTask, ServeGatewayTask
from sparkctl.tasks.serve.launch import ServeLaunchTask
from sparkctl.tasks.serve.smoke import ServeSmokeTask

TASKS = [ServeConfigTask(), ServeLaunchTask(), ServeGatewayTask(), ServeSmokeTask()]
DOWN_TASKS = [GatewayRemoveTask()]
