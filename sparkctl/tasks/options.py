"""What a run was asked to do (--check, --diff, -v, --reprove, --forks, ...), as every task sees it. Light: the
command line builds it before the rest of sparkctl is loaded (runs/opening.py)."""

from __future__ import annotations

from dataclasses import dataclass, field

from sparkctl.taskgraph.runner import DEFAULT_FORKS


@dataclass
class RunOptions:
    check: bool = False
    diff: bool = False
    verbosity: int = 0
    #: seconds the node waits for sparkctl's confirmation before it reverts a netplan change by itself
    netplan_confirm_timeout: float = 60.0
    become_password: str | None = field(default=None, repr=False)
    #: run every proof again, none taken from the record (tasks/proof.py)
    reprove: bool = False
    #: resolve the model's and draft's revision on the Hub again and move the pin there (tasks/model/pin.py)
    refresh: bool = False
    #: the model's commit to serve whatever serve.revision resolves to: a rollback's (runs/rollback.py)
    model_commit: str | None = None
    #: how many nodes a cluster task reads or works on at once (`--forks`)
    forks: int = DEFAULT_FORKS
