"""mpi.hostfile: the Open MPI hostfile in every container, proven by `mpirun hostname` from the head."""

from __future__ import annotations

import functools
import re

from sparkctl.plan.mpi import mpirun_line, mpirun_timeout
from sparkctl.plan.paths import HOSTFILE_PATH
from sparkctl.rules.mesh import failure_causes
from sparkctl.rules.serving import without_mpi
from sparkctl.taskgraph.diff import unified_diff
from sparkctl.taskgraph.events import Event
from sparkctl.taskgraph.task import Change, Scope, Task, TaskFailed
from sparkctl.tasks.context import ClusterContext
from sparkctl.tasks.mpi.reads import HOSTFILE_READS, HOSTFILE_TASK, host_hostfile_path, hostfile_reads
from sparkctl.tasks.proof import proven, since
from sparkctl.transport.base import q
from sparkctl.transport.framing import Framing, Section

_TAGGED = re.compile(r"^\[\d+,(?P<rank>\d+)\]<stdout>:(?P<text>.*)$")


#: coreutils `timeout`'s exit status when it stopped the command (plan.mpi.timed)
TIMEOUT_EXIT = 124

#: what each cause of a failed `mpirun hostname` asks for (rules.mesh.failure_causes on mpirun's ssh's words)
_MPIRUN_FIXES = {
    "refused": "`Connection refused`: a peer's container sshd is not up (container.ssh waits for it)",
    "denied": "a peer's container refused the head's key: rerun bootstrap (container.ssh writes authorized_keys)",
    "host_key": "a container's host key differs from the pinned one: rerun bootstrap (container.ssh pins them)",
    "no_route": "no route to a hostfile address: see verify.fabric (links, addresses, routes)",
}


def mpirun_hint(output: str, *, hung: bool, answered: bool) -> str | None:
    """The hint for the failure mpirun's own words (or its hang) show; None when nothing here explains it."""
    causes = failure_causes([ln for ln in output.splitlines() if ln.strip()])
    hints = [fix for cause, fix in _MPIRUN_FIXES.items() if cause in causes]
    if hung or "timeout" in causes:
        hints.append("a hang: the hostfile addresses are not on the interfaces in OMPI_MCA_btl_tcp_if_include "
                     "(see verify.fabric)")
    if answered and not hints:
        hints.append("every rank answered, with other names or in another order: the hostfile's order is the "
                     "inventory's and each container's hostname its node's")
    return "; ".join(hints) or None


def tagged_output(stdout: str) -> dict[int, list[str]]:
    """`--tag-output` lines by rank (mpirun interleaves ranks' output in any order)."""
    out: dict[int, list[str]] = {}
    for line in stdout.splitlines():
        m = _TAGGED.match(line)
        if m:
            out.setdefault(int(m["rank"]), []).append(m["text"])
    return out


class HostfileTask(Task[ClusterContext, tuple[str, str]]):
    name = HOSTFILE_TASK
    phase = "mpi"
    scope = Scope.CLUSTER
    needs = ("container.ssh",)
    description = "put the Open MPI hostfile in every container and prove mpirun reaches every node"
    checks = (f"{HOSTFILE_PATH} in every container (and run/openmpi-hostfile on every node) is the planned one: "
              "head first, then inventory order, one fabric address per line; then `mpirun -np N hostname` "
              "from the head container returns every node's hostname in order (not run again when the MPI probe "
              "on record still holds: see verify.fabric)")
    changes = "writes the hostfile on the node and into each container (docker exec, atomic rename)"

    def not_applicable(self, ctx: ClusterContext) -> str | None:
        why = without_mpi(ctx.inventory)
        return f"{why}: no Open MPI hostfile" if why else None

    def check(self, ctx: ClusterContext) -> list[Change[tuple[str, str]]]:
        want = ctx.plan().hostfile
        head = ctx.inventory.head.name
        # container.ssh's round trip usually carried these reads already (hostfile_reads)
        sections = ctx.take_over(HOSTFILE_READS)
        if sections is None or set(sections) != set(ctx.nodes):
            container = ctx.inventory.container.name
            framing = Framing()
            scripts = {n: f"{on_node}\ndocker exec {q(container)} sh -c {q(inside)} 2>/dev/null || true"
                       for n, (on_node, inside) in hostfile_reads(ctx, framing).items()}
            timeout = mpirun_timeout(len(ctx.inventory.nodes)) + 30
            sections = {n: framing.split(r.stdout) for n, r in ctx.run_on_all(scripts, timeout=timeout).items()}
        changes, mpirun = [], None
        for node, found in sections.items():
            if node == head:
                mpirun = found.get("mpirun")
            for where in ("node", "container"):
                section = found.get(f"{where}-hostfile")
                have = section.output if section is not None else ""
                if have.strip() != want.strip():
                    label = f"{node}: {HOSTFILE_PATH} in the container" if where == "container" else \
                        f"{node}: {host_hostfile_path(ctx.nodes[node])}"
                    changes.append(Change(f"update {label}", diff=unified_diff(label, have or None, want),
                                          payload=(node, where), node=node))
        if changes:
            return changes
        self._verify(ctx, mpirun)
        return []

    def apply(self, ctx: ClusterContext, changes: list[Change[tuple[str, str]]]) -> None:
        want = ctx.plan().hostfile
        container = ctx.inventory.container.name
        by_node: dict[str, list[str]] = {}
        for node, where in (c.carried() for c in changes):
            by_node.setdefault(node, []).append(where)

        def write(node: str) -> None:
            nctx = ctx.nodes[node]
            for where in by_node[node]:
                if where == "node":
                    nctx.transport.put(host_hostfile_path(nctx), want, mode=0o644)
                    continue
                tmp = HOSTFILE_PATH + ".sparkctl"
                result = nctx.transport.exec_in(container, f"cat > {tmp} && chmod 644 {tmp} && mv -f {tmp} "
                                                f"{HOSTFILE_PATH}", input=want, timeout=30)
                if not result.ok:
                    raise TaskFailed(f"writing {HOSTFILE_PATH} in {container} on {node} failed",
                                     details=(result.stderr or result.stdout).strip().splitlines()[-3:])

        # every node's at once: each node's own in order
        ctx.each_node({node: functools.partial(write, node) for node in by_node})

    def _verify(self, ctx: ClusterContext, mpirun: Section | None = None) -> None:
        """`mpirun hostname` from the head returns every node's hostname in rank order. mpirun: what check()
        already got from the head; None runs mpirun here."""
        inv = ctx.inventory
        head = inv.head.name
        if head not in ctx.nodes:
            return
        expected = [ctx.nodes[n.name].facts().hostname for n in inv.nodes]
        record = proven(ctx)
        if record is not None:
            ctx.emit(Event(event="log", task=self.name, message=(
                f"mpirun hostname not run: the MPI probe of {since(record)} proved every rank in order and "
                "nothing it depends on changed since")))
            return
        if mpirun is None or mpirun.rc is None:
            result = ctx.nodes[head].transport.exec_in(inv.container.name, mpirun_line(len(inv.nodes), "hostname"),
                                                       timeout=mpirun_timeout(len(inv.nodes)))
            ok, stdout, stderr = result.ok, result.stdout, result.stderr
            hung = result.timed_out or result.exit_code == TIMEOUT_EXIT
        else:
            ok, stdout = mpirun.ok, mpirun.output
            stderr = "\n".join(ln for ln in stdout.splitlines() if not _TAGGED.match(ln))
            hung = mpirun.rc == TIMEOUT_EXIT
        got = [lines[0] if lines else "" for _, lines in sorted(tagged_output(stdout).items())]
        if ok and got == expected:
            return
        tail = (stderr or stdout).strip().splitlines()[-4:]
        raise TaskFailed(
            f"mpirun -np {len(expected)} hostname from the head container returned {got or 'nothing'}, "
            f"expected {expected}",
            hint=mpirun_hint(stderr or stdout, hung=hung, answered=ok and bool(got)), details=tail)

