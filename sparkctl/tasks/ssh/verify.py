"""ssh.verify: passwordless ssh from every node to every other, proven with BatchMode, every ordered pair."""

from __future__ import annotations

from sparkctl.engine.task import Change, Scope, Task
from sparkctl.rules.mesh import fitting_fixes, host_tries, mesh_script, mesh_timeout
from sparkctl.tasks.context import ClusterContext
from sparkctl.tasks.mesh import collect, run_mesh
from sparkctl.tasks.ssh.mesh import MESH_VERDICTS


class SshVerify(Task[ClusterContext, None]):
    name = "ssh.verify"
    phase = "ssh"
    scope = Scope.CLUSTER
    needs = ("ssh.mesh",)
    description = "prove passwordless ssh from every node to every other over the fabric"
    checks = ("`ssh -N -o BatchMode=yes <peer fabric ip>`, ended once the peer accepted the key (host key "
              "pinned, no session opened), from every node to every other node (every ordered "
              "pair, each node its own in one round trip, all nodes at once, a few tries in flight per node so "
              "no sshd sees more than its MaxStartups); a handshake an overloaded sshd reset is retried, and "
              "reported as not checked, never as a broken pair")
    changes = "nothing (read-only)"
    read_only = True

    def check(self, ctx: ClusterContext) -> list[Change[None]]:
        plan = ctx.plan()
        names = list(ctx.nodes)
        tries = {node: host_tries(ctx.inventory, plan.fabric, names, node) for node in names}
        # ssh.keys' round trip already tried each node's pairs: believed when every pair is ok and nothing
        # changed since; anything else is tried again here, and this answer counts
        handed = {node: ctx.take_over(MESH_VERDICTS.at(node)) for node in tries}
        ready: dict[str, str] = {node: text for node, text in handed.items() if text is not None}
        if len(ready) == len(handed):
            verdicts = collect({n: (text, "") for n, text in ready.items()}, {n: t for n, t in tries.items() if t})
            if all(v.state == "ok" for v in verdicts):
                return []
        scripts = {n: mesh_script(t) for n, t in tries.items() if t}
        timeout = mesh_timeout(max((len(t) for t in tries.values()), default=0))
        run_mesh(ctx, scripts, tries, timeout=timeout, what="node-to-node ssh connection",
                 hint=host_mesh_hint)
        return []


#: what each cause of a broken node-to-node pair asks for (rules.mesh.failure_causes)
_HOST_FIXES = {
    "denied": "a key was refused: rerun bootstrap to repair the keys (ssh.keys)",
    "host_key": "a pinned host key differs from the peer's: rerun bootstrap to repin them (ssh.known_hosts)",
    "refused": "the peer's sshd does not listen on that address: is ssh.service running there?",
    "timeout": "no answer from the peer's fabric address: see verify.fabric (link up, addresses, routes)",
    "no_route": "no route to the peer's fabric address: see verify.fabric (link up, addresses, routes)",
}


def host_mesh_hint(errors: list[str]) -> str:
    return "; ".join([*fitting_fixes(errors, _HOST_FIXES), "ssh -v from the node to the peer shows why"])
