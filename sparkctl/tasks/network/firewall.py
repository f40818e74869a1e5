"""network.firewall: sparkctl's own nftables table on every node (sparkctl/plan/firewall.py, docs/firewall.md):
on the management side only sshd, the endpoint on the head, established traffic, ICMP, DHCP's answers and
firewall.allow answer; the fabric twins and loopback keep everything. Loaded with a node-side revert that puts the
previous rules back unless a new connection proves the controller's way in (firewall_guard.py).

Idempotent: the rules file has the planned content, the table the node holds is the one sparkctl loaded (the sha256
of its listing, recorded right after the load), the boot unit is in place and enabled. `firewall: off` removes
sparkctl's table, if there is one, and leaves the node's own rules alone.
"""

from __future__ import annotations

import hashlib
from typing import Literal

from sparkctl.facts import parse
from sparkctl.facts.firewall_files import LISTED_PATH, RULES_PATH, TABLE, UNIT_NAME, UNIT_PATH
from sparkctl.plan.firewall import FirewallSpec, firewall_spec
from sparkctl.rules.serving import serving_enabled
from sparkctl.taskgraph.diff import unified_diff
from sparkctl.taskgraph.task import Change, Task
from sparkctl.tasks.context import NodeContext
from sparkctl.tasks.network.firewall_guard import guarded_load
from sparkctl.transport.base import q

FirewallStep = Literal["load", "unit", "remove"]


def node_firewall(ctx: NodeContext) -> FirewallSpec | None:
    return firewall_spec(ctx.inventory, ctx.name, ctx.plan().fabric, serving_enabled(ctx.inventory))

#: sparkctl's table, its files and its unit gone (the node's own rules untouched)
REMOVE_SCRIPT = (f"nft delete table inet {TABLE} 2>/dev/null; systemctl disable {UNIT_NAME} >/dev/null 2>&1; "
                 f"rm -f {q(UNIT_PATH)} {q(RULES_PATH)} {q(LISTED_PATH)}; systemctl daemon-reload; true")


def listing_hash(listing: str) -> str:
    """The sha256 of sparkctl's table as `nft list` prints it (from the facts' ruleset or `nft list table`)."""
    return hashlib.sha256((parse.own_table(listing) or "").encode()).hexdigest()


def _same(have: str | None, want: str) -> bool:
    return have is not None and have.rstrip("\n") == want.rstrip("\n")


class FirewallTask(Task[NodeContext, FirewallStep]):
    name = "network.firewall"
    phase = "network"
    needs = ("network.netplan",)
    description = ("close the management side of every node: sparkctl's nftables table lets in sshd, the endpoint "
                   "(head), established traffic and firewall.allow; the fabric keeps everything")
    checks = (f"{RULES_PATH} has the planned rules, the table `inet {TABLE}` the node holds is the one sparkctl "
              f"loaded (the sha256 of its listing, kept in {LISTED_PATH}), and {UNIT_NAME} (which loads it at boot) "
              "is in place and enabled; with `firewall: off`, that none of them is there")
    changes = ("writes the rules, checks them (`nft -c`), arms a node-side revert, loads them (`nft -f`: one "
               "transaction), confirms over a new SSH connection (else the node puts its previous rules back by "
               "itself), records the listing's sha256; installs and enables the boot unit; `firewall: off` removes "
               "sparkctl's table, files and unit")

    def check(self, ctx: NodeContext) -> list[Change[FirewallStep]]:
        spec = node_firewall(ctx)
        facts = ctx.facts()
        live = facts.own_firewall if facts.own_firewall is not None else self._read_live(ctx)
        if spec is None:
            present = live or facts.firewall_rules is not None or facts.firewall_unit is not None
            return [Change("remove sparkctl's firewall (firewall: off): the node's own rules stay as they are",
                           payload="remove")] if present else []
        changes: list[Change[FirewallStep]] = []
        want = spec.rules()
        if not _same(facts.firewall_rules, want):
            changes.append(Change(f"load the firewall: on the management side only {spec.summary()}",
                                  diff=unified_diff(RULES_PATH, facts.firewall_rules, want), payload="load"))
        elif not live:
            changes.append(Change(f"load the firewall: the table inet {TABLE} is not loaded", payload="load"))
        elif listing_hash(live) != facts.firewall_listed:
            changes.append(Change(f"load the firewall again: the table inet {TABLE} differs from the one sparkctl "
                                  "loaded", payload="load"))
        unit = spec.unit()
        if not _same(facts.firewall_unit, unit):
            changes.append(Change(f"install {UNIT_NAME} (loads the firewall at boot)",
                                  diff=unified_diff(UNIT_PATH, facts.firewall_unit, unit), payload="unit"))
        elif facts.firewall_unit_enabled != "enabled":
            changes.append(Change(f"enable {UNIT_NAME} (loads the firewall at boot)", payload="unit"))
        return changes

    @staticmethod
    def _read_live(ctx: NodeContext) -> str:
        """The table read with sudo, where the facts could not (sudo asks a password)."""
        # no nft on the node: no table of sparkctl's either
        listing = ctx.must("command -v nft >/dev/null || exit 0; nft list ruleset", "reading the node's firewall",
                           sudo=True).stdout
        return parse.own_table(listing) or ""

    def apply(self, ctx: NodeContext, changes: list[Change[FirewallStep]]) -> None:
        steps = {c.payload for c in changes}
        try:
            if "remove" in steps:
                ctx.must(REMOVE_SCRIPT, "removing sparkctl's firewall", sudo=True)
                return
            spec = node_firewall(ctx)
            assert spec is not None  # planned whenever check did not ask to remove it
            if "load" in steps:
                self._load(ctx, spec)
            if "unit" in steps:
                ctx.transport.put(UNIT_PATH, spec.unit(), mode=0o644, owner="root:root", sudo=True)
                ctx.must(f"systemctl daemon-reload && systemctl enable {UNIT_NAME}", f"enabling {UNIT_NAME}",
                         sudo=True)
        finally:
            ctx.invalidate()

    @staticmethod
    def _load(ctx: NodeContext, spec: FirewallSpec) -> None:
        guarded_load(ctx, spec.rules(), int(ctx.options.netplan_confirm_timeout))
        listing = ctx.must(f"nft list table inet {TABLE}", "reading the firewall back", sudo=True).stdout
        ctx.transport.put(LISTED_PATH, listing_hash(listing) + "\n", mode=0o644, owner="root:root", sudo=True)


class FirewallRemoveTask(Task[NodeContext, FirewallStep]):
    name = "network.firewall_remove"
    phase = "network"
    description = "remove sparkctl's firewall: its table, its files and its boot unit (the node's own rules stay)"
    checks = f"whether the table inet {TABLE}, {RULES_PATH} or {UNIT_NAME} is on the node"
    changes = f"`nft delete table inet {TABLE}`, disables and removes {UNIT_NAME}, removes the files"

    def check(self, ctx: NodeContext) -> list[Change[FirewallStep]]:
        facts = ctx.facts()
        live = facts.own_firewall if facts.own_firewall is not None else FirewallTask._read_live(ctx)
        if live or facts.firewall_rules is not None or facts.firewall_unit is not None:
            return [Change("remove sparkctl's firewall", payload="remove")]
        return []

    def apply(self, ctx: NodeContext, changes: list[Change[FirewallStep]]) -> None:
        try:
            ctx.must(REMOVE_SCRIPT, "removing sparkctl's firewall", sudo=True)
        finally:
            ctx.invalidate()
