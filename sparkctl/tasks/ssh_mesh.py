"""ssh.keys, ssh.mesh, ssh.verify: a cluster key per node, public keys exchanged, host keys pinned, proven."""

from __future__ import annotations

import posixpath

from sparkctl.engine.task import Change, Scope, Task, TaskFailed
from sparkctl.resources import render
from sparkctl.tasks.netplan_files import unified_diff
from sparkctl.tasks.ssh_files import (
    known_hosts_lines,
    merge_authorized_keys,
    merge_config_block,
    merge_known_hosts,
)
from sparkctl.transport.base import q
from sparkctl.transport.hostkeys import host_key_name

SECTION = "@@sparkctl-file@@"
FILES = ("pub", "hostkey", "authorized_keys", "known_hosts", "config")


def key_name(cluster: str) -> str:
    return f"sparkctl-{cluster}_ed25519"


def read_ssh_files(ctx) -> dict[str, dict[str, str | None]]:
    """One round trip per node (in parallel): the files the mesh is made of."""
    key = key_name(ctx.inventory.cluster.name)
    paths = [f'"$HOME"/.ssh/{q(key + ".pub")}', "/etc/ssh/ssh_host_ed25519_key.pub",
             '"$HOME"/.ssh/authorized_keys', '"$HOME"/.ssh/known_hosts', '"$HOME"/.ssh/config']
    # `awk 1`, not cat: a file without a final newline would glue the next section marker onto its last line
    # (that section would then be read as absent and rewritten, losing the user's entries).
    script = "\n".join(f"echo {q(SECTION + name)}; awk 1 {path} 2>/dev/null || echo {q(SECTION + 'absent')}"
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
            pub = f.get("pub")
            if not pub and ctx.options.check:
                # --check: ssh.keys has not generated it; show where its line goes
                pub = f"ssh-ed25519 <new-cluster-key-of-{node.name}> sparkctl-{cluster}@{node.name}"
            if not pub or not f.get("hostkey"):
                raise TaskFailed(f"{node.name}: cluster key or ssh host key missing",
                                 hint="rerun bootstrap; check /etc/ssh/ssh_host_ed25519_key.pub on the node")
            pubs[node.name] = pub.strip()
            hostkeys[node.name] = " ".join(f["hostkey"].split()[:2])
            fabric = [str(a.ip) for a in plan.fabric.addresses.get(node.name, {}).values()]
            names[node.name] = [host_key_name(str(node.host), node.port or inv.ssh.port or 22)] + fabric
        wanted: dict[str, dict[str, str]] = {}
        for node in files:
            peers = [p for p in pubs if p != node]
            auth = merge_authorized_keys(files[node].get("authorized_keys") or "", [pubs[p] for p in peers], cluster)
            entries = [(names[p], hostkeys[p]) for p in peers]
            known = merge_known_hosts(files[node].get("known_hosts") or "", known_hosts_lines(entries, cluster),
                                      {n for p in peers for n in names[p]}, cluster)
            home = files[node].get("home")
            if not home:  # SFTP does not expand `~`: never write to a guessed path
                raise TaskFailed(f"{node}: $HOME is not set for {inv.user}")
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
            path = posixpath.join(home, ".ssh", name)
            ctx.nodes[node].transport.put(path, content, mode=kept_mode(ctx.nodes[node], path))


def kept_mode(node_ctx, path: str) -> int:
    """The file's mode as the user left it (never group/world-writable: sshd would refuse it); 600 if new.

    Also makes sure ~/.ssh exists.
    """
    result = node_ctx.run(f'install -d -m 700 "$HOME"/.ssh && stat -c %a {q(path)} 2>/dev/null || true')
    found = result.stdout.strip()
    return int(found, 8) & 0o644 if found.isdigit() else 0o600


class SshVerify(Task):
    name = "ssh.verify"
    phase = "ssh"
    scope = Scope.CLUSTER
    needs = ("ssh.mesh",)
    description = "prove passwordless ssh from every node to every other over the fabric"
    checks = "`ssh -o BatchMode=yes <peer fabric ip> true` from every node to every other node"
    changes = "nothing (read-only)"

    def check(self, ctx) -> list[Change]:
        if ctx.options.check and SshMeshTask().check(ctx):
            ctx.warn("not run in check mode: the ssh mesh is not set up yet", task=self.name)
            return []
        plan = ctx.plan()
        scripts = {}
        names = list(ctx.nodes)
        for index, node in enumerate(names):
            lines = []
            # each node starts with the next one: all starting with the first node would put N-1 handshakes on
            # one sshd at once, past its MaxStartups (10), which then resets connections at random
            for peer in names[index + 1:] + names[:index]:
                target, options = _verify_target(ctx, plan, node, peer)
                # stderr captured in a variable: a read-only check leaves no file behind
                lines.append(f"if err=$(ssh -o BatchMode=yes -o ConnectTimeout=5 {options}{q(target)} true "
                             f"</dev/null 2>&1 >/dev/null); then echo {q('ok ' + peer + ' ' + target)}; "
                             f"else echo {q('fail ' + peer + ' ' + target)} \"$(printf '%s' \"$err\" | tail -n1)\";"
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


def peer_route(ctx, plan, node: str, peer: str) -> tuple[str, int | None]:
    """How `node` reaches `peer` with the cluster key: (the peer's address on a link they share, None), or for
    a peer with no shared link (non-neighbours in a ring of 4+) (its management address, its ssh port).

    A peer's first address is not always on a link of ours (in a ring it may face the next node).
    """
    for link in plan.fabric.links(node):
        for other, _iface, address in link.peers:
            if other == peer:
                return str(address.ip), None
    spec = ctx.inventory.node(peer)
    return str(spec.host), int(spec.port or ctx.inventory.ssh.port or 22)


def _verify_target(ctx, plan, node: str, peer: str) -> tuple[str, str]:
    target, port = peer_route(ctx, plan, node, peer)
    if port is None:
        return target, ""
    return target, f'-p {port} -o IdentitiesOnly=yes -i "$HOME"/.ssh/{q(key_name(ctx.inventory.cluster.name))} '


TASKS = [SshKeyTask(), SshMeshTask(), SshVerify()]
