"""What mpi.hostfile reads on every node, as framed shell: container.ssh's round trip carries it along (one
round trip and one docker exec per node saved) and hands the answers over."""

from __future__ import annotations

import posixpath

from sparkctl.plan.mpi import mpirun_line, mpirun_timeout, timed
from sparkctl.plan.paths import HOSTFILE_PATH
from sparkctl.tasks.context import ClusterContext, HandOver, NodeContext
from sparkctl.tasks.proof import proven
from sparkctl.transport.base import q, text_of
from sparkctl.transport.framing import Framing, Section

#: The task the reads are handed over to (ClusterContext.hand_over).
HOSTFILE_TASK = "mpi.hostfile"
#: every node's hostfile reads (framed sections), carried by container.ssh's round trip
HOSTFILE_READS: HandOver[dict[str, dict[str, Section]]] = HandOver(HOSTFILE_TASK)


def host_hostfile_path(ctx: NodeContext) -> str:
    """The hostfile kept on the node, next to what the container mounts."""
    return posixpath.join(ctx.state_dir(), "run", "openmpi-hostfile")


def runs_mpirun(ctx: ClusterContext, node: str) -> bool:
    """Whether `node`'s hostfile read runs `mpirun hostname`: on the head, while no MPI proof on record holds."""
    return node == ctx.inventory.head.name and proven(ctx) is None


def hostfile_reads(ctx: ClusterContext, framing: Framing, only: str | None = None,
                   mpirun: bool = True) -> dict[str, tuple[str, str]]:
    """Per node, (shell on the node, shell in the container): sections `node-hostfile`, `container-hostfile`
    and, on the head, `mpirun` (`mpirun hostname`, its exit status as the section's), run only when the head's
    hostfile already is the planned one (it proves nothing otherwise and could hang on an address not ours) and
    no MPI proof on record still holds (tasks/proof.py); `mpirun=False`: never (the read as it will be once a
    proof is on record)."""
    want = ctx.plan().hostfile
    out = {}
    for n, node in ctx.nodes.items():
        if only is not None and n != only:
            continue
        inside = framing.section("container-hostfile", f"cat {HOSTFILE_PATH} 2>/dev/null")
        if mpirun and runs_mpirun(ctx, n):
            ranks = len(ctx.inventory.nodes)
            line = timed(mpirun_line(ranks, "hostname"), mpirun_timeout(ranks))
            inside += (f"\nif [ \"$(cat {HOSTFILE_PATH} 2>/dev/null)\" = {q(want.rstrip(chr(10)))} ]; then\n"
                       + framing.section("mpirun", f"{line} 2>&1") + "\nfi")
        out[n] = (framing.section("node-hostfile", text_of(q(host_hostfile_path(node)))), inside)
    return out
