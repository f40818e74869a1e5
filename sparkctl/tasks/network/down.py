"""down.network (`cluster down --network`): undo exactly what sparkctl did to a node's network."""

from __future__ import annotations

import base64
import json
import posixpath

from sparkctl.plan.paths import network_state_dir, sysctl_path
from sparkctl.rules.networkmanager import is_keyfile
from sparkctl.taskgraph.task import Change, Task
from sparkctl.tasks.context import NodeContext
from sparkctl.tasks.network import safe_apply as safe
from sparkctl.tasks.network.forwarding import ORIGINAL, restore_script
from sparkctl.tasks.network.safe_apply import NM_BACKUP
from sparkctl.transport.base import q


def _read_originals(ctx: NodeContext) -> dict[str, str] | None:
    """The recorded files (NetworkManager profiles as `nm/<uuid>.nmconnection` and `nm/<uuid>.path`), one line
    each: `<base64 of the name> <base64 of the content>`."""
    base = posixpath.join(network_state_dir(ctx.inventory.cluster.name), "original")
    script = (f"[ -d {q(base)} ] || exit 0; cd {q(base)} && for f in * {NM_BACKUP}/*; do [ -f \"$f\" ] || continue; "
              f"printf '%s %s\\n' \"$(printf '%s' \"$f\" | base64 -w0)\" \"$(base64 -w0 < \"$f\")\"; done")
    result = ctx.must(script, "reading the recorded original network state", sudo=True)
    files: dict[str, str] = {}
    for line in result.stdout.splitlines():
        name, _, content = line.partition(" ")
        if name:
            files[base64.b64decode(name).decode()] = base64.b64decode(content).decode()
    return files or None


#: What the record holds besides netplan files (NetworkManager's profiles are under NM_BACKUP/).
NOT_NETPLAN = frozenset({"interfaces.json", ORIGINAL})


def _netplan_names(originals: dict[str, str]) -> list[str]:
    return sorted(n for n in originals if n not in NOT_NETPLAN and "/" not in n)


def _nm_profiles(originals: dict[str, str]) -> list[tuple[str, str]]:
    """(the profile's own path, its recorded content) for each NetworkManager profile sparkctl removed."""
    prefix = f"{NM_BACKUP}/"
    out = []
    for name, recorded in originals.items():
        backup = name[:-len(".path")] + ".nmconnection"
        # the record is root's, but a path is put back only where NetworkManager keeps its profiles
        if (name.startswith(prefix) and name.endswith(".path") and backup in originals
                and is_keyfile(recorded.strip())):
            out.append((recorded.strip(), originals[backup]))
    return sorted(out)


class NetworkDown(Task[NodeContext, dict[str, str]]):
    name = "down.network"
    phase = "network"
    description = ("restore the netplan files, NetworkManager profiles, fabric addresses, MTUs and forwarding "
                   "recorded before sparkctl's first change")
    checks = "the record under /var/lib/sparkctl/<cluster>/network/original against the node's files and addresses"
    changes = ("restores or removes each netplan file sparkctl changed, puts back the NetworkManager profiles it "
               "removed, re-applies netplan (with the node-side revert guard), removes the fabric addresses and MTUs "
               "sparkctl set, removes its sysctl.d file and sets the forwarding values back, then deletes the record")

    def check(self, ctx: NodeContext) -> list[Change[dict[str, str]]]:
        originals = _read_originals(ctx)
        if originals is None:
            return []
        words = [f"remove /etc/netplan/{n[:-7]}" if n.endswith(".absent") else f"restore /etc/netplan/{n}"
                 for n in _netplan_names(originals)]
        words += [f"restore the NetworkManager profile {path}" for path, _ in _nm_profiles(originals)]
        if ORIGINAL in originals:
            words.append(f"remove {sysctl_path(ctx.inventory.cluster.name)} and restore the forwarding settings")
        return [Change("restore the network as it was before bootstrap: " + ", ".join(words), payload=originals)]

    def apply(self, ctx: NodeContext, changes: list[Change[dict[str, str]]]) -> None:
        originals = changes[0].carried()
        interfaces = json.loads(originals.get("interfaces.json") or "{}")
        paths = [f"/etc/netplan/{n[:-7] if n.endswith('.absent') else n}" for n in _netplan_names(originals)]
        try:
            # before the apply: NetworkManager chooses among the profiles again when `netplan apply` restarts it
            for path, content in _nm_profiles(originals):
                ctx.transport.put(path, content, mode=0o600, owner="root:root", sudo=True)
                ctx.must(f"nmcli connection load {q(path)}", "loading the restored NetworkManager profile",
                         sudo=True)
            run_id = safe.arm_revert(ctx, paths, ctx.options.netplan_confirm_timeout)
            for name in _netplan_names(originals):
                content = originals[name]
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
            state = network_state_dir(ctx.inventory.cluster.name)
            cmds.append(f"rm -f {q(sysctl_path(ctx.inventory.cluster.name))}")
            cmds.append(restore_script(posixpath.join(state, "original", ORIGINAL)))
            cmds.append(f"rm -rf {q(state)}")
            ctx.must("\n".join(cmds), "restoring the fabric addresses", sudo=True)
        finally:
            ctx.invalidate()
