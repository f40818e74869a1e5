"""A run's request as the command line gives it: the options every task sees, --limit, --only, --skip, --forks.
Light, like what it checks: the command line checks it, and starts connecting (runs/opening.py), before the rest of
sparkctl is loaded."""

from __future__ import annotations

from dataclasses import dataclass, field

from sparkctl.errors import BadInput
from sparkctl.inventory import Inventory
from sparkctl.taskgraph.graph import Graph
from sparkctl.taskgraph.runner import DEFAULT_FORKS
from sparkctl.tasks.options import RunOptions


@dataclass
class RunRequest:
    options: RunOptions = field(default_factory=RunOptions)
    limit: set[str] | None = None
    only: set[str] | None = None
    skip: set[str] | None = None
    forks: int = DEFAULT_FORKS

    @classmethod
    def of(cls, *, check: bool = False, diff: bool = False, verbosity: int = 0, revert_after: float = 60.0,
           become_password: str | None = None, limit: set[str] | None = None, only: set[str] | None = None,
           skip: set[str] | None = None, forks: int = DEFAULT_FORKS, reprove: bool = False,
           refresh: bool = False) -> RunRequest:
        options = RunOptions(check=check, diff=diff, verbosity=verbosity, netplan_confirm_timeout=float(revert_after),
                             become_password=become_password, reprove=reprove, refresh=refresh,
                             forks=forks)
        return cls(options=options, limit=limit, only=only, skip=skip, forks=forks)


def check_limit(inventory: Inventory, limit: set[str] | None) -> None:
    known = {n.name for n in inventory.nodes}
    unknown = sorted((limit or set()) - known)
    if unknown:
        raise BadInput(f"--limit: no node named {', '.join(unknown)} in the inventory",
                       hint=f"nodes: {', '.join(sorted(known))}")


def selected(graph: Graph, request: RunRequest) -> Graph:
    """The part of `graph` that --only and --skip choose; an unknown phase or task is refused."""
    try:
        return graph.select(request.only, request.skip)
    except ValueError as exc:
        raise BadInput(str(exc)) from exc
