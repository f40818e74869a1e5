"""Going back to the deployment that served before (sparkctl/plan/deployment.py).

After a bootstrap fails with a switch under way (serve.switch marked it on the head, serve.record has not yet
cleared it), the deployment in use before is put back by a bootstrap of the inventory with that deployment's
words (its image, its `serve:`), which makes the containers, the engine's config, the units and the gateway
what they were and waits for its smoke test; the run then fails with "rolled back" and the new world's cause.
`sparkctl serve rollback` does the same by hand, to the previous deployment.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from sparkctl.errors import BadInput, SparkctlError
from sparkctl.inventory import Inventory
from sparkctl.plan.deployment import Deployment, DeploymentRecord, deployment_inputs, with_deployment
from sparkctl.runs.bootstrap import TokenPrompt, ViewFactory, bootstrap, journaled_run
from sparkctl.runs.opening import Opening
from sparkctl.runs.playbooks import bootstrap_graph
from sparkctl.runs.request import RunRequest
from sparkctl.runs.serve_ops import connected, server_handle
from sparkctl.taskgraph import Event, RunResult
from sparkctl.taskgraph.task import Status

#: The failures that are the new deployment's: its containers would not start, or its world (config, units,
#: launch, gateway) did not come up and answer. A download, a pull or a refused image ID is not: the old
#: deployment shares the cause (a missing token, a full disk) or was never left, and a person fixes it.
DEPLOYMENT_FAILURES = ("container.run", "serve.config", "serve.unit", "serve.launch", "serve.collector",
                       "serve.gateway", "serve.smoke")
#: The tasks whose changes take the old world down or replace what it runs from: until one of them changed
#: something, the old world is as it was and there is nothing to put back.
WORLD_TASKS = ("container.retire", "container.run", "serve.config", "serve.unit", "serve.launch", "serve.collector",
               "serve.gateway")
ROLLBACK_TASK = "serve.rollback"


def read_head_record(inventory: Inventory) -> DeploymentRecord:
    """The head's record, read over one SSH connection."""
    with connected(inventory, inventory.head.name) as transport:
        return server_handle(inventory, transport).read_deployments()


def touched_the_world(result: RunResult) -> bool:
    """Did the run change (or start changing: an apply that failed) what the serving world runs from?"""
    return any(o.task in WORLD_TASKS and o.changes and o.status in (Status.CHANGED, Status.FAILED)
               for o in result.outcomes)


def _cause(result: RunResult) -> str:
    first = result.failed[0]
    where = f" on {first.node}" if first.node else ""
    return f"{first.task}{where}: {first.message or 'failed'}"


@dataclass(frozen=True)
class RolledBack:
    to: Deployment
    result: RunResult


def roll_back_failed_switch(inventory: Inventory, result: RunResult, request: RunRequest,
                            view: ViewFactory) -> RolledBack | None:
    """When `result` failed in a deployment's phase with a switch under way, put the deployment in use back."""
    if result.check_mode or result.interrupted or not any(o.task in DEPLOYMENT_FAILURES for o in result.failed):
        return None
    if request.only or request.skip or request.limit:
        return None  # a part of the playbook: the rest of the cluster was not switched by this run
    if not touched_the_world(result):
        return None
    try:
        record = read_head_record(inventory)
    except SparkctlError:
        return None
    if record.current is None or record.switching is None or record.switching.same_world(record.current):
        return None
    cause = _cause(result)
    return RolledBack(record.current, _put_back(inventory, record.current, request, view, f"the new deployment "
                                                f"failed ({cause})", f"rolled back: {cause}"))


def bootstrap_or_roll_back(inventory: Inventory, request: RunRequest, view: ViewFactory, ask: TokenPrompt,
                           opening: Opening | None = None) -> RunResult:
    """`sparkctl cluster bootstrap`: the run (runs/bootstrap.py), then, when it failed with a switch under way,
    the deployment in use before it put back. The result is the bootstrap's: a rolled-back run still failed."""
    result = bootstrap(inventory, request, view, ask, opening)
    roll_back_failed_switch(inventory, result, request, view)
    return result


def roll_back(inventory: Inventory, request: RunRequest, view: ViewFactory) -> RolledBack:
    """`sparkctl serve rollback`: the previous deployment put back (the one in use becomes the previous)."""
    record = read_head_record(inventory)
    if record.previous is None:
        shown = f" (in use: {record.current.summary()})" if record.current else ""
        raise BadInput(f"the head keeps no previous deployment to go back to{shown}",
                       hint="a deployment is kept once it answered its smoke test; the first one has none before it")
    target = record.previous
    return RolledBack(target, _put_back(inventory, target, request, view, "rolling back by hand",
                                        "rolled back by hand"))


def _put_back(inventory: Inventory, target: Deployment, request: RunRequest, view: ViewFactory, why: str,
              done: str) -> RunResult:
    back = with_deployment(inventory, target)
    # the model's commit it served, pinned again for the revision asked (no --refresh: that is what is left)
    options = replace(request.options, refresh=False, model_commit=target.revision)
    with view() as sink:
        sink(Event(event="log", task=ROLLBACK_TASK, message=f"{why}: putting back {target.summary()}",
                   data={"rollback": {"to": target.summary(), "why": why}}))
        rolled = journaled_run("rollback", back, bootstrap_graph(), replace(request, options=options), sink)
        if rolled.failed:
            sink(Event(event="log", task=ROLLBACK_TASK, message=(
                f"{done}; putting back {target.summary()} failed too ({_cause(rolled)}): the cluster may not "
                "serve; fix the cause and run `sparkctl cluster bootstrap` (or `sparkctl serve rollback`) again"),
                data={"rollback": {"to": target.summary(), "ok": False}}))
        elif target.revision and target.inputs == deployment_inputs(inventory):
            sink(Event(event="log", task=ROLLBACK_TASK, message=(
                f"{done}; {target.summary()} serves again, its model's commit pinned again: the next bootstrap "
                "keeps it (`--refresh` tries the Hub's commit again)"),
                data={"rollback": {"to": target.summary(), "ok": True}}))
        else:
            sink(Event(event="log", task=ROLLBACK_TASK, message=(
                f"{done}; {target.summary()} serves again. The inventory still names the deployment that was "
                "left: the next bootstrap tries it again; put its container.image and serve: back to stay"),
                data={"rollback": {"to": target.summary(), "ok": True}}))
    return rolled
