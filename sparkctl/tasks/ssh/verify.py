"""ssh.verify: passwordless ssh from every node to every other, proven with BatchMode."""

from __future__ import annotations

from sparkctl.engine.task import Change, Scope, Task, TaskFailed
from sparkctl.plan.ssh import peer_route
from sparkctl.tasks.context import ClusterContext
from sparkctl.transport.base import q


class SshVerify(Task):
    name = "ssh.verify"
    phase = "ssh"
    scope = Scope.CLUSTER
    needs = ("ssh.mesh",)
    description = "prove passwordless ssh from every node to every other over the fabric"
    checks = "`ssh -o BatchMode=yes <peer fabric ip> true` from every node to every other node"
    changes = "nothing (read-only)"
    read_only = True

    def check(self, ctx: ClusterContext) -> list[Change]:
        plan = ctx.plan()
        scripts = {}
        names = list(ctx.nodes)
        for index, node in enumerate(names):
            lines = []
            # each node starts with the next one: all starting with the first node would put N-1 handshakes on
            # one sshd at once, past its MaxStartups (10), which then resets connections at random
            for peer in names[index + 1:] + names[:index]:
                target, options = peer_route(ctx.inventory, plan.fabric, node, peer)
                options = f"{options} " if options else ""
                # stderr captured in a variable: a read-only check leaves no file behind
                lines.append(f"if err=$(ssh -o BatchMode=yes -o ConnectTimeout=5 {options}{q(target)} true "
                             f"</dev/null 2>&1 >/dev/null); then echo {q('ok ' + peer + ' ' + target)}; "
                             f"else echo {q('fail ' + peer + ' ' + target)} \"$(printf '%s' \"$err\" | tail -n1)\";"
                             " fi")
            scripts[node] = "\n".join(lines)
        failures = []
        for node, result in ctx.run_on_all({n: s for n, s in scripts.items() if s}, timeout=60).items():
            for line in result.stdout.splitlines():
                if line.startswith("fail "):
                    _, peer, target, *err = line.split(" ")
                    failures.append(f"{node} -> {peer} ({target}): {' '.join(err) or 'failed'}")
        if failures:
            raise TaskFailed(f"{len(failures)} node-to-node ssh connection(s) failed", details=failures)
        return []
