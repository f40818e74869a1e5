"""Phase model: will it fit, the HF token as a 0600 file, the commit served pinned, the model and draft in every
node's HF cache, checked against the hashes the Hub recorded."""

from sparkctl.taskgraph.task import Task
from sparkctl.tasks.model.copy import ModelCopyTask
from sparkctl.tasks.model.fetch import ModelFetchTask
from sparkctl.tasks.model.fit import ModelFitTask
from sparkctl.tasks.model.pin import ModelPinTask
from sparkctl.tasks.model.token import ModelTokenTask
from sparkctl.tasks.model.verify import ModelVerifyTask

TASKS: list[Task] = [ModelFitTask(), ModelTokenTask(), ModelPinTask(), ModelFetchTask(), ModelVerifyTask(),
                     ModelCopyTask()]
