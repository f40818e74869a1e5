"""ssh.verify: passwordless ssh from every node to every other, proven with BatchMode, every ordered pair."""

from __future__ import annotations

from sparkctl.rules.mesh import Try, Verdict, fitting_fixes, host_tries, mesh_script, mesh_timeout
from sparkctl.taskgraph.events import Event
from sparkctl.taskgraph.task import Change, Scope, Task, TaskFailed
from sparkctl.tasks.context import ClusterContext
from sparkctl.tasks.mesh import collect, raise_for
from sparkctl.tasks.proof import PairProofs, pair_id
from sparkctl.tasks.ssh.mesh import LOGIN_INPUTS, MESH_VERDICTS, read_ssh_files
from sparkctl.tasks.ssh.proofs import HOST_MESH, host_fingerprints
from sparkctl.tasks.ssh.refusals import REFUSAL_HINT, explain_refusals


class SshVerify(Task[ClusterContext, None]):
    name = "ssh.verify"
    phase = "ssh"
    scope = Scope.CLUSTER
    needs = ("ssh.mesh",)
    description = "prove passwordless ssh from every node to every other over the fabric"
    checks = ("`ssh -N -o BatchMode=yes <peer fabric ip>`, ended once the peer accepted the key (host key "
              "pinned, no session opened), from every node to every other node (every ordered pair, each node its "
              "own in one round trip, all nodes at once, a few tries in flight per node so no sshd sees more than "
              "its MaxStartups); a handshake an overloaded sshd reset is retried, and reported as not checked, "
              "never as a broken pair. A pair whose proof is on record is not tried again while nothing its login "
              "depends on changed (tasks/ssh/proofs.py; --reprove tries every pair)")
    changes = "nothing (read-only)"
    read_only = True

    def check(self, ctx: ClusterContext) -> list[Change[None]]:
        plan = ctx.plan()
        names = list(ctx.nodes)
        tries = {node: t for node in names if (t := host_tries(ctx.inventory, plan.fabric, names, node))}
        inputs = ctx.take_over(LOGIN_INPUTS)
        if inputs is None:  # something changed since ssh.mesh read them (it wrote the files): read them now
            inputs = read_ssh_files(ctx)
        fingerprints = host_fingerprints(ctx, inputs, tries)
        record = PairProofs(ctx.records, HOST_MESH, reprove=ctx.options.reprove)
        taken = record.proven(fingerprints)
        # ssh.keys' round trip tried the pairs of a node that had no proof on record: an ok there counts when
        # nothing changed since; anything else is tried again here, and this answer counts
        handed = {node: text for node in tries if (text := ctx.take_over(MESH_VERDICTS.at(node))) is not None}
        seen = collect({n: (t, "") for n, t in handed.items()}, {n: tries[n] for n in handed})
        # a pair that failed there is tried again whatever the record says: the record missed what broke it
        taken -= {pair_id(v.node, v.peer, v.target) for v in seen if v.state != "ok"}
        carried = {pair_id(v.node, v.peer, v.target) for v in seen if v.state == "ok"} - taken
        todo = {node: [t for t in node_tries if pair_id(node, t.peer, t.target) not in taken | carried]
                for node, node_tries in tries.items()}
        todo = {node: node_tries for node, node_tries in todo.items() if node_tries}
        verdicts = self._try(ctx, todo)
        passed = carried | {pair_id(v.node, v.peer, v.target) for v in verdicts if v.state == "ok"}
        record.keep(fingerprints, passed, taken)
        total = sum(len(t) for t in tries.values())
        ctx.emit(Event(event="log", task=self.name, message=(
            f"{len(taken)} of {total} pair(s) taken from the record (nothing their login depends on changed), "
            f"{len(carried)} proven in ssh.keys' read, {sum(len(t) for t in todo.values())} tried now")))
        try:
            raise_for(verdicts, "node-to-node ssh connection", host_mesh_hint)
        except TaskFailed as failed:
            settings = explain_refusals(ctx, verdicts)
            if not settings:
                raise
            raise TaskFailed(failed.message, hint=REFUSAL_HINT, details=[*failed.details, *settings]) from None
        return []

    def _try(self, ctx: ClusterContext, todo: dict[str, list[Try]]) -> list[Verdict]:
        if not todo:
            return []
        timeout = mesh_timeout(max(len(t) for t in todo.values()))
        results = ctx.run_on_all({node: mesh_script(t) for node, t in todo.items()}, timeout=timeout)
        outputs = {n: (r.stdout, f"the check timed out after {timeout:g}s" if r.timed_out else "")
                   for n, r in results.items()}
        return collect(outputs, todo)


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
