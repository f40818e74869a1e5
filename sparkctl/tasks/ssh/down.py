"""down.ssh (`cluster down --network`): remove exactly the ssh keys and lines sparkctl added on a node."""

from __future__ import annotations

import posixpath

from sparkctl.plan.paths import cluster_key_name
from sparkctl.taskgraph.task import Change, Task
from sparkctl.tasks.context import NodeContext
from sparkctl.tasks.ssh.files import key_marker, remove_config_block
from sparkctl.tasks.ssh.mesh import kept_mode
from sparkctl.transport.base import q


class SshDown(Task[NodeContext, tuple[str, str | None]]):
    name = "down.ssh"
    phase = "ssh"
    description = "remove this cluster's key, authorized keys, pinned host keys and ssh config block"
    checks = "sparkctl's marked lines in ~/.ssh/authorized_keys, known_hosts and config, and the cluster key files"
    changes = "removes exactly those lines and files; the user's own lines stay"

    def _wanted(self, ctx: NodeContext) -> dict[str, tuple[str | None, str | None]]:
        cluster = ctx.inventory.cluster.name
        home = ctx.run('printf %s "$HOME"').stdout
        out: dict[str, tuple[str | None, str | None]] = {}
        for name in ("authorized_keys", "known_hosts", "config"):
            path = posixpath.join(home, ".ssh", name)
            have = ctx.transport.read(path)
            if have is None:
                continue
            if name == "config":
                want = remove_config_block(have, cluster)
            else:
                marker = f"sparkctl-{cluster}@" if name == "authorized_keys" else key_marker(cluster)
                want = "".join(line + "\n" for line in have.splitlines()
                               if not (line.split() and marker in line.split()[-1]))
            if want != have:
                out[path] = (have, want)
        key = posixpath.join(home, ".ssh", cluster_key_name(cluster))
        if ctx.run(f"test -e {q(key)} -o -e {q(key + '.pub')}").ok:
            out[key] = (None, None)
        return out

    def check(self, ctx: NodeContext) -> list[Change[tuple[str, str | None]]]:
        return [Change(f"remove the cluster key {p}" if have is None else
                       f"remove {p} (only sparkctl's lines were in it)" if not want else
                       f"remove sparkctl's lines from {p}",
                       payload=(p, want)) for p, (have, want) in self._wanted(ctx).items()]

    def apply(self, ctx: NodeContext, changes: list[Change[tuple[str, str | None]]]) -> None:
        for change in changes:
            path, want = change.carried()
            if want is None:
                ctx.must(f"rm -f {q(path)} {q(path + '.pub')}", "removing the cluster key")
            elif not want:
                # nothing of the user's is left: sparkctl created it (an empty file would still differ)
                ctx.must(f"rm -f {q(path)}", f"removing {path}")
            else:
                ctx.transport.put(path, want, mode=kept_mode(ctx, path))
