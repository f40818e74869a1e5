"""serve.collector: each world's figures collector on its head (sparkctl/plan/collector.py), for an engine whose own
/metrics a read empties (TensorRT-LLM): the one reader of it, and what the gateway's /metrics, the world's watchdog,
top and serve status read. An engine that keeps its own counters has none; a collector no world plans any more (the
engine switched, a model removed) is removed by container.retire.

Idempotent: the script on each world's head has the shipped content (its sha256), each world's container runs from
its planned spec (image, argv, the script's hash, restart policy) and is running (as the node's facts' one `docker
inspect` saw it: tasks/context.py). One read of each world's head, on a rerun read ahead with its facts.
"""

from __future__ import annotations

import hashlib
import shlex
from collections.abc import Iterator
from typing import Literal

from sparkctl.facts.model import ContainerInfo
from sparkctl.plan.collector import CollectorSpec, collector_script, collector_spec
from sparkctl.plan.container import SPEC_LABEL
from sparkctl.rules.serving import serving_enabled
from sparkctl.taskgraph.task import Change, Scope, Task, TaskFailed
from sparkctl.tasks.container.run import remove_command
from sparkctl.tasks.context import ClusterContext, NodeContext
from sparkctl.tasks.worlds import cluster_worlds, world_launch
from sparkctl.transport.base import q
from sparkctl.transport.framing import Framing

CollectorAction = Literal["script", "create", "start"]
#: what a change asks of apply: the collector's container and what to do to it
CollectorChange = tuple[str, CollectorAction]
#: the section of a node's read with the script's sha256 (every world's collector on a node runs the one script)
SCRIPT_SECTION = "collector-script"


def world_collectors(ctx: ClusterContext) -> Iterator[tuple[NodeContext, CollectorSpec]]:
    """Each world's planned collector, with its head's context, in the order of serve.models."""
    for world in cluster_worlds(ctx):
        head = ctx.nodes[world.head().name]
        spec = collector_spec(world.inventory, head.state_dir(), world_launch(world).host)
        if spec is not None:
            yield head, spec


def read_script(spec: CollectorSpec, framing: Framing) -> str:
    """One node's read: `sha256sum` of the script (its collectors' containers are in the node's facts)."""
    return "\n".join([framing.section(SCRIPT_SECTION, f"sha256sum {q(spec.script_path)} 2>/dev/null"), "true"])


def script_changes(spec: CollectorSpec, texts: dict[str, str], head: str) -> list[Change[CollectorChange]]:
    """The script every collector on a node runs, from the node's read: written once (`spec`: the node's first)."""
    if (texts.get(SCRIPT_SECTION, "").split() or [""])[0] == hashlib.sha256(collector_script().encode()).hexdigest():
        return []
    return [Change(f"write the figures collector's script on {head} ({spec.script_path})", node=head,
                   payload=(spec.container, "script"))]


def collector_changes(spec: CollectorSpec, container: ContainerInfo | None, head: str) -> list[Change[CollectorChange]]:
    """What one collector's container needs, as its node's facts inspected it."""
    inspected = container is not None and container.exists
    running = container is not None and container.running
    label = container.labels.get(SPEC_LABEL, "") if container is not None else ""
    policy = (container.restart_policy or "") if container is not None else ""
    changes: list[Change[CollectorChange]] = []
    if not inspected or label != spec.spec_hash() or policy != "unless-stopped":
        why = "absent" if not inspected else "made from another spec"
        changes.append(Change(f"run the figures collector {spec.container} on {head} ({why}): the one reader "
                              f"of the engine's /metrics, on {spec.host}:{spec.port}", node=head,
                              payload=(spec.container, "create")))
    elif not running:
        changes.append(Change(f"start the figures collector {spec.container} on {head}", node=head,
                              payload=(spec.container, "start")))
    return changes


def apply_collector(head: NodeContext, spec: CollectorSpec, actions: set[CollectorAction]) -> None:
    if actions & {"script", "create"}:
        head.must(f"install -d -m 755 {q(spec.script_dir)}", f"making {spec.script_dir}")
        head.transport.put(spec.script_path, collector_script(), mode=0o644)
    if "create" in actions:
        head.run(f"{remove_command(spec.container)} >/dev/null 2>&1; true", timeout=120)
        head.must(shlex.join(spec.run_argv()), f"docker run {spec.container}", timeout=300)
    elif "start" in actions:
        head.must(f"docker start {q(spec.container)}", f"docker start {spec.container}", timeout=60)


class ServeCollectorTask(Task[ClusterContext, CollectorChange]):
    name = "serve.collector"
    phase = "serve"
    scope = Scope.CLUSTER
    needs = ("serve.launch",)
    description = ("run each world's figures collector on its head, where the engine's own /metrics empties on read "
                   "(TensorRT-LLM): the one reader of it")
    checks = ("on each world's head, <state>/collector/serve-collector.py has the shipped content (its sha256) and the "
              "world's sparkctl-collector container (`--<world>` after it for a world but the first) runs from the "
              "planned spec (the engine's image, argv, the script's hash, --restart unless-stopped; as the node's "
              "facts inspected it); none with an engine that keeps its own counters; one read of each world's head, "
              "on a rerun read ahead with its facts")
    changes = ("writes the script (mode 644), runs the container again (`docker rm -f`, then `docker run` on the host "
               "network, beside the world's engine) or starts it")

    def check(self, ctx: ClusterContext) -> list[Change[CollectorChange]]:
        if not serving_enabled(ctx.inventory):
            return []
        by_node: dict[str, tuple[NodeContext, list[CollectorSpec]]] = {}
        for head, spec in world_collectors(ctx):
            by_node.setdefault(head.name, (head, []))[1].append(spec)
        changes: list[Change[CollectorChange]] = []
        for head, specs in by_node.values():
            framing = Framing()
            texts = Framing.texts_of(framing.split(head.read(self.name, read_script(specs[0], framing), framing,
                                                             timeout=30).stdout))
            changes += script_changes(specs[0], texts, head.name)
            containers = head.facts().containers
            for spec in specs:
                changes += collector_changes(spec, containers.get(spec.container), head.name)
        return changes

    def apply(self, ctx: ClusterContext, changes: list[Change[CollectorChange]]) -> None:
        """Each collector that changes, in turn; one that fails does not keep the next from being tried (the first
        failure is raised once all were)."""
        asked: dict[str, set[CollectorAction]] = {}
        for change in changes:
            container, action = change.carried()
            asked.setdefault(container, set()).add(action)
        failed: list[TaskFailed] = []
        for head, spec in world_collectors(ctx):
            if spec.container in asked:
                try:
                    apply_collector(head, spec, asked[spec.container])
                except TaskFailed as exc:
                    failed.append(exc)
                finally:
                    head.invalidate()
        if failed:
            raise failed[0]
