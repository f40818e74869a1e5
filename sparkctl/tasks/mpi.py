"""mpi.hostfile: the Open MPI hostfile in every container, proven by `mpirun hostname` from the head."""

from __future__ import annotations

import posixpath
import re

from sparkctl.engine.task import Change, Scope, Task, TaskFailed
from sparkctl.plan.container import HOSTFILE_PATH
from sparkctl.tasks.container_ssh import node_state_dir
from sparkctl.tasks.netplan_files import unified_diff
from sparkctl.transport.base import q

MPIRUN_TIMEOUT = 60.0
_TAGGED = re.compile(r"^\[\d+,(?P<rank>\d+)\]<stdout>:(?P<text>.*)$")


def mpirun_line(ranks: int, program: str) -> str:
    """mpirun from the head container, one rank per node in hostfile order.

    Open MPI's ssh launcher copies the head's OMPI_MCA_* environment onto every remote daemon's command
    line; with that off, each daemon keeps its OWN node's interface settings (from its sshd SetEnv).
    """
    return (f"mpirun -np {int(ranks)} --hostfile {HOSTFILE_PATH} --map-by ppr:1:node --tag-output "
            f"--mca plm_rsh_pass_environ_mca_params 0 {program}")


def tagged_output(stdout: str) -> dict[int, list[str]]:
    """`--tag-output` lines by rank (mpirun interleaves ranks' output in any order)."""
    out: dict[int, list[str]] = {}
    for line in stdout.splitlines():
        m = _TAGGED.match(line)
        if m:
            out.setdefault(int(m["rank"]), []).append(m["text"])
    return out


class HostfileTask(Task):
    name = "mpi.hostfile"
    phase = "mpi"
    scope = Scope.CLUSTER
    needs = ("container.ssh",)
    description = "put the Open MPI hostfile in every container and prove mpirun reaches every node"
    checks = (f"{HOSTFILE_PATH} in every container (and run/openmpi-hostfile on every node) is the planned one: "
              "head first, then inventory order, one fabric address per line; then `mpirun -np N hostname` "
              "from the head container returns every node's hostname in order")
    changes = "writes the hostfile on the node and into each container (docker exec, atomic rename)"

    def check(self, ctx) -> list[Change]:
        want = ctx.plan().hostfile
        container = ctx.inventory.container.name
        scripts = {n: (f"cat {q(self._host_path(ctx, n))} 2>/dev/null; echo @@sparkctl-container@@; "
                       f"docker exec {q(container)} cat {HOSTFILE_PATH} 2>/dev/null || true")
                   for n in ctx.nodes}
        changes = []
        for node, result in ctx.run_on_all(scripts, timeout=30).items():
            on_host, _, inside = result.stdout.partition("@@sparkctl-container@@\n")
            for where, have in (("node", on_host), ("container", inside)):
                if have.strip() != want.strip():
                    label = f"{node}: {HOSTFILE_PATH} in the container" if where == "container" else \
                        f"{node}: {self._host_path(ctx, node)}"
                    changes.append(Change(f"update {label}", diff=unified_diff(label, have or None, want),
                                          payload=(node, where)))
        if changes:
            return changes
        self._verify(ctx)
        return []

    @staticmethod
    def _host_path(ctx, node: str) -> str:
        return posixpath.join(node_state_dir(ctx.nodes[node]), "run", "openmpi-hostfile")

    def apply(self, ctx, changes) -> None:
        want = ctx.plan().hostfile
        container = ctx.inventory.container.name
        for node, where in (c.payload for c in changes):
            nctx = ctx.nodes[node]
            if where == "node":
                nctx.transport.put(self._host_path(ctx, node), want, mode=0o644)
                continue
            tmp = HOSTFILE_PATH + ".sparkctl"
            result = nctx.transport.exec_in(container, f"cat > {tmp} && chmod 644 {tmp} && mv -f {tmp} "
                                            f"{HOSTFILE_PATH}", input=want, timeout=30)
            if not result.ok:
                raise TaskFailed(f"writing {HOSTFILE_PATH} in {container} on {node} failed",
                                 details=(result.stderr or result.stdout).strip().splitlines()[-3:])

    def _verify(self, ctx) -> None:
        inv = ctx.inventory
        head = inv.head.name
        if head not in ctx.nodes:
            return
        expected = [ctx.nodes[n.name].facts().hostname for n in inv.nodes]
        result = ctx.nodes[head].transport.exec_in(inv.container.name, mpirun_line(len(inv.nodes), "hostname"),
                                                   timeout=MPIRUN_TIMEOUT)
        got = [lines[0] if lines else "" for _, lines in sorted(tagged_output(result.stdout).items())]
        if result.ok and got == expected:
            return
        tail = (result.stderr or result.stdout).strip().splitlines()[-4:]
        raise TaskFailed(
            f"mpirun -np {len(expected)} hostname from the head container returned {got or 'nothing'}, "
            f"expected {expected}",
            hint="`Connection refused`: a peer's container sshd is not up; a hang: the hostfile addresses are "
                 "not on the interfaces in OMPI_MCA_btl_tcp_if_include (see verify.fabric)",
            details=tail)
TASKS = [HostfileTask()]
