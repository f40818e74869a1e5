"""What verify.fabric reads on every node, as framed shell: besides its own round trip, container.ssh's carries it
along on a no-op run (one docker exec and one round trip per node saved) and hands the answers over."""

from __future__ import annotations

import posixpath

from sparkctl.knowledge.nccl import log_lines_script
from sparkctl.plan.paths import HOSTFILE_PATH
from sparkctl.plan.world import WorldNames
from sparkctl.rules.fabric import exposure_script, management_addresses
from sparkctl.tasks.context import HandOver, NodeContext
from sparkctl.transport.base import q
from sparkctl.transport.framing import Framing

#: The task the reads are handed over to (ClusterContext.hand_over).
VERIFY_TASK = "verify.fabric"
#: every node's answers (hostfile, NCCL lines, exposure), carried by container.ssh's round trip
VERIFY_READS: HandOver[dict[str, dict[str, str]]] = HandOver(VERIFY_TASK)
#: The section names, inside the container (hostfile) and on the node (the rest).
CONTAINER_HOSTFILE = "container-hostfile"


def container_reads(framing: Framing) -> str:
    """Shell for the container: its hostfile (mpi.hostfile's read is the same section)."""
    return framing.section(CONTAINER_HOSTFILE, f"cat {HOSTFILE_PATH} 2>/dev/null")


def node_reads(ctx: NodeContext, framing: Framing, *, exposure: bool = True) -> str:
    """Shell for the node: the serve log's NCCL lines, and (`exposure`) whether the container's sshd answers on
    the node's management address."""
    log = posixpath.join(ctx.state_dir(), WorldNames(ctx.inventory.cluster.name).log)
    sections = [framing.section("nccl", log_lines_script(q(log), 4000))]
    if exposure:
        script = exposure_script(management_addresses(ctx.facts()), ctx.inventory.container.ssh_port)
        sections.append(framing.section("exposure", script))
    return "\n".join(sections)


def answers(found: dict[str, str]) -> dict[str, str]:
    return {"hostfile": found.get(CONTAINER_HOSTFILE, ""), "nccl": found.get("nccl", ""),
            "exposure": found.get("exposure", "")}
