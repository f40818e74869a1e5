"""container.remove (`cluster down`): the container stopped and removed."""

from __future__ import annotations

from sparkctl.taskgraph.task import Change, Task
from sparkctl.tasks.container.run import remove_command
from sparkctl.tasks.context import NodeContext


class ContainerRemoveTask(Task[NodeContext, None]):
    name = "container.remove"
    phase = "container"
    description = "stop and remove the trtllm-multinode container"
    checks = "whether the container exists"
    changes = "`docker stop -t 0 <container>; docker rm -f <container>` (killed at once, whatever the engine)"

    def check(self, ctx: NodeContext) -> list[Change[None]]:
        name = ctx.inventory.container.name
        current = ctx.facts().containers.get(name)
        return [Change(f"remove container {name}")] if current is not None and current.exists else []

    def apply(self, ctx: NodeContext, changes: list[Change[None]]) -> None:
        name = ctx.inventory.container.name
        try:
            ctx.must(remove_command(name), f"removing container {name}", timeout=120)
        finally:
            ctx.invalidate()
