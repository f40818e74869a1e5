"""`cluster down --network`: undo exactly what sparkctl did to the network and the ssh keys of a node."""

from __future__ import annotations

import base64
import json
import posixpath

from sparkctl.engine.task import Change, Task
from sparkctl.tasks import netplan_apply as safe
from sparkctl.tasks.ssh_files import key_marker, remove_config_block
from sparkctl.tasks.ssh_mesh import kept_mode, key_name
from sparkctl.transport.base import q

MARK = "@@sparkctl-original@@"


def _read_originals(ctx) -> dict[str, str] | None:
    base = posixpath.join(safe.state_dir(ctx.inventory.cluster.name), "original")
    script = (f"[ -d {q(base)} ] || exit 0; cd {q(base)} && for f in *; do [ -f \"$f\" ] || continue; "
              f"echo \"{MARK}$f\"; base64 -w0 \"$f\"; echo; done")
    result = ctx.must(script, "reading the recorded original network state", sudo=True)
    files: dict[str, str] = {}
    lines = result.stdout.splitlines()
    for i, line in enumerate(lines):
        if line.startswith(MARK):
            files[line[len(MARK):]] = base64.b64decode(lines[i + 1] if i + 1 < len(lines) else "").decode()
    return files or None


class NetworkDown(Task):
    name = "down.network"
    phase = "network"
    description = "restore the netplan files, fabric addresses and MTUs recorded before sparkctl's first change"
    checks = "the record under /var/lib/sparkctl/<cluster>/network/original against the node's files and addresses"
    changes = ("restores or removes each netplan file sparkctl changed, re-applies netplan (with the node-side "
               "revert guard), removes the fabric addresses and MTUs sparkctl set, then deletes the record")

    def check(self, ctx) -> list[Change]:
        originals = _read_originals(ctx)
        if originals is None:
            return []
        return [Change("restore the network as it was before bootstrap: " + ", ".join(
            f"remove /etc/netplan/{n[:-7]}" if n.endswith(".absent") else f"restore /etc/netplan/{n}"
            for n in sorted(originals) if n != "interfaces.json"), payload=originals)]

    def apply(self, ctx, changes) -> None:
        originals = changes[0].payload
        interfaces = json.loads(originals.get("interfaces.json") or "{}")
        paths = [f"/etc/netplan/{n[:-7] if n.endswith('.absent') else n}" for n in originals if n != "interfaces.json"]
        try:
            run_id = safe.arm_revert(ctx, paths, ctx.options.netplan_confirm_timeout)
            for name, content in originals.items():
                if name == "interfaces.json":
                    continue
                if name.endswith(".absent"):
                    ctx.must(f"rm -f {q('/etc/netplan/' + name[:-7])}", "removing the netplan file", sudo=True)
                else:
                    ctx.transport.put(f"/etc/netplan/{name}", content, mode=0o600, owner="root:root", sudo=True)
            safe.netplan_apply(ctx, run_id)
            safe.confirm(ctx, run_id)
            facts = ctx.facts(refresh=True)
            cmds = []
            for iface, was in interfaces.items():
                nic = facts.interfaces.get(iface)
                if nic is None:
                    continue
                for addr in nic.ipv4():
                    if str(addr) not in was["addresses"]:
                        cmds.append(f"ip addr del {q(str(addr))} dev {q(iface)}")
                for addr in was["addresses"]:
                    if addr not in {str(a) for a in nic.ipv4()}:
                        cmds.append(f"ip addr add {q(addr)} dev {q(iface)}")
                if nic.mtu != was["mtu"]:
                    cmds.append(f"ip link set dev {q(iface)} mtu {int(was['mtu'])}")
            cmds.append(f"rm -rf {q(safe.state_dir(ctx.inventory.cluster.name))}")
            ctx.must("\n".join(cmds), "restoring the fabric addresses", sudo=True)
        finally:
            ctx.invalidate()


class SshDown(Task):
    name = "down.ssh"
    phase = "ssh"
    description = "remove this cluster's key, authorized keys, pinned host keys and ssh config block"
    checks = "sparkctl's marked lines in ~/.ssh/authorized_keys, known_hosts and config, and the cluster key files"
    changes = "removes exactly those lines and files; the user's own lines stay"

    def _wanted(self, ctx) -> dict[str, tuple[str | None, str | None]]:
        cluster = ctx.inventory.cluster.name
        home = ctx.run('printf %s "$HOME"').stdout
        out = {}
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
        key = posixpath.join(home, ".ssh", key_name(cluster))
        if ctx.run(f"test -e {q(key)} -o -e {q(key + '.pub')}").ok:
            out[key] = (None, None)
        return out

    def check(self, ctx) -> list[Change]:
        return [Change(f"remove the cluster key {p}" if have is None else
                       f"remove {p} (only sparkctl's lines were in it)" if not want else
                       f"remove sparkctl's lines from {p}",
                       payload=(p, want)) for p, (have, want) in self._wanted(ctx).items()]

    def apply(self, ctx, changes) -> None:
        for change in changes:
            path, want = change.payload
            if want is None:
                ctx.must(f"rm -f {q(path)} {q(path + '.pub')}", "removing the cluster key")
            elif not want:
                # nothing of the user's is left: sparkctl created it (an empty file would still differ)
                ctx.must(f"rm -f {q(path)}", f"removing {path}")
            else:
                ctx.transport.put(path, want, mode=kept_mode(ctx, path))


DOWN_NETWORK_TASKS = [SshDown(), NetworkDown()]
