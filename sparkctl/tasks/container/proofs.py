"""What one container-to-container ssh login depends on, for its proof on record (tasks/proof.py PairProofs).

A pair (a node's container -> a peer's container at a fabric address) is fingerprinted by: the exact try
(rules/mesh.py: address, container ssh port, the container's key and pinned host keys); the node's container key
(public half) and the known_hosts it pins (on the node, container-ssh/, and inside the container: content, inode
and mtime); the peer's
container host key, its authorized_keys (the same) and the entrypoint that starts its
sshd (plan/container.py: its configuration, addresses and port); both containers as docker shows them (id, image,
start time, restarts, status: a container recreated or restarted is proven again); and both nodes' fabric (tasks/
proof.py fabric_state). All of it is in container.state's read (container.ssh's files) and the node's facts.
"""

from __future__ import annotations

from typing import Any

from sparkctl import __version__
from sparkctl.rules.mesh import Try
from sparkctl.tasks.context import ClusterContext
from sparkctl.tasks.proof import digest, fabric_state, pair_id

#: the record's key for the container-to-container mesh (runs/proofs.py keeps it beside the MPI proof)
CONTAINER_MESH = "container-mesh"


def _container(ctx: ClusterContext, node: str) -> list[Any] | None:
    facts = ctx.nodes[node].facts() if node in ctx.nodes else None
    info = facts.containers.get(ctx.inventory.container.name) if facts is not None else None
    return None if info is None else [info.id, info.image_id, info.started_at, info.restart_count, info.status]


def container_fingerprints(ctx: ClusterContext, files: dict[str, dict[str, str]],
                           tries: dict[str, list[Try]]) -> dict[str, str]:
    """pair id -> fingerprint, for every try of every node whose files (container.ssh's read) are at hand. Each
    node's side is digested once, as a source and as a target; a pair's own work is one short digest."""
    entrypoint = digest(ctx.plan().entrypoint)
    state = {node: [_container(ctx, node), fabric_state(ctx, node)] for node in files}
    written = ("node-written", "in-written")
    as_source = {node: digest([found.get(k) for k in ("client", "node-known_hosts", "in-known_hosts", *written)],
                              state[node]) for node, found in files.items()}
    as_target = {node: digest([found.get(k) for k in ("host", "node-authorized_keys", "in-authorized_keys", *written)],
                              state[node]) for node, found in files.items()}
    out = {}
    for node, node_tries in tries.items():
        if node not in files:
            continue
        for attempt in node_tries:
            if attempt.peer in files:
                out[pair_id(node, attempt.peer, attempt.target)] = digest(
                    __version__, "container", attempt.argv, entrypoint, as_source[node], as_target[attempt.peer])
    return out
