"""Phase serve: the TensorRT-LLM config on every node, the TP mpirun from the head, a smoke test."""

from sparkctl.tasks.serve.config import ServeConfigTask
from sparkctl.tasks.serve.launch import ServeLaunchTask
from sparkctl.tasks.serve.smoke import ServeSmokeTask

TASKS = [ServeConfigTask(), ServeLaunchTask(), ServeSmokeTask()]
