"""ssh.keys: each node's own ed25519 key for this cluster, made on the node (no private key travels)."""

from __future__ import annotations

from sparkctl.engine.task import Change, Task
from sparkctl.plan.paths import cluster_key_name
from sparkctl.tasks.context import NodeContext
from sparkctl.tasks.keygen import keygen_line
from sparkctl.transport.base import q


class SshKeyTask(Task):
    name = "ssh.keys"
    phase = "ssh"
    needs = ("preflight.node", "preflight.cluster")
    description = "give each node its own ed25519 key for this cluster (never a private key copied around)"
    checks = "~/.ssh/sparkctl-<cluster>_ed25519 and its .pub exist"
    changes = "generates the key on the node (the private key never leaves it)"

    def check(self, ctx: NodeContext) -> list[Change]:
        key = cluster_key_name(ctx.inventory.cluster.name)
        r = ctx.run(f'test -s "$HOME"/.ssh/{q(key)} && test -s "$HOME"/.ssh/{q(key + ".pub")}')
        return [] if r.ok else [Change(f"generate the cluster key ~/.ssh/{key}")]

    def apply(self, ctx: NodeContext, changes: list[Change]) -> None:
        key = cluster_key_name(ctx.inventory.cluster.name)
        comment = f"sparkctl-{ctx.inventory.cluster.name}@{ctx.name}"
        path = '"$HOME"/.ssh/' + q(key)
        ctx.must(f'install -d -m 700 "$HOME"/.ssh && {keygen_line(path, comment)}', "generating the cluster key")
