"""ssh.keys: each node's own ed25519 key for this cluster, made on the node (no private key travels)."""

from __future__ import annotations

from dataclasses import replace

from sparkctl.plan.paths import cluster_key_name
from sparkctl.rules.mesh import host_tries, mesh_script, mesh_timeout
from sparkctl.taskgraph.task import Change, Task, TaskFailed
from sparkctl.tasks.context import NodeContext
from sparkctl.tasks.keygen import keygen_line
from sparkctl.tasks.proof import PairProofs, pair_id
from sparkctl.tasks.ssh.mesh import MESH_FILES, MESH_VERDICTS, ssh_files_script
from sparkctl.tasks.ssh.proofs import HOST_MESH, ROOT_SECTION, SECTION, login_script, sshd_as_root
from sparkctl.transport.base import q
from sparkctl.transport.framing import Framing

#: the name sshd's digests read as root go by among the reads ahead (sshd_as_root)
ROOT_READ = "ssh.keys:sshd"


class SshKeyTask(Task[NodeContext, None]):
    name = "ssh.keys"
    phase = "ssh"
    needs = ("preflight.node", "preflight.cluster")
    description = "give each node its own ed25519 key for this cluster (never a private key copied around)"
    checks = ("~/.ssh/sparkctl-<cluster>_ed25519 and its .pub exist (the same read takes the files ssh.mesh judges, "
              "what ssh.verify's proofs on record are fingerprinted by, and, while a pair of this node has no proof "
              "on record, tries its ssh.verify pairs; on a rerun it is read ahead with the node's facts and counts "
              "only if its script is the same and nothing changed since: a no-op ssh phase needs no round trip)")
    changes = "generates the key on the node (the private key never leaves it)"

    def check(self, ctx: NodeContext) -> list[Change[None]]:
        """One round trip for the whole phase on a no-op: the key, the files ssh.mesh judges, what the mesh's proofs
        on record are fingerprinted by and, while one of this node's outgoing pairs has no proof on record, those
        pairs tried (ssh.verify's half of this node). Handed over; they count only if nothing changes before those
        tasks run. The read kept for the next run carries no tries: that run has the record."""
        cluster = ctx.inventory.cluster.name
        key = cluster_key_name(cluster)
        framing = Framing()
        has_key = f'test -s "$HOME"/.ssh/{q(key)} && test -s "$HOME"/.ssh/{q(key + ".pub")}'
        parts = [framing.section("key", has_key), ssh_files_script(cluster, framing)]
        # sshd's own digests (the login state's `#root` part), read as root beside the next run's facts where the
        # node allows it: what is kept for that run is then the read without them
        lean, as_root = parts, None
        try:
            order = list(ctx.cluster.nodes)
            tries = host_tries(ctx.inventory, ctx.plan().fabric, order, ctx.name) if len(order) > 1 else []
            parts = [*parts, framing.section(SECTION, login_script(ctx.cluster, ctx.name, key))]
            as_root = sshd_as_root(ctx.cluster, ctx.name, framing)
            lean = [*lean, framing.section(SECTION, login_script(ctx.cluster, ctx.name, key, sshd=False))]
        except TaskFailed:
            tries = []  # no plan yet: ssh.mesh says why
        record = PairProofs(ctx.cluster.records, HOST_MESH, reprove=ctx.options.reprove)
        carried = tries and not record.covers(pair_id(ctx.name, t.peer, t.target) for t in tries)
        inside: str | None = None
        if carried:
            script = "\n".join([*parts, framing.section("mesh", f"if {has_key}; then\n{mesh_script(tries)}\nfi")])
            result = ctx.run(script, timeout=mesh_timeout(len(tries)))
            ctx.remember(self.name, "\n".join(lean if as_root else parts), framing)
            if as_root:
                ctx.remember(ROOT_READ, as_root, framing, root=True)
        else:
            result, inside = ctx.read_beside_root(self.name, "\n".join(parts), framing, lean="\n".join(lean),
                                                  root=(ROOT_READ, as_root) if as_root else None)
        sections = framing.split(result.stdout)
        if "key" not in sections:
            raise TaskFailed(f"reading ~/.ssh on {ctx.name} failed", details=[result.stderr.strip()[-300:]])
        digests = framing.split(inside).get(ROOT_SECTION) if inside is not None else None
        if digests is not None and SECTION in sections:
            login = sections[SECTION]
            sections[SECTION] = replace(login, output=login.output + digests.output)
        ctx.cluster.hand_over(MESH_FILES.at(ctx.name),
                              {name: (s.output if s.ok else None) for name, s in sections.items()})
        if "mesh" in sections and sections["mesh"].rc is not None:
            ctx.cluster.hand_over(MESH_VERDICTS.at(ctx.name), sections["mesh"].output)
        return [] if sections["key"].ok else [Change(f"generate the cluster key ~/.ssh/{key}")]

    def apply(self, ctx: NodeContext, changes: list[Change[None]]) -> None:
        key = cluster_key_name(ctx.inventory.cluster.name)
        comment = f"sparkctl-{ctx.inventory.cluster.name}@{ctx.name}"
        path = '"$HOME"/.ssh/' + q(key)
        ctx.must(f'install -d -m 700 "$HOME"/.ssh && {keygen_line(path, comment)}', "generating the cluster key")
