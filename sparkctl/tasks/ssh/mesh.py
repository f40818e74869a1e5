"""ssh.mesh: every node's cluster key authorized on every other node, their real host keys pinned, and an ssh
config block that makes `ssh <peer fabric address>` use them."""

from __future__ import annotations

import functools
import posixpath

from sparkctl.plan.paths import cluster_key_name
from sparkctl.plan.ssh import ssh_config_block
from sparkctl.taskgraph.diff import unified_diff
from sparkctl.taskgraph.task import Change, Scope, Task, TaskFailed
from sparkctl.tasks.context import ClusterContext, HandOver, NodeContext
from sparkctl.tasks.ssh.files import known_hosts_lines, merge_authorized_keys, merge_config_block, merge_known_hosts
from sparkctl.tasks.ssh.proofs import SECTION, login_script
from sparkctl.transport.base import q, text_of
from sparkctl.transport.framing import Framing
from sparkctl.transport.hostkeys import host_key_name

#: The files the mesh is made of, and where each is on a node.
FILES = {
    "pub": None,  # the cluster key's public half: its name depends on the cluster
    "hostkey": "/etc/ssh/ssh_host_ed25519_key.pub",
    "authorized_keys": '"$HOME"/.ssh/authorized_keys',
    "known_hosts": '"$HOME"/.ssh/known_hosts',
    "config": '"$HOME"/.ssh/config',
}


#: a node's ~/.ssh files (name -> content, None when unreadable), for ssh.mesh
MESH_FILES: HandOver[dict[str, str | None]] = HandOver("ssh.mesh")
#: a node's tries of every peer over the fabric (the mesh script's output), for ssh.verify
MESH_VERDICTS: HandOver[str] = HandOver("ssh.verify")
#: every node's ~/.ssh files and `login` section as ssh.mesh found them (nothing to change), for ssh.verify's
#: fingerprints (tasks/ssh/proofs.py)
LOGIN_INPUTS: HandOver[dict[str, dict[str, str | None]]] = HandOver("ssh.verify/login")


def ssh_files_script(cluster: str, framing: Framing) -> str:
    """One section per file (absent: the section fails) and one with $HOME."""
    pub = f'"$HOME"/.ssh/{q(cluster_key_name(cluster) + ".pub")}'
    # a file without a final newline gets one (as `awk 1` does), so its text is exactly what the node holds
    parts = [framing.section(name, text_of(path or pub, final_newline=True)) for name, path in FILES.items()]
    parts.append(framing.section("home", 'printf "%s" "$HOME"'))
    return "\n".join(parts)


def parse_ssh_files(stdout: str, framing: Framing) -> dict[str, str | None]:
    sections = framing.split(stdout)
    files: dict[str, str | None] = {name: (s.output if s.ok else None) for name, s in sections.items()}
    return files


def read_ssh_files(ctx: ClusterContext) -> dict[str, dict[str, str | None]]:
    """The files the mesh is made of, and each node's `login` section (tasks/ssh/proofs.py): what ssh.keys' round
    trip read, if nothing changed since; else one round trip per node (in parallel)."""
    handed = {node: ctx.take_over(MESH_FILES.at(node)) for node in ctx.nodes}
    ready = {node: files for node, files in handed.items() if files is not None}
    if len(ready) == len(handed):
        return {node: {name: files.get(name) for name in (*FILES, "home", SECTION)} for node, files in ready.items()}
    framing = Framing()
    key = cluster_key_name(ctx.inventory.cluster.name)
    files = ssh_files_script(ctx.inventory.cluster.name, framing)
    scripts = {n: files + "\n" + framing.section(SECTION, login_script(ctx, n, key)) for n in ctx.nodes}
    results = ctx.run_on_all(scripts)
    out = {}
    for node, result in results.items():
        if not result.ok:
            raise TaskFailed(f"reading ~/.ssh on {node} failed", details=[result.stderr.strip()])
        out[node] = parse_ssh_files(result.stdout, framing)
    return out


#: (node, file name in ~/.ssh, its content, the node's home): one file of the mesh to write
MeshFile = tuple[str, str, str, str]


class SshMeshTask(Task[ClusterContext, MeshFile]):
    name = "ssh.mesh"
    phase = "ssh"
    scope = Scope.CLUSTER
    needs = ("ssh.keys", "network.netplan")
    description = "authorize every node's cluster key on every other node and pin their real host keys"
    checks = ("each node's authorized_keys holds every peer's cluster key exactly once; known_hosts holds each "
              "peer's host key (read from the peer) for its management and fabric addresses; ~/.ssh/config "
              "makes `ssh <peer fabric ip>` use the cluster key")
    changes = "rewrites those three files atomically (mode 600), touching only sparkctl's own lines and stale entries"

    def desired(self, ctx: ClusterContext, files: dict[str, dict[str, str | None]]) -> dict[str, dict[str, str]]:
        inv = ctx.inventory
        cluster = inv.cluster.name
        plan = ctx.plan()
        pubs, hostkeys, names = {}, {}, {}
        for node in inv.nodes:
            f = files.get(node.name)
            if f is None:
                continue
            pub = f.get("pub")
            if not pub and ctx.options.check and ctx.in_limit(node.name):
                # --check: ssh.keys has not generated it; show where its line goes
                pub = f"ssh-ed25519 <new-cluster-key-of-{node.name}> sparkctl-{cluster}@{node.name}"
            if not pub or not f.get("hostkey"):
                outside = ctx.outside_limit(node.name)
                raise TaskFailed(f"{node.name}{outside}: cluster key or ssh host key missing",
                                 hint=f"bootstrap {node.name} first (--limit {node.name})" if outside else
                                 "rerun bootstrap; check /etc/ssh/ssh_host_ed25519_key.pub on the node")
            pubs[node.name] = pub.strip()
            hostkeys[node.name] = " ".join((f.get("hostkey") or "").split()[:2])
            fabric = [str(a.ip) for a in plan.fabric.addresses.get(node.name, {}).values()]
            names[node.name] = [host_key_name(str(node.host), node.port or inv.ssh.port or 22)] + fabric
        wanted: dict[str, dict[str, str]] = {}
        for name, have in files.items():
            peers = [p for p in pubs if p != name]
            auth = merge_authorized_keys(have.get("authorized_keys") or "", [pubs[p] for p in peers], cluster)
            entries = [(names[p], hostkeys[p]) for p in peers]
            known = merge_known_hosts(have.get("known_hosts") or "", known_hosts_lines(entries, cluster),
                                      {n for p in peers for n in names[p]}, cluster)
            home = have.get("home")
            if not home:  # SFTP does not expand `~`: never write to a guessed path
                raise TaskFailed(f"{name}: $HOME is not set for {inv.user}")
            block = ssh_config_block(inv, [n for p in peers for n in names[p][1:]], home)
            config = merge_config_block(have.get("config") or "", block, cluster)
            wanted[name] = {"authorized_keys": auth, "known_hosts": known, "config": config}
        return wanted

    def check(self, ctx: ClusterContext) -> list[Change[MeshFile]]:
        files = read_ssh_files(ctx)
        ctx.hand_over(LOGIN_INPUTS, files)  # counts for ssh.verify only if nothing is changed in between
        changes = []
        for node, want in self.desired(ctx, files).items():
            for name, content in want.items():
                have = files[node].get(name)
                if have != content:
                    path = f"~/.ssh/{name}"
                    changes.append(Change(f"{node}: update {path}", diff=unified_diff(f"{node}:{path}", have, content),
                                          payload=(node, name, content, files[node].get("home") or ""), node=node))
        return changes

    def apply(self, ctx: ClusterContext, changes: list[Change[MeshFile]]) -> None:
        by_node: dict[str, list[tuple[str, str, str]]] = {}
        for change in changes:
            node, name, content, home = change.carried()
            by_node.setdefault(node, []).append((name, content, home))

        def write(node: str) -> None:
            for name, content, home in by_node[node]:
                path = posixpath.join(home, ".ssh", name)
                ctx.nodes[node].transport.put(path, content, mode=kept_mode(ctx.nodes[node], path))

        # every node's files at once: each node's own in order
        ctx.each_node({node: functools.partial(write, node) for node in by_node})


def kept_mode(node_ctx: NodeContext, path: str) -> int:
    """The file's mode as the user left it (never group/world-writable: sshd would refuse it); 600 if new.

    Also makes sure ~/.ssh exists.
    """
    result = node_ctx.run(f'install -d -m 700 "$HOME"/.ssh && stat -c %a {q(path)} 2>/dev/null || true')
    found = result.stdout.strip()
    return int(found, 8) & 0o644 if found.isdigit() else 0o600
