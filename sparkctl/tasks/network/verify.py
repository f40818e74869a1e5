"""network.verify: every link proven by a don't-fragment ping at MTU-28 bytes, an MTU problem told from a dead
link. A twin that is not Up is explained by its cause across the cable (rules/twins.py), once, with what it causes
under it; the pings of its link are not reported again."""

from __future__ import annotations

import time
from ipaddress import IPv4Interface

from sparkctl.facts import Facts
from sparkctl.plan import ClusterPlan
from sparkctl.rules.mesh import link_pings, parse_pings, ping_script
from sparkctl.rules.twins import twin_faults
from sparkctl.taskgraph.task import Change, Scope, Task, TaskFailed
from sparkctl.tasks.context import ClusterContext

#: how long the fabric twins may take to be Up with their addresses (a CX-7 link trains for a few seconds)
WAIT_FOR_TWINS_S = 20.0


class NetworkVerify(Task[ClusterContext, None]):
    name = "network.verify"
    phase = "network"
    scope = Scope.CLUSTER
    needs = ("network.netplan", "network.forwarding")
    description = "ping every peer on every twin with don't-fragment at MTU-28 bytes"
    checks = ("from each node (all at once, each node's pings in parallel), a don't-fragment ping of MTU-28 bytes "
              "to every peer address on the same twin subnet and, in a ring, to every address its routes lead to "
              "(relayed by the nodes in between), tried twice; on failure, a small ping tells an MTU problem from a "
              "dead link; on a rerun the pings run beside the node's facts (they count only if nothing changed since)")
    changes = "nothing (read-only)"
    read_only = True

    def check(self, ctx: ClusterContext) -> list[Change[None]]:
        if ctx.inventory.topology == "single":
            return []
        plan = _wait_for_twins(ctx)
        faults = twin_faults(ctx.inventory, plan.fabric, ctx.facts_by_node())
        failures = [f"{fault.sentence()}: {fault.fix()}" for fault in faults]
        # a link with an end that is not Up is explained by that end's fault: its ping failing says nothing more
        explained = {(f.node, i) for f in faults for i in f.interfaces} | {e for f in faults for e in f.far_ends}
        explained |= {(n, i) for n, f in ctx.facts_by_node().items() for i in plan.fabric.ports[n].interfaces
                      if not f.interface_up(i)}
        details = {i: list(f.consequences) for i, f in enumerate(faults)}
        size = ctx.inventory.fabric.mtu - 28
        order = list(ctx.nodes)
        # an address whose interface is explained is not pinged either (a ring's relayed routes lead to it too)
        owner = {str(a.ip): (peer, iface) for peer, addrs in plan.fabric.addresses.items()
                 for iface, a in addrs.items()}
        scripts = {name: ping_script([p for p in link_pings(plan.fabric, order, name, plan.nodes[name].routes)
                                      if (name, p.interface) not in explained
                                      and owner.get(p.address) not in explained], size)
                   for name in order}
        results = ctx.read_on_all(self.name, {n: s for n, s in scripts.items() if s}, timeout=60)
        for name, result in results.items():
            for verdict, iface, peer, address in parse_pings(result.stdout):
                tag = f"{iface}>{peer}:{address}"
                if verdict == "mtu":
                    failures.append(f"{name} {tag}: jumbo ping ({size} bytes, don't fragment) fails but a small "
                                    "one passes: MTU mismatch on the peer or a switch port (set MTU 9000 on both "
                                    "ends; 9216 on switch ports)")
                elif verdict == "dead":
                    failures.append(f"{name} {tag}: no answer (cable, port, or the peer's address)")
            if result.timed_out:
                failures.append(f"{name}: the pings did not finish within 60s (not checked)")
        if failures:
            lines = [line for i, failure in enumerate(failures) for line in [failure, *(
                f"  because of it: {c}" for c in details.get(i, []))]]
            raise TaskFailed(f"{len(failures)} fabric link check(s) failed", details=lines)
        return []


def _wait_for_twins(ctx: ClusterContext) -> ClusterPlan:
    """The plan, once every planned twin is Up with its planned address: a twin brought Up (here or at the far
    end) gets carrier and then its address a moment later. Reads facts again only while something is missing."""
    deadline = time.monotonic() + WAIT_FOR_TWINS_S
    while True:
        plan = ctx.plan()
        facts = ctx.facts_by_node()
        waiting = [name for name, f in facts.items() for iface in plan.fabric.ports[name].interfaces
                   if not f.interface_up(iface) or not _has(f, iface, plan.fabric.addresses[name].get(iface))]
        if not waiting or time.monotonic() > deadline:
            return plan
        for name in set(waiting):
            ctx.nodes[name].invalidate()
        time.sleep(0.5)


def _has(facts: Facts, iface: str, address: IPv4Interface | None) -> bool:
    return address is None or str(address) in {str(a) for a in facts.addresses_of(iface)}
