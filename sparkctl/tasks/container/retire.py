"""container.retire: this cluster's containers that the inventory no longer names, removed (the other engine's
after serve.engine changed, one renamed in container.name): they would hold GPU memory and their ports.

What is this cluster's is what sparkctl labelled so (sparkctl.cluster=<cluster>); the planned container, the
gateway and the figures collectors of the worlds headed on the node stay (serve.gateway and serve.collector keep
them as planned); a collector no world plans here any more (the engine keeps its own counters now, the world was
removed or moved) goes, unless the inventory serves nothing (what serves is then left as it is, the gateway too).
Idempotent: nothing to remove is ok. The list is the facts' (their one ask of docker's Engine API lists the
labelled containers too); where the CLI answered them, one read of the node, on a rerun read ahead with its facts.
"""

from __future__ import annotations

from sparkctl.plan.collector import is_collector
from sparkctl.plan.container import cluster_label
from sparkctl.plan.gateway import GATEWAY_CONTAINER
from sparkctl.rules.serving import serving_enabled
from sparkctl.taskgraph.task import Change, Task
from sparkctl.tasks.container.run import remove_command
from sparkctl.tasks.context import NodeContext, serving_containers
from sparkctl.transport.base import q
from sparkctl.transport.framing import Framing


def labelled_script(cluster: str) -> str:
    """The names of the node's containers (running or not) labelled as this cluster's, one per line."""
    return f"docker ps -a --filter {q('label=' + cluster_label(cluster))} --format '{{{{.Names}}}}' 2>/dev/null"


class ContainerRetireTask(Task[NodeContext, str]):
    name = "container.retire"
    phase = "container"
    # another engine's world serves until the new image is on every node
    needs = ("serve.switch",)
    description = "remove this cluster's containers the inventory no longer names (another engine's, a renamed one)"
    checks = ("the node's containers labelled sparkctl.cluster=<cluster> are the planned one, the gateway and the "
              "figures collectors of the worlds headed here only; listed by the facts' one ask of docker's Engine API, "
              "or where the CLI answered, one `docker ps` read of the node (on a rerun read ahead with its facts)")
    changes = "`docker stop -t 0; docker rm -f` of each other one, before the planned container starts"

    def check(self, ctx: NodeContext) -> list[Change[str]]:
        keep = {ctx.inventory.container.name, GATEWAY_CONTAINER, *serving_containers(ctx.inventory, ctx.name)}
        # an inventory that serves nothing leaves what serves as it is (its units, the gateway): the collectors too
        serving = serving_enabled(ctx.inventory)
        return [Change(f"remove container {name}: this cluster's, no longer in the inventory", payload=name)
                for name in self._labelled(ctx) if name not in keep and (serving or not is_collector(name))]

    def _labelled(self, ctx: NodeContext) -> list[str]:
        """The node's containers labelled as this cluster's: listed by the facts' one ask of docker where its Engine
        API answered, else read with `docker ps` (on a rerun read ahead with the facts)."""
        listed = ctx.facts().labelled_containers
        if listed is not None:
            if ctx.options.verbosity >= 1:
                ctx.log(f"{self.name}: listed with the facts")
            return listed
        framing = Framing()
        script = framing.section("labelled", labelled_script(ctx.inventory.cluster.name)) + "\ntrue"
        return Framing.texts_of(framing.split(ctx.read(self.name, script, framing).stdout)).get("labelled", "").split()

    def apply(self, ctx: NodeContext, changes: list[Change[str]]) -> None:
        try:
            for change in changes:
                name = change.carried()
                ctx.must(remove_command(name), f"removing container {name}", timeout=120)
        finally:
            ctx.invalidate()
