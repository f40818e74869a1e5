"""network.netplan: one subnet per fabric twin, MTU 9000, through netplan, applied safely."""

from __future__ import annotations

import base64
import ipaddress
from dataclasses import dataclass, replace
from typing import Literal

from sparkctl.facts import NetplanFile
from sparkctl.rules.fabric import interface_drift, management_names, twins_sharing_subnet
from sparkctl.rules.netplan import NETWORKMANAGER, conflicting_stanzas, renderer_of, without_stanzas
from sparkctl.rules.networkmanager import competing_profiles, netplan_stanzas_of, unmanaged_twins
from sparkctl.taskgraph.diff import unified_diff
from sparkctl.taskgraph.task import Change, Task, TaskFailed
from sparkctl.tasks.context import NodeContext
from sparkctl.tasks.network import safe_apply as safe
from sparkctl.transport.base import q


def _planned(ctx: NodeContext) -> tuple[list[str], dict[str, str]]:
    plan = ctx.plan()
    ifaces = list(plan.fabric.ports[ctx.name].interfaces)
    return ifaces, {i: str(a) for i, a in plan.fabric.addresses.get(ctx.name, {}).items()}


def _guard_management(ctx: NodeContext, ifaces: list[str]) -> None:
    touched = sorted(set(ifaces) & management_names(ctx.facts(), hosts=[ctx.node.host]))
    if touched:
        raise TaskFailed(
            f"refusing to configure {', '.join(touched)} on {ctx.name}: it carries the management connection",
            hint="pin other fabric.interfaces for this node, or reach it by its management port (enP7s7)",
        )


def _live_drift(ctx: NodeContext, ifaces: list[str], files: list[NetplanFile]) -> list[str]:
    """What `netplan apply` (and the removal of unplanned addresses) must still change, in words. `files`: the
    netplan files as they will be (the renderer is judged on them)."""
    plan = ctx.plan()
    drift = []
    unplanned: dict[str, list[str]] = {}
    facts = ctx.facts()
    for d in interface_drift(facts, ifaces, plan.fabric.addresses.get(ctx.name, {}), ctx.inventory.fabric.mtu):
        if d.kind == "missing" and not facts.interface_up(d.interface):
            continue  # the renderer configures the address with the carrier: set down (brought Up) or no carrier
        if d.kind == "unplanned":
            if d.interface not in unplanned:
                unplanned[d.interface] = []
                drift.append(d)
            unplanned[d.interface].append(d.have)
        else:
            drift.append(d)
    words = {"absent": "{i} is absent", "missing": "{i} lacks {want}", "mtu": "{i} mtu {have}, want {want}"}
    out = [f"{d.interface} has unplanned {', '.join(unplanned[d.interface])}" if d.kind == "unplanned"
           else words[d.kind].format(i=d.interface, have=d.have, want=d.want) for d in drift]
    out += [f"{iface} lacks the route {to} via {via}" for iface, to, via in missing_routes(ctx)]
    nets = [a.network for a in plan.fabric.addresses.get(ctx.name, {}).values()]
    if len(nets) != len(set(nets)):
        out.append("two twins share a subnet")
    legacy = twins_sharing_subnet(ctx.facts(), ifaces)
    if legacy:
        net, names = next(iter(legacy.items()))
        out.append(f"both twins in one subnet ({names[0]} and {names[1]} in {net}): the legacy scheme causes "
                   "ARP/route confusion and NCCL failures; renumbering to one subnet per twin")
    # `netplan apply` clears NetworkManager's runtime device state (/run/NetworkManager/devices) and restarts it
    out += [f"{name} is not managed by NetworkManager, which renders it" for name in
            unmanaged_twins(ctx.facts(), ifaces, files)]
    return out


def _as_written(files: list[NetplanFile], path: str, desired: str) -> list[NetplanFile]:
    return [f for f in files if f.path != path] + [NetplanFile(path, desired, 0o600)]


def _hint(ctx: NodeContext, ifaces: list[str]) -> str:
    if any(renderer_of(ctx.facts().netplan_files, i) == NETWORKMANAGER for i in ifaces):
        return "see `nmcli device` and `journalctl -u NetworkManager` on the node (NetworkManager renders netplan)"
    return "see `journalctl -u systemd-networkd` on the node"


def missing_routes(ctx: NodeContext) -> list[tuple[str, str, str]]:
    """(interface, destination, via) of each planned route the node does not have (netplan apply adds them)."""
    live = {(ipaddress.ip_network(r.destination, strict=False), r.via, r.device) for r in ctx.facts().routes
            if r.destination != "default"}
    return [(iface, to, via) for iface, routes in ctx.plan().nodes[ctx.name].routes.items() for to, via in routes
            if (ipaddress.ip_network(to, strict=False), via, iface) not in live]


def readable_netplan_files(ctx: NodeContext) -> list[NetplanFile]:
    """The netplan files from the facts, with the ones facts could not read (0600 root, and sudo needs the
    password the fact script never has) read again through the transport's sudo, in one round trip."""
    files = ctx.facts().netplan_files
    unreadable = [f.path for f in files if f.content is None]
    if not unreadable:
        return files
    script = "\n".join(f"printf '%s ' {q(p)}; base64 -w0 < {q(p)}; echo" for p in unreadable)
    result = ctx.must(script, "reading the netplan files", sudo=True)
    contents = {}
    for line in result.stdout.splitlines():
        name, _, encoded = line.rpartition(" ")
        contents[name] = base64.b64decode(encoded).decode("utf-8", "replace")
    return [replace(f, content=contents.get(f.path, f.content)) for f in files]


@dataclass(frozen=True)
class NetplanStep:
    """What one change of network.netplan does (apply reads only these)."""

    kind: Literal["file", "move", "nm-profile", "up", "live", "guards"]
    target: str = ""   # the file written, the NetworkManager profile's uuid, the interface set up
    content: str = ""  # the file's new content, the profile's file name
    guards: tuple[str, ...] = ()  # revert guards an interrupted run left armed


class NetplanTask(Task[NodeContext, NetplanStep]):
    name = "network.netplan"
    phase = "network"
    needs = ("preflight.node", "preflight.cluster")
    description = "address each fabric twin in its own subnet with MTU 9000, through netplan, safely"
    checks = ("the netplan file's content, stanzas for the same interfaces in other netplan files, NetworkManager "
              "profiles competing for the twins (when it runs), fabric twins set down, the live addresses and MTU "
              "of the fabric interfaces, and revert guards an interrupted run left armed")
    changes = ("brings a fabric twin that is set down Up (`ip link set <twin> up`), writes the netplan file (mode "
               "600, atomic), moves conflicting stanzas out (backed up), removes NetworkManager profiles that would "
               "take a twin from netplan's (backed up), arms a node-side revert, runs `netplan apply`, confirms over "
               "a new management connection, removes unplanned addresses from the fabric twins, waits for the "
               "planned addresses (on the twins that have carrier: the renderer configures the others when it "
               "comes); a revert an interrupted run left armed is confirmed the same way (apply, then a new "
               "connection)")

    def check(self, ctx: NodeContext) -> list[Change[NetplanStep]]:
        plan = ctx.plan()
        desired = plan.nodes[ctx.name].netplan
        if desired is None:
            return []
        ifaces, _ = _planned(ctx)
        _guard_management(ctx, ifaces)
        files = readable_netplan_files(ctx)
        path = ctx.inventory.fabric.netplan_file
        current = next((f for f in files if f.path == path), None)
        changes = []
        if current is None or current.content != desired or current.mode not in (0o600, None):
            why = "create" if current is None else ("update" if current.content != desired else "chmod 600")
            before = current.content if current else None
            changes.append(Change(f"{why} {path}", diff=unified_diff(path, before, desired),
                                  payload=NetplanStep("file", path, desired)))
        # a netplan stanza of another name NetworkManager binds to a twin (DGX OS writes nmcli's profiles as
        # 90-NM-<uuid>.yaml) is a conflict too
        also = netplan_stanzas_of(ctx.facts(), ifaces)
        for other, keys in conflicting_stanzas(files, path, ifaces, also).items():
            content = next(f.content for f in files if f.path == other) or ""  # it has the stanzas: not empty
            after = without_stanzas(content, keys)
            changes.append(Change(f"move the stanza(s) for {', '.join(keys)} out of {other} (netplan would merge "
                                  "their addresses; the file is backed up)",
                                  diff=unified_diff(other, content, after), payload=NetplanStep("move", other, after)))
        facts = ctx.facts()
        management = management_names(facts, hosts=[ctx.node.host])
        for c in competing_profiles(facts, ifaces, management):
            changes.append(Change(f"remove the NetworkManager profile {c.profile.name!r} that competes with "
                                  f"netplan's for {c.interface} ({c.why}; backed up)",
                                  payload=NetplanStep("nm-profile", c.profile.uuid, c.profile.filename)))
        for iface in ifaces:
            if facts.interface_admin_down(iface):
                changes.append(Change(f"bring {iface} up (administratively down; Up is part of the planned state)",
                                      payload=NetplanStep("up", iface)))
        drift = _live_drift(ctx, ifaces, _as_written(files, path, desired))
        if drift:
            changes.append(Change("apply netplan: " + "; ".join(drift), payload=NetplanStep("live")))
        guards = safe.pending_guards(ctx)
        if guards:
            changes.append(Change(f"confirm the netplan change of an interrupted run (revert guard "
                                  f"{', '.join(guards)} would restore the files it replaced): apply, then prove "
                                  "the management path over a new connection",
                                  payload=NetplanStep("guards", guards=tuple(guards))))
        return changes

    def apply(self, ctx: NodeContext, changes: list[Change[NetplanStep]]) -> None:
        steps = [c.carried() for c in changes]
        files = {s.target: s.content for s in steps if s.kind in ("file", "move")}
        profiles = [(s.target, s.content) for s in steps if s.kind == "nm-profile"]
        set_up = [s.target for s in steps if s.kind == "up"]
        live = any(s.kind == "live" for s in steps)
        earlier = [g for s in steps if s.kind == "guards" for g in s.guards]
        ifaces, wanted = _planned(ctx)
        try:
            if set_up:
                ctx.must("\n".join(f"ip link set {q(i)} up" for i in set_up), "bringing the fabric twins up",
                         sudo=True)
            if files or profiles:
                safe.record_originals(ctx, sorted(files), ifaces)
            if profiles:
                # before the apply: NetworkManager chooses again when `netplan apply` restarts it
                safe.remove_nm_profiles(ctx, profiles)
            if files:
                paths = sorted(files)
                run_id = safe.arm_revert(ctx, paths, ctx.options.netplan_confirm_timeout)
                for path, content in files.items():
                    ctx.transport.put(path, content, mode=0o600, owner="root:root", sudo=True)
                applied_at = safe.netplan_apply(ctx, run_id)
                safe.confirm(ctx, run_id, applied_at)
            elif live or earlier:
                safe.netplan_apply(ctx)
            # An earlier run's guard is confirmed only now: after this apply, over a new connection, like its own
            # run would have. Unreachable here leaves it armed, and it restores what that run replaced.
            for run_id in earlier:
                safe.confirm(ctx, run_id)
            _remove_unplanned(ctx, ifaces, wanted)
            missing = safe.wait_for_addresses(ctx, wanted, ctx.inventory.fabric.mtu)
            if missing:
                raise TaskFailed(f"after netplan apply, {ctx.name} still lacks the planned fabric settings",
                                 hint=_hint(ctx, ifaces), details=[f"{i}: {m}" for i, m in missing.items()])
        finally:
            ctx.invalidate()


def _remove_unplanned(ctx: NodeContext, ifaces: list[str], wanted: dict[str, str]) -> None:
    facts = ctx.facts(refresh=True)
    cmds = []
    for iface in ifaces:
        for a in facts.addresses_of(iface):
            if a.family == "inet" and str(a) != wanted.get(iface):
                cmds.append(f"ip addr del {q(str(a))} dev {q(iface)}")
    if cmds:
        ctx.must("\n".join(cmds), "removing unplanned fabric addresses", sudo=True)
