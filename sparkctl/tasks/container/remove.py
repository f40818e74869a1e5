"""container.remove (`cluster down`): the container stopped and removed."""

from __future__ import annotations

from sparkctl.engine.task import Change, Task
from sparkctl.tasks.context import NodeContext
from sparkctl.transport.base import q


class ContainerRemoveTask(Task):
    name = "container.remove"
    phase = "container"
    description = "stop and remove the trtllm-multinode container"
    checks = "whether the container exists"
    changes = "`docker rm -f <container>`"

    def check(self, ctx: NodeContext) -> list[Change]:
        name = ctx.inventory.container.name
        current = ctx.facts().containers.get(name)
        return [Change(f"remove container {name}")] if current is not None and current.exists else []

    def apply(self, ctx: NodeContext, changes: list[Change]) -> None:
        name = ctx.inventory.container.name
        try:
            ctx.must(f"docker rm -f {q(name)}", f"removing container {name}", timeout=120)
        finally:
            ctx.invalidate()
