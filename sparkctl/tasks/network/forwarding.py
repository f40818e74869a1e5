"""network.forwarding: a ring's nodes relay for their neighbours (a ring of 4 or more), on the fabric twins only."""

from __future__ import annotations

import posixpath

from sparkctl.plan.paths import network_state_dir, sysctl_path
from sparkctl.plan.ring import conf_key
from sparkctl.taskgraph.diff import unified_diff
from sparkctl.taskgraph.task import Change, Task
from sparkctl.tasks.context import NodeContext
from sparkctl.transport.base import q

#: the values sparkctl replaced, one `net/ipv4/conf/<twin>/<key> <value>` per line
ORIGINAL = "sysctl.orig"


class ForwardingTask(Task[NodeContext, str]):
    name = "network.forwarding"
    phase = "network"
    needs = ("network.netplan",)
    description = "let a ring's nodes relay between their neighbours: forwarding on the fabric twins only"
    checks = ("in a ring of 4 or more: /etc/sysctl.d/60-sparkctl-<cluster>.conf sets forwarding 1 and rp_filter 2 "
              "(loose: a reply may come the other way round) on each fabric twin, and the live values match; "
              "never the management port's, never net.ipv4.ip_forward. Any other shape: no such file")
    changes = ("records the values it replaces (for `cluster down --network`), writes the file (root, 644, atomic) "
               "and loads it with `sysctl -p`; removes it, restoring the recorded values, when no longer planned")

    def check(self, ctx: NodeContext) -> list[Change[str]]:
        plan = ctx.plan().nodes[ctx.name]
        facts = ctx.facts()
        path = sysctl_path(ctx.inventory.cluster.name)
        have = facts.sysctl_files.get(path)
        if not plan.sysctl:
            return [] if have is None else [Change(f"remove {path} (this node no longer relays)",
                                                   diff=unified_diff(path, have, None), payload="remove")]
        changes = []
        if have != plan.sysctl_file:
            changes.append(Change(f"{'update' if have else 'create'} {path}",
                                  diff=unified_diff(path, have, plan.sysctl_file), payload="file"))
        live = [f"{key.split('/')[-2]} {key.split('/')[-1]} {facts.ipv4_conf.get(conf_key(key), '?')}, want {want}"
                for key, want in plan.sysctl.items() if facts.ipv4_conf.get(conf_key(key)) != want]
        if live:
            changes.append(Change("load it: " + "; ".join(live), payload="load"))
        return changes

    def apply(self, ctx: NodeContext, changes: list[Change[str]]) -> None:
        path = sysctl_path(ctx.inventory.cluster.name)
        original = posixpath.join(network_state_dir(ctx.inventory.cluster.name), "original", ORIGINAL)
        try:
            if any(c.payload == "remove" for c in changes):
                ctx.must(f"rm -f {q(path)}\n{restore_script(original)}", f"removing {path}", sudo=True)
                return
            plan = ctx.plan().nodes[ctx.name]
            assert plan.sysctl_file is not None  # planned whenever check did not ask to remove it
            facts = ctx.facts()
            was = "".join(f"{key} {facts.ipv4_conf[conf_key(key)]}\n" for key in plan.sysctl
                          if facts.ipv4_conf.get(conf_key(key)) is not None)
            ctx.must(record_script(original, was), "recording the kernel settings sparkctl changes", sudo=True)
            ctx.transport.put(path, plan.sysctl_file, mode=0o644, owner="root:root", sudo=True)
            ctx.must(f"sysctl -q -p {q(path)}", f"loading {path}", sudo=True)
        finally:
            ctx.invalidate()


def record_script(original: str, was: str) -> str:
    """Shell that records `was` at `original` once. The record is never overwritten, so it goes to a temp name
    first and is renamed: a cut connection or a full disk leaves no record (the next run writes it), never a short
    one that `cluster down --network` would restore from."""
    temp = posixpath.join(posixpath.dirname(original), f".{posixpath.basename(original)}.tmp")
    return (f"install -d -m 700 {q(posixpath.dirname(original))} && "
            f"{{ [ -e {q(original)} ] || {{ printf '%s' {q(was)} > {q(temp)} && mv -f {q(temp)} {q(original)}; }} "
            f"|| {{ rm -f {q(temp)}; exit 1; }}; }}")


def restore_script(original: str) -> str:
    """Shell that sets the recorded values back, then drops the record."""
    return (f"if [ -f {q(original)} ]; then while read -r k v; do case $k in net/ipv4/conf/*) "
            f'[ -e "/proc/sys/$k" ] && printf \'%s\\n\' "$v" > "/proc/sys/$k";; esac; done < {q(original)}; '
            f"rm -f {q(original)}; fi")
