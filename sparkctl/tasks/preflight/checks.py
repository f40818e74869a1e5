"""Preflight: read-only checks that stop the run before anything changes."""

from __future__ import annotations

from datetime import datetime, timezone

from sparkctl.facts import Facts
from sparkctl.knowledge.spark import PORT_SPEED_MBPS
from sparkctl.rules.cabling import cabling_map
from sparkctl.rules.clock import MAX_SKEW_S, clock_skew, set_wrong
from sparkctl.rules.fabric import management_names
from sparkctl.rules.twins import ABSENT, WRONG_PORT, twin_faults
from sparkctl.taskgraph.task import Change, Scope, Task, TaskFailed
from sparkctl.tasks.context import ClusterContext, NodeContext


class NodePreflight(Task[NodeContext, None]):
    name = "preflight.node"
    phase = "preflight"
    description = "read the node's facts; check user, sudo, docker access and its fabric interfaces"
    checks = ("the user, passwordless sudo (or --ask-become-pass), DGX Spark identity, docker group, that the "
              "node has CX-7 fabric interfaces and not the management session on one, link speed, an active "
              "firewall")
    changes = "nothing (read-only); a problem stops the run on that node before anything changes"

    def check(self, ctx: NodeContext) -> list[Change[None]]:
        facts = ctx.facts(refresh=True)
        inv = ctx.inventory
        user = ctx.user
        problems: list[str] = []
        if facts.user != user:
            problems.append(f"logged in as {facts.user!r}, the inventory says user {user!r}")
        if not facts.sudo_nopasswd and not ctx.options.become_password:
            problems.append(f"sudo needs a password for {facts.user} (rerun with --ask-become-pass, or allow "
                            f"passwordless sudo: '{facts.user} ALL=(ALL) NOPASSWD: ALL' in /etc/sudoers.d/)")
        if not facts.is_dgx_spark:
            ctx.warn(f"not recognised as a DGX Spark (/etc/dgx-release: {facts.dgx_name or 'absent'}); "
                     "going on", task=self.name)
        if not facts.docker_cli:
            problems.append("docker is not installed (DGX OS ships it; install docker and the NVIDIA runtime)")
        elif not facts.docker_access and facts.docker_denied:
            problems.append(f"{facts.user} cannot run docker ({facts.docker_error}): sudo usermod -aG docker "
                            f"{facts.user}, then log in again")
        elif not facts.docker_access:
            problems.append(f"docker does not work for {facts.user} on {ctx.name}: {facts.docker_error or 'no answer'} "
                            "(see `docker info` on the node)")
        problems += _fabric_problems(ctx, facts)
        problems += _clock_problems(facts)
        if facts.firewall:
            ports = f"22, {inv.container.ssh_port} (container ssh), {inv.serve.port} (serve)"
            ctx.warn(f"a firewall is active ({facts.firewall}); these TCP ports must be open between the "
                     f"nodes: {ports}, and NCCL's ports on the fabric", task=self.name)
        if problems:
            raise TaskFailed(f"{len(problems)} preflight problem(s) on {ctx.name}", details=problems)
        return []


def _clock_problems(facts: Facts) -> list[str]:
    offset = facts.clock_offset()
    if offset is None or not set_wrong(facts) or facts.controller_time is None:
        return []
    shown = facts.time - sum(facts.controller_time) / 2  # the middle of the round trip: what a person expects
    node_time = datetime.fromtimestamp(facts.time, timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
    return [f"its clock is {_span(abs(shown))} {'ahead of' if offset > 0 else 'behind'} this controller's "
            f"(the node says {node_time}): TLS downloads (docker pull, the Hub) fail on a clock that far off; "
            "set it (sudo timedatectl set-ntp true, or sudo date -s ...); if every node says the same, this "
            "controller's clock is the wrong one"]


def _span(seconds: float) -> str:
    """Two units at most, the smaller one rounded: 3 d, 2 d 5 h, 4 h 10 min, 7 min."""
    minutes = round(seconds / 60)
    if minutes < 60:
        return f"{minutes} min"
    hours = round(seconds / 3600)
    if hours < 24:
        return f"{minutes // 60} h {minutes % 60} min" if minutes % 60 else f"{minutes // 60} h"
    days, rest = divmod(hours, 24)
    return f"{days} d {rest} h" if rest else f"{days} d"


def _fabric_problems(ctx: NodeContext, facts: Facts) -> list[str]:
    """What this node alone shows: no fabric at all, the management session on a fabric twin, slow links. Why a
    planned twin is not Up is judged across the cable, by preflight.cluster."""
    inv = ctx.inventory
    if inv.topology == "single":
        return []
    pinned = ctx.node.fabric.interfaces
    ports = facts.ports()
    if not pinned and not ports:
        return ["no CX-7 fabric interface found (ibdev2netdev / /sys/class/infiniband show none)"]
    if pinned:
        used = list(pinned)
    else:
        wanted = [0, 1] if inv.topology == "ring" else ([inv.fabric.port] if inv.fabric.port in (0, 1) else [])
        used = [t for p in (wanted or facts.up_ports()) for t in ports.get(p, [])]
    for twin in used:
        found = facts.interfaces.get(twin)
        speed = found.speed_mbps if found is not None else None
        if speed and speed < PORT_SPEED_MBPS and facts.interface_up(twin):
            ctx.warn(f"{twin} links at {speed // 1000} Gb/s, below 200 Gb/s (a switch may have negotiated "
                     "100G; check the cable and the switch port)", task=NodePreflight.name)
    mgmt = management_names(facts)
    if set(used) & set(facts.management_interfaces):
        return [f"the management session runs over {', '.join(sorted(set(used) & mgmt))}: sparkctl never "
                "reconfigures that interface; reach the node by its management port (enP7s7)"]
    return []


class ClusterPreflight(Task[ClusterContext, None]):
    name = "preflight.cluster"
    phase = "preflight"
    scope = Scope.CLUSTER
    needs = ("preflight.node",)
    description = ("check that the nodes fit together: one user, clocks in step, every planned fabric twin Up or "
                   "repairable, cabling that fits the topology")
    checks = ("the same username on every node, clock skew (warn over 2 s off this machine's clock), each node's "
              "cabled port vs its peers', why each planned twin that is not Up is not, across the cable: set down "
              "on this node (a warning: network.netplan brings it Up), no carrier because the far end is set down "
              "(said under that end), no carrier with both ends up (the cable or the port), the cable in another "
              "port, no such interface (these stop the run); and, where LLDP tells (lldpd on either end of a "
              "cable), who is at the far end of each QSFP port vs the inventory's topology and ring order")
    changes = "nothing (read-only)"
    needs_every_node = False  # judged on the facts read of each node; a node lost mid-run on what was last read

    def check(self, ctx: ClusterContext) -> list[Change[None]]:
        facts = ctx.facts_by_node()
        problems: list[str] = []
        users = {f.user for f in facts.values()}
        if len(users) > 1:
            problems.append("the username differs between nodes (" + ", ".join(
                f"{n}: {f.user}" for n, f in facts.items()) + "); NVIDIA's procedure needs one user everywhere")
        skew = clock_skew(facts)
        for node, offset in skew.offsets.items():
            ctx.warn(f"{node}'s clock is {offset:+.1f} s from {skew.against} (allowed ±{MAX_SKEW_S:g} s; enable NTP: "
                     "sudo timedatectl set-ntp true)", task=self.name)
        if ctx.inventory.topology != "single":
            problems += self._cabling(ctx, facts)
        if problems:
            raise TaskFailed(f"{len(problems)} preflight problem(s) across the cluster", details=problems)
        return []

    def _cabling(self, ctx: ClusterContext, facts: dict[str, Facts]) -> list[str]:
        """Each planned twin that is not Up, by its cause across the cable. Only what no later task repairs stops
        the run; a twin set down is brought Up by network.netplan, its far end's lost carrier said under it."""
        try:
            plan = ctx.plan()
        except TaskFailed as exc:
            return [exc.message + (f" ({exc.hint})" if exc.hint else "")]
        if ctx.inventory.topology in ("pair", "switch"):
            used = {n: plan.fabric.ports[n].ports for n in facts}
            if len({p for p in used.values()}) > 1:
                ctx.warn("the nodes use different QSFP ports (" + ", ".join(
                    f"{n}: port {'/'.join(str(x) for x in p)}" for n, p in used.items())
                    + "); accepted: every per-node setting uses that node's own interface names",
                    task=self.name)
        problems = []
        ring = ctx.inventory.topology == "ring"
        cabling = cabling_map(ctx.inventory, facts)
        # a cable LLDP places on another port than planned: its row names the far end, the twins' fault says less
        wrong_port = {(row.node, row.port) for row in cabling.problems}
        for fault in twin_faults(ctx.inventory, plan.fabric, facts):
            if fault.repairable:
                ctx.warn(fault.sentence(), task=self.name, node=fault.node, details=list(fault.consequences))
                continue
            if fault.cause == WRONG_PORT and any((fault.node, p) in wrong_port for p in fault.cabled_ports):
                continue
            also = f" ({'; '.join(fault.consequences)})" if fault.consequences else ""
            hint = " (a ring cables port 0 to the next node's port 1)" if ring and fault.cause != ABSENT else ""
            problems.append(f"{fault.sentence()}{also}; {fault.fix()}{hint}")
        problems += [row.problem for row in cabling.problems]
        if cabling.problems and ring:
            problems.append("cable the ring as the inventory orders it, or reorder `nodes:` to the cabling "
                            "(`sparkctl inventory init` writes the order LLDP sees)")
        return problems
