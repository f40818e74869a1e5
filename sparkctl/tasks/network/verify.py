"""network.verify: every link proven by a don't-fragment ping at MTU-28 bytes, an MTU problem told from a dead
link."""

from __future__ import annotations

from sparkctl.engine.task import Change, Scope, Task, TaskFailed
from sparkctl.rules.mesh import link_pings, parse_pings, ping_script
from sparkctl.tasks.context import ClusterContext
from sparkctl.tasks.network.netplan import NetplanTask


class NetworkVerify(Task):
    name = "network.verify"
    phase = "network"
    scope = Scope.CLUSTER
    needs = ("network.netplan", "network.forwarding")
    description = "ping every peer on every twin with don't-fragment at MTU-28 bytes"
    checks = ("from each node (all at once, each node's pings in parallel), a don't-fragment ping of MTU-28 bytes "
              "to every peer address on the same twin subnet and, in a ring, to every address its routes lead to "
              "(relayed by the nodes in between), tried twice; on failure, a small ping tells an MTU problem from a "
              "dead link")
    changes = "nothing (read-only)"

    def check(self, ctx: ClusterContext) -> list[Change]:
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
        order = list(ctx.nodes)
        scripts = {name: ping_script(link_pings(plan.fabric, order, name, plan.nodes[name].routes), size)
                   for name in order}
        failures = []
        results = ctx.run_on_all({n: s for n, s in scripts.items() if s}, timeout=60)
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
            raise TaskFailed(f"{len(failures)} fabric link check(s) failed", details=failures)
        return []
