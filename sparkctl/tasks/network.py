"""network.netplan and network.verify: one subnet per twin, MTU 9000, applied safely, proven by jumbo pings."""

from __future__ import annotations

import base64
import ipaddress
from dataclasses import replace

from sparkctl.engine.task import Change, Scope, Task, TaskFailed
from sparkctl.plan.fabric import MANAGEMENT_NAMES
from sparkctl.tasks import netplan_apply as safe
from sparkctl.tasks.netplan_files import conflicting_stanzas, unified_diff, without_stanzas
from sparkctl.transport.base import q


def _planned(ctx) -> tuple[list[str], dict[str, str]]:
    plan = ctx.plan()
    ifaces = list(plan.fabric.ports[ctx.name].interfaces)
    return ifaces, {i: str(a) for i, a in plan.fabric.addresses.get(ctx.name, {}).items()}


def _guard_management(ctx, ifaces: list[str]) -> None:
    facts = ctx.facts()
    mgmt = set(facts.management_interfaces) | set(facts.interfaces_holding(str(ctx.node.host)))
    touched = sorted((set(ifaces) & mgmt) | (set(ifaces) & set(MANAGEMENT_NAMES)))
    if touched:
        raise TaskFailed(
            f"refusing to configure {', '.join(touched)} on {ctx.name}: it carries the management connection",
            hint="pin other fabric.interfaces for this node, or reach it by its management port (enP7s7)",
        )


def _live_drift(ctx, ifaces: list[str], wanted: dict[str, str]) -> list[str]:
    facts = ctx.facts()
    mtu = ctx.inventory.fabric.mtu
    drift = []
    for iface in ifaces:
        nic = facts.interfaces.get(iface)
        if nic is None:
            drift.append(f"{iface} is absent")
            continue
        have = [a for a in nic.addresses if a.family == "inet"]
        if iface in wanted and wanted[iface] not in {str(a) for a in have}:
            drift.append(f"{iface} lacks {wanted[iface]}")
        extra = [str(a) for a in have if str(a) != wanted.get(iface)]
        if extra:
            drift.append(f"{iface} has unplanned {', '.join(extra)}")
        if nic.mtu != mtu:
            drift.append(f"{iface} mtu {nic.mtu}, want {mtu}")
    nets = [ipaddress.ip_interface(a).network for a in wanted.values()]
    if len(nets) != len(set(nets)):
        drift.append("two twins share a subnet")
    legacy = _twins_sharing_subnet(facts, ifaces)
    if legacy:
        drift.append(f"both twins in one subnet ({legacy}): the legacy scheme causes ARP/route confusion "
                     "and NCCL failures; renumbering to one subnet per twin")
    return drift


def _twins_sharing_subnet(facts, ifaces: list[str]) -> str | None:
    seen: dict[ipaddress.IPv4Network, str] = {}
    for iface in ifaces:
        for a in facts.addresses_of(iface):
            if a.family != "inet" or a.is_link_local:
                continue
            if a.network in seen and seen[a.network] != iface:
                return f"{seen[a.network]} and {iface} in {a.network}"
            seen[a.network] = iface
    return None


def readable_netplan_files(ctx) -> list:
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


class NetplanTask(Task):
    name = "network.netplan"
    phase = "network"
    needs = ("preflight.node", "preflight.cluster")
    description = "address each fabric twin in its own subnet with MTU 9000, through netplan, safely"
    checks = ("the netplan file's content, stanzas for the same interfaces in other netplan files, and the live "
              "addresses and MTU of the fabric interfaces")
    changes = ("writes the netplan file (mode 600, atomic), moves conflicting stanzas out (backed up), arms a "
               "node-side revert, runs `netplan apply`, confirms over a new management connection, removes "
               "unplanned addresses from the fabric twins, waits for the planned addresses")

    def check(self, ctx) -> list[Change]:
        plan = ctx.plan()
        desired = plan.nodes[ctx.name].netplan
        if desired is None:
            return []
        ifaces, wanted = _planned(ctx)
        _guard_management(ctx, ifaces)
        files = readable_netplan_files(ctx)
        path = ctx.inventory.fabric.netplan_file
        current = next((f for f in files if f.path == path), None)
        changes = []
        if current is None or current.content != desired or current.mode not in (0o600, None):
            why = "create" if current is None else ("update" if current.content != desired else "chmod 600")
            changes.append(Change(f"{why} {path}", diff=unified_diff(path, current and current.content, desired),
                                  payload=("file", path, desired)))
        for other, keys in conflicting_stanzas(files, path, ifaces).items():
            content = next(f.content for f in files if f.path == other)
            after = without_stanzas(content, keys)
            changes.append(Change(f"move the stanza(s) for {', '.join(keys)} out of {other} (netplan would merge "
                                  "their addresses; the file is backed up)",
                                  diff=unified_diff(other, content, after), payload=("move", other, after)))
        drift = _live_drift(ctx, ifaces, wanted)
        if drift:
            changes.append(Change("apply netplan: " + "; ".join(drift), payload=("live", None, None)))
        return changes

    def apply(self, ctx, changes: list[Change]) -> None:
        files = {c.payload[1]: c.payload[2] for c in changes if c.payload[0] in ("file", "move")}
        ifaces, wanted = _planned(ctx)
        try:
            if files:
                paths = sorted(files)
                safe.record_originals(ctx, paths, ifaces)
                run_id = safe.arm_revert(ctx, paths, ctx.options.netplan_confirm_timeout)
                for path, content in files.items():
                    ctx.transport.put(path, content, mode=0o600, owner="root:root", sudo=True)
                safe.netplan_apply(ctx, run_id)
                safe.confirm(ctx, run_id)
            else:
                safe.netplan_apply(ctx)
            _remove_unplanned(ctx, ifaces, wanted)
            missing = safe.wait_for_addresses(ctx, wanted, ctx.inventory.fabric.mtu)
            if missing:
                raise TaskFailed(f"after netplan apply, {ctx.name} still lacks the planned fabric settings",
                                 hint="see `journalctl -u systemd-networkd` on the node",
                                 details=[f"{i}: {m}" for i, m in missing.items()])
        finally:
            ctx.invalidate()


def _remove_unplanned(ctx, ifaces: list[str], wanted: dict[str, str]) -> None:
    facts = ctx.facts(refresh=True)
    cmds = []
    for iface in ifaces:
        for a in facts.addresses_of(iface):
            if a.family == "inet" and str(a) != wanted.get(iface):
                cmds.append(f"ip addr del {q(str(a))} dev {q(iface)}")
    if cmds:
        ctx.must("\n".join(cmds), "removing unplanned fabric addresses", sudo=True)


class NetworkVerify(Task):
    name = "network.verify"
    phase = "network"
    scope = Scope.CLUSTER
    needs = ("network.netplan",)
    description = "ping every peer on every twin with don't-fragment at MTU-28 bytes"
    checks = ("from each node, a don't-fragment ping of MTU-28 bytes to every peer address on the same twin "
              "subnet; on failure, a small ping tells an MTU problem from a dead link")
    changes = "nothing (read-only)"

    def check(self, ctx) -> list[Change]:
        if ctx.inventory.topology == "single":
            return []
        if ctx.options.check:
            pending = sorted(name for name, node in ctx.nodes.items() if NetplanTask().check(node))
            if pending:
                ctx.warn(f"not run in check mode: the fabric settings of {', '.join(pending)} are not applied yet",
                         task=self.name)
                return []
        plan = ctx.plan()
        size = ctx.inventory.fabric.mtu - 28
        script_by_node = {}
        for name in ctx.nodes:
            lines = []
            for link in plan.fabric.links(name):
                for peer, _pif, paddr in link.peers:
                    tag = f"{link.interface}>{peer}:{paddr.ip}"
                    lines.append(
                        f"if ping -c 1 -W 2 -M do -s {size} -I {q(link.interface)} {q(str(paddr.ip))} >/dev/null 2>&1;"
                        f" then echo {q('ok ' + tag)}; elif ping -c 1 -W 2 -I {q(link.interface)} "
                        f"{q(str(paddr.ip))} >/dev/null 2>&1; then echo {q('mtu ' + tag)}; "
                        f"else echo {q('dead ' + tag)}; fi")
            script_by_node[name] = "\n".join(lines)
        failures = []
        results = ctx.run_on_all({n: s for n, s in script_by_node.items() if s}, timeout=60)
        for name, result in results.items():
            for line in result.stdout.splitlines():
                verdict, _, tag = line.partition(" ")
                if verdict == "mtu":
                    failures.append(f"{name} {tag}: jumbo ping ({size} bytes, don't fragment) fails but a small "
                                    "one passes: MTU mismatch on the peer or a switch port (set MTU 9000 on both "
                                    "ends; 9216 on switch ports)")
                elif verdict == "dead":
                    failures.append(f"{name} {tag}: no answer (cable, port, or the peer's address)")
        if failures:
            raise TaskFailed(f"{len(failures)} fabric link check(s) failed", details=failures)
        return []



TASKS = [NetplanTask(), NetworkVerify()]
