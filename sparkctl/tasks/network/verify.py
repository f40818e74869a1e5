"""network.verify: every link proven by a don't-fragment ping at MTU-28 bytes, an MTU problem told from a dead
link."""

from __future__ import annotations

from sparkctl.engine.task import Change, Scope, Task, TaskFailed
from sparkctl.tasks.context import ClusterContext
from sparkctl.transport.base import q


class NetworkVerify(Task):
    name = "network.verify"
    phase = "network"
    scope = Scope.CLUSTER
    needs = ("network.netplan",)
    description = "ping every peer on every twin with don't-fragment at MTU-28 bytes"
    checks = ("from each node, a don't-fragment ping of MTU-28 bytes to every peer address on the same twin "
              "subnet; on failure, a small ping tells an MTU problem from a dead link")
    changes = "nothing (read-only)"
    read_only = True

    def check(self, ctx: ClusterContext) -> list[Change]:
        if ctx.inventory.topology == "single":
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
