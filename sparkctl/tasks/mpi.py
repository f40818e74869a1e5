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
CONTAINER_MARKER = "@@sparkctl-container@@"
MPIRUN_MARKER = "@@sparkctl-mpirun@@"
_TAGGED = re.compile(r"^\[\d+,(?P<rank>\d+)\]<stdout>:(?P<text>.*)$")


def timed(command: str, seconds: float = MPIRUN_TIMEOUT) -> str:
    """The command under coreutils `timeout` where the image has it: a hung mpirun must not hold the round trip
    that also carries other reads."""
    return (f"if command -v timeout >/dev/null 2>&1; then timeout {int(seconds)} {command}; "
            f"else {command}; fi")


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


def hostfile_reads(ctx) -> dict[str, tuple[str, str]]:
    """Per node, (shell on the node, shell in the container) whose outputs, joined by CONTAINER_MARKER, are
    what HostfileTask.check reads: the hostfile on the node, the one in the container and, on the head,
    `mpirun hostname`, but only when the head's hostfile already is the planned one (it proves nothing
    otherwise and could hang on an address that is not ours)."""
    want = ctx.plan().hostfile
    head = ctx.inventory.head.name
    out = {}
    for n in ctx.nodes:
        inside = f"cat {HOSTFILE_PATH} 2>/dev/null"
        if n == head:
            mpirun = timed(mpirun_line(len(ctx.inventory.nodes), "hostname"))
            inside += (f"; echo {MPIRUN_MARKER}; if [ \"$(cat {HOSTFILE_PATH} 2>/dev/null)\" = "
                       f"{q(want.rstrip(chr(10)))} ]; then {mpirun} 2>&1; echo \"{MPIRUN_MARKER} $?\"; fi")
        out[n] = (f"cat {q(HostfileTask._host_path(ctx, n))} 2>/dev/null", inside)
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
        head = ctx.inventory.head.name
        # container.ssh's round trip usually carried these reads already (hostfile_reads)
        outputs = ctx.take_over(self.name)
        if outputs is None or set(outputs) != set(ctx.nodes):
            container = ctx.inventory.container.name
            scripts = {n: f"{on_node}; echo {CONTAINER_MARKER}; docker exec {q(container)} sh -c {q(inside)} "
                          "2>/dev/null || true" for n, (on_node, inside) in hostfile_reads(ctx).items()}
            outputs = {n: r.stdout for n, r in ctx.run_on_all(scripts, timeout=MPIRUN_TIMEOUT + 30).items()}
        changes, mpirun_output = [], None
        for node, stdout in outputs.items():
            on_host, _, inside = stdout.partition(CONTAINER_MARKER + "\n")
            inside, _, mpirun = inside.partition(MPIRUN_MARKER + "\n")
            if node == head and mpirun:
                mpirun_output = mpirun
            for where, have in (("node", on_host), ("container", inside)):
                if have.strip() != want.strip():
                    label = f"{node}: {HOSTFILE_PATH} in the container" if where == "container" else \
                        f"{node}: {self._host_path(ctx, node)}"
                    changes.append(Change(f"update {label}", diff=unified_diff(label, have or None, want),
                                          payload=(node, where)))
        if changes:
            return changes
        self._verify(ctx, mpirun_output)
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

    def _verify(self, ctx, output: str | None = None) -> None:
        """`mpirun hostname` from the head returns every node's hostname in rank order. output: what check()
        already got from the head (ends with `MPIRUN_MARKER <exit code>`); None runs mpirun here."""
        inv = ctx.inventory
        head = inv.head.name
        if head not in ctx.nodes:
            return
        expected = [ctx.nodes[n.name].facts().hostname for n in inv.nodes]
        rc_line = re.search(rf"^{MPIRUN_MARKER} (\d+)$", output or "", re.M)
        if rc_line is None:
            result = ctx.nodes[head].transport.exec_in(inv.container.name, mpirun_line(len(inv.nodes), "hostname"),
                                                       timeout=MPIRUN_TIMEOUT)
            ok, stdout, stderr = result.ok, result.stdout, result.stderr
        else:
            ok, stdout = rc_line[1] == "0", output[:rc_line.start()]
            stderr = "\n".join(ln for ln in stdout.splitlines() if not _TAGGED.match(ln))
        got = [lines[0] if lines else "" for _, lines in sorted(tagged_output(stdout).items())]
        if ok and got == expected:
            return
        tail = (stderr or stdout).strip().splitlines()[-4:]
        raise TaskFailed(
            f"mpirun -np {len(expected)} hostname from the head container returned {got or 'nothing'}, "
            f"expected {expected}",
            hint="`Connection refused`: a peer's container sshd is not up; a hang: the hostfile addresses are "
                 "not on the interfaces in OMPI_MCA_btl_tcp_if_include (see verify.fabric)",
            details=tail)


TASKS = [HostfileTask()]
