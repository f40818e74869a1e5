"""model.pin: the commit the cluster serves of the model and its draft, resolved once and kept on every serving node
(plan/revisions.py says why and where)."""

from __future__ import annotations

import functools
import posixpath
from dataclasses import dataclass, replace

from sparkctl.plan.deployment import DeploymentRecord, deployments_path
from sparkctl.plan.revisions import LOCAL_METADATA, Pin, commit_in_path, pin_path, pinned_repos, wanted_pin
from sparkctl.plan.world import WorldNames
from sparkctl.rules.serving import serves
from sparkctl.taskgraph.events import Event
from sparkctl.taskgraph.task import Change, Scope, Task, TaskFailed
from sparkctl.tasks.context import ClusterContext, NodeContext
from sparkctl.tasks.model.cache import host_path, hub_repo_dir
from sparkctl.tasks.model.fetch import ONLINE, PIN_TASK, download_failure
from sparkctl.transport.base import q

RESOLVE_TIMEOUT = 300.0


@dataclass(frozen=True)
class PinStep:
    repo: str
    pin: Pin
    path: str  # the node's pin file
    was: Pin | None = None
    model: bool = False  # the served model's (not the draft's): moving it on the head switches the deployment


def read_script(node: NodeContext, repos: list[tuple[str, str | None, str]], head: bool) -> str:
    """Per repo `P <i> <pin file's line>`; on the head also `H <i> <commit it holds>` (a hub snapshot with its
    config.json, or a --local-dir's download metadata)."""
    lines = []
    for i, (repo, local, _asked) in enumerate(repos):
        # the first lines as the shell's own `read` takes them: this read runs on every rerun
        lines.append(f"l=; IFS= read -r l 2>/dev/null <{q(pin_path(node.hf_cache_dir(), repo))}; "
                     f"printf 'P\\t{i}\\t%s\\n' \"$l\"")
        if not head:
            continue
        if local is None:
            base = q(hub_repo_dir(node, repo))
            held = (f"r=; read -r r 2>/dev/null <{base}/refs/main; "
                    f"[ -n \"$r\" ] && [ -f {base}/snapshots/\"$r\"/config.json ] || r=")
        else:
            held = f"r=; IFS= read -r r 2>/dev/null <{q(host_path(node, local) + '/' + LOCAL_METADATA)}"
        lines.append(f"{held}; printf 'H\\t{i}\\t%s\\n' \"$r\"")
    return "\n".join([*lines, "true"])


def parse_read(stdout: str) -> tuple[dict[int, Pin], dict[int, str]]:
    pins, held = {}, {}
    for line in stdout.splitlines():
        kind, _, rest = line.partition("\t")
        index, _, value = rest.partition("\t")
        if not index.isdigit():
            continue
        if kind == "P" and (pin := Pin.parse(value)) is not None:
            pins[int(index)] = pin
        elif kind == "H" and value.strip():
            held[int(index)] = value.strip()
    return pins, held


def resolve(head: NodeContext, repo: str, asked: str) -> str:
    """The commit `asked` names on the Hub now: `hf download <repo> config.json` into a throwaway cache inside the
    head's container (a few KB; the node's own cache and its refs are left alone) prints the snapshot's path."""
    command = (f"d=$(mktemp -d) || exit 1; hf download {q(repo)} config.json --revision {q(asked)} --cache-dir \"$d\"; "
               "rc=$?; rm -rf \"$d\"; exit $rc")
    result = head.transport.exec_in(head.inventory.container.name, command, timeout=RESOLVE_TIMEOUT, env=ONLINE)
    if not result.ok:
        raise download_failure(head.name, repo, result, head.inventory.serve.hf_token_env, asked=asked)
    commit = commit_in_path(result.stdout)
    if commit is None:
        raise TaskFailed(f"`hf download {repo}` on {head.name} printed no snapshot path to read the commit of "
                         f"{asked} from", details=result.stdout.strip().splitlines()[-3:])
    return commit


class ModelPinTask(Task[ClusterContext, PinStep]):
    name = PIN_TASK
    phase = "model"
    scope = Scope.CLUSTER
    needs = ("model.token", "container.run")
    # a worker that failed or was lost does not stop the others: the pin is the head's, written where it can be
    needs_every_node = False
    description = ("pin the commit of the model (serve.revision, else main) and of the draft that every node "
                   "downloads and serves, resolved once on the head")
    checks = ("each serving node's <hf_cache>/sparkctl-pins/<repo folder> against the head's: kept while it was "
              "resolved from the revision the inventory asks for; a commit asked is its own pin; a first run asking "
              "for main pins the snapshot the head already holds; otherwise (and with --refresh) the revision is "
              "resolved on the Hub from the head's container (`hf download <repo> config.json` into a throwaway "
              "cache: a few KB); one read per node, read ahead with its facts")
    changes = "writes the pin file (`<commit>\\t<revision asked>`) on the nodes where it differs"

    def check(self, ctx: ClusterContext) -> list[Change[PinStep]]:
        inv = ctx.inventory
        head = ctx.head()
        nodes = [n for n in ctx.nodes if serves(inv, n) and n not in ctx.lost]
        if head.name in ctx.lost or not nodes:
            return []
        pinned = pinned_repos(inv)
        repos = [(p.repo, p.local, p.asked) for p in pinned]
        # the head resolves and holds the reference pins, whether or not a world of its own loads them
        read = [head.name, *(n for n in nodes if n != head.name)]
        reads = ctx.read_on_all(self.name, {n: read_script(ctx.nodes[n], repos, n == head.name) for n in read})
        found = {}
        for name, result in reads.items():
            if not result.ok:
                raise TaskFailed(f"reading the model's pins on {name} failed",
                                 details=(result.stderr or result.stdout).splitlines()[-3:])
            found[name] = parse_read(result.stdout)
        head_pins, held = found[head.name]
        changes = []
        for i, (repo, _local, asked) in enumerate(repos):
            pin = wanted_pin(asked, head_pins.get(i), held.get(i), ctx.options.refresh)
            if pinned[i].model and ctx.options.model_commit:
                pin = Pin(ctx.options.model_commit, asked)  # a rollback's: the commit the deployment served
            if pin is None:
                key = f"{PIN_TASK}:{repo}@{asked}"
                if key not in ctx.asked_once:  # once a run: the check after apply must not ask the Hub again
                    ctx.asked_once[key] = resolve(head, repo, asked)
                    ctx.emit(Event("log", task=self.name, node=head.name,
                                   message=f"{repo}@{asked} is {ctx.asked_once[key]} on the Hub"))
                pin = Pin(ctx.asked_once[key], asked)
            # the head keeps every pin, whether or not a world of its own loads the repo: it is the reference the
            # next run keeps (without it a repo served only elsewhere would be resolved again on every run)
            for name in read:
                if (name not in pinned[i].nodes and name != head.name) or found[name][0].get(i) == pin:
                    continue
                was = found[name][0].get(i)
                moved = f" (was {was.short()})" if was else ""
                changes.append(Change(f"pin {repo} at {pin.short()} on {name}{moved}",
                                      payload=PinStep(repo, pin, pin_path(ctx.nodes[name].hf_cache_dir(), repo),
                                                      was, pinned[i].model),
                                      node=name))
        return changes

    def apply(self, ctx: ClusterContext, changes: list[Change[PinStep]]) -> None:
        by_node: dict[str, list[PinStep]] = {}
        for change in changes:
            assert change.node is not None
            by_node.setdefault(change.node, []).append(change.carried())
        head = ctx.head()
        for step in by_node.get(head.name, []):
            if step.model:
                mark_revision_switch(ctx, head, step.pin.commit)
        ctx.each_node({name: functools.partial(_write, ctx.nodes[name], steps) for name, steps in by_node.items()})


def mark_revision_switch(ctx: ClusterContext, head: NodeContext, commit: str) -> None:
    """The model's pin moves under a deployment in use: the switch is marked in the head's record (as serve.switch
    marks an image's) before the world is started on the new commit, so that a new world that fails is rolled back
    to the commit that served (runs/rollback.py)."""
    path = deployments_path(WorldNames(head.inventory.cluster.name).node_dir(head.state_dir()))
    record = DeploymentRecord.parse(head.run(f"cat {q(path)} 2>/dev/null; true", timeout=30).stdout)
    current = record.current
    if current is None or record.switching is not None or current.revision in (None, commit):
        return
    head.transport.put(path, record.begun(replace(current, revision=commit, number=0, at=0.0)).text(), mode=0o644)
    ctx.emit(Event("log", task=PIN_TASK, node=head.name, message=(
        f"the model's commit moves from {current.revision[:12]} to {commit[:12]}: switch marked (a new world that "
        "fails is rolled back to the one in use)")))


def _write(node: NodeContext, steps: list[PinStep]) -> None:
    node.must(f"mkdir -p {q(posixpath.dirname(steps[0].path))}", "making the pins' folder")
    for step in steps:
        node.transport.put(step.path, step.pin.text(), mode=0o644)
    node.invalidate()


