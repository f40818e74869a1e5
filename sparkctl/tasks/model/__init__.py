"""Phase model: will it fit, the HF token as a 0600 file, the model and draft in every node's HF cache."""

from sparkctl.taskgraph.task import Task
from sparkctl.tasks.model.copy import ModelCopyTask
from sparkctl.tasks.model.fetch import ModelFetchTask
from sparkctl.tasks.model.fit import ModelFitTask
from sparkctl.tasks.model.token import ModelTokenTask

TASKS: list[Task] = [ModelFitTask(), ModelTokenTask(), ModelFetchTask(), ModelCopyTask()]
