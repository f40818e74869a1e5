"""ssh.keys, ssh.mesh, ssh.verify: a cluster key per node, public keys exchanged, host keys pinned, proven."""

from __future__ import annotations

import posixpath

from sparkctl.engine.task import Change, Scope, Task, TaskFailed
from sparkctl.resources import render
from sparkctl.tasks.netplan_files import unified_diff
from sparkctl.tasks.ssh_files import (
    known_host_name,
    known_hosts_lines,
    merge_authorized_keys,
    merge_config_block,
    merge_known_hosts,
)
from sparkctl.transport.base import q

SECTION = "@@sparkctl-file@@"
FILES = ("pub", "hostkey", "authorized_keys", "known_hosts", "config")


def key_name(cluster: str) -> str:
    return f"sparkctl-{cluster}_ed25519"


def read_ssh_files(ctx) -> dict[str, dict[str, str | None]]:
    """One round trip per node (in parallel): the files the mesh is made of."""
    key = key_name(ctx.inventory.cluster.name)
    paths = [f'"$HOME"/.ssh/{q(key + ".pub")}', "/etc/ssh/ssh_host_ed25519_key.pub",
             '"$HOME"/.ssh/authorized_keys', '"$HOME"/.ssh/known_hosts', '"$HOME"/.ssh/config']
    script = "\n".join(f"echo {q(SECTION + name)}; cat {path} 2>/dev/null || echo {q(SECTION + 'absent')}"
                       for name, path in zip(FILES, paths, strict=True))
    script += '\necho "@@sparkctl-home@@$HOME"'
    results = ctx.run_on_all({n: script for n in ctx.nodes})
    out = {}
    for node, result in results.items():
        if not result.ok:
            raise TaskFailed(f"reading ~/.ssh on {node} failed", details=[result.stderr.strip()])
        out[node] = _split(result.stdout)
    return out


def _split(stdout: str) -> dict[str, str | None]:
    files: dict[str, str | None] = {}
    current = None
    buf: list[str] = []
    for line in stdout.splitlines():
        if line.startswith("@@sparkctl-home@@"):
            files["home"] = line[len("@@sparkctl-home@@"):]
        elif line.startswith(SECTION):
            tag = line[len(SECTION):]
            if tag == "absent":
                files[current] = None
                buf = []
                continue
            if current is not None and current not in files:
                files[current] = "\n".join(buf) + ("\n" if buf else "")
            current, buf = tag, []
        else:
            buf.append(line)
    if current is not None and current not in files:
        files[current] = "\n".join(buf) + ("\n" if buf else "")
    return files


class SshKeyTask(Task):
    name = "ssh.keys"
    phase = "ssh"
    needs = ("preflight.node",)
    description = "give each node its own ed25519 key for this cluster (never a private key copied around)"
    checks = "~/.ssh/sparkctl-<cluster>_ed25519 and its .pub exist"
    changes = "generates the key on the node (the private key never leaves it)"

    def check(self, ctx) -> list[Change]:
        key = key_name(ctx.inventory.cluster.name)
        r = ctx.run(f'test -s "$HOME"/.ssh/{q(key)} && test -s "$HOME"/.ssh/{q(key + ".pub")}')
        return [] if r.ok else [Change(f"generate the cluster key ~/.ssh/{key}")]

    def apply(self, ctx, changes) -> None:
        key = key_name(ctx.inventory.cluster.name)
        comment = f"sparkctl-{ctx.inventory.cluster.name}@{ctx.name}"
        ctx.must(f'install -d -m 700 "$HOME"/.ssh && rm -f "$HOME"/.ssh/{q(key)} "$HOME"/.ssh/{q(key + ".pub")} && '
                 f'ssh-keygen -q -t ed25519 -N "" -C {q(comment)} -f "$HOME"/.ssh/{q(key)}',
                 "generating the cluster key")


class SshMeshTask(Task):
    name = "ssh.mesh"
    phase = "ssh"
    scope = Scope.CLUSTER
    needs = ("ssh.keys", "network.netplan")
    description = "authorize every node's cluster key on every other node and pin their real host keys"
    checks = ("each node's authorized_keys holds every peer's cluster key exactly once; known_hosts holds each "
              "peer's host key (read from the peer) for its management and fabric addresses; ~/.ssh/config "
              "makes `ssh <peer fabric ip>` use the cluster key")
    changes = "rewrites those three files atomically (mode 600), touching only sparkctl's own lines and stale entries"

    def desired(self, ctx, files) -> dict[str, dict[str, str]]:
        inv = ctx.inventory
        cluster = inv.cluster.name
        plan = ctx.plan()
        pubs, hostkeys, names = {}, {}, {}
        for node in inv.nodes:
            f = files.get(node.name)
            if f is None:
                continue
            if not f.get("pub") or not f.get("hostkey"):
                raise TaskFailed(f"{node.name}: cluster key or ssh host key missing",
                                 hint="rerun bootstrap; check /etc/ssh/ssh_host_ed25519_key.pub on the node")
            pubs[node.name] = f["pub"].strip()
            hostkeys[node.name] = " ".join(f["hostkey"].split()[:2])
            fabric = [str(a.ip) for a in plan.fabric.addresses.get(node.name, {}).values()]
            names[node.name] = [known_host_name(str(node.host), node.port or inv.ssh.port or 22)] + fabric
        wanted: dict[str, dict[str, str]] = {}
        for node in files:
            peers = [p for p in pubs if p != node]
            auth = merge_authorized_keys(files[node].get("authorized_keys") or "", [pubs[p] for p in peers], cluster)
            entries = [(names[p], hostkeys[p]) for p in peers]
            known = merge_known_hosts(files[node].get("known_hosts") or "", known_hosts_lines(entries, cluster),
                                      {n for p in peers for n in names[p]}, cluster)
            home = files[node].get("home") or "~"
            block = render("ssh-config-cluster.j2", cluster=cluster, user=inv.user,
                           hosts=[n for p in peers for n in names[p][1:]] or ["none"],
                           identity_file=posixpath.join(home, ".ssh", key_name(cluster)),
                           known_hosts=posixpath.join(home, ".ssh", "known_hosts"))
            config = merge_config_block(files[node].get("config") or "", block, cluster)
            wanted[node] = {"authorized_keys": auth, "known_hosts": known, "config": config}
        return wanted

    def check(self, ctx) -> list[Change]:
        files = read_ssh_files(ctx)
        changes = []
        for node, want in self.desired(ctx, files).items():
            for name, content in want.items():
                have = files[node].get(name)
                if have != content:
                    path = f"~/.ssh/{name}"
                    changes.append(Change(f"{node}: update {path}", diff=unified_diff(f"{node}:{path}", have, content),
                                          payload=(node, name, content, files[node].get("home"))))
        return changes

    def apply(self, ctx, changes) -> None:
        for change in changes:
            node, name, content, home = change.payload
            ctx.nodes[node].run('install -d -m 700 "$HOME"/.ssh')
            ctx.nodes[node].transport.put(posixpath.join(home, ".ssh", name), content, mode=0o600)


class SshVerify(Task):
    name = "ssh.verify"
    phase = "ssh"
    scope = Scope.CLUSTER
    needs = ("ssh.mesh",)
    description = "prove passwordless ssh from every node to every other over the fabric"
    checks = "`ssh -o BatchMode=yes <peer fabric ip> true` from every node to every other node"
    changes = "nothing (read-only)"

    def check(self, ctx) -> list[Change]:
        plan = ctx.plan()
        scripts = {}
        for node in ctx.nodes:
            lines = []
            for peer in ctx.nodes:
                if peer == node:
                    continue
                ip = plan.fabric.first_address(peer)
                target = str(ip) if ip else str(ctx.inventory.nodes[[n.name for n in ctx.inventory.nodes]
                                                                    .index(peer)].host)
                lines.append(f"if ssh -o BatchMode=yes -o ConnectTimeout=5 {q(target)} true </dev/null "
                             f">/dev/null 2>/tmp/.sparkctl-ssh-err; then echo {q('ok ' + peer + ' ' + target)}; "
                             f"else echo {q('fail ' + peer + ' ' + target)} \"$(tail -n1 /tmp/.sparkctl-ssh-err)\";"
                             " fi")
            scripts[node] = "\n".join(lines)
        failures = []
        for node, result in ctx.run_on_all({n: s for n, s in scripts.items() if s}, timeout=60).items():
            for line in result.stdout.splitlines():
                if line.startswith("fail "):
                    _, peer, target, *err = line.split(" ")
                    failures.append(f"{node} -> {peer} ({target}): {' '.join(err) or 'failed'}")
        if failures:
            raise TaskFailed(f"{len(failures)} node-to-node ssh connection(s) failed", details=failures)
        return []


TASKS = [SshKeyTask(), SshMeshTask(), SshVerify()]
