"""PURE: whether a cluster serves a model, and how the model reaches its nodes (tasks and doctor alike)."""

from __future__ import annotations

from sparkctl.facts import Facts
from sparkctl.inventory import Inventory
from sparkctl.knowledge.nccl import NcclReport


def serving_enabled(inventory: Inventory) -> bool:
    """Serving is set up only for an inventory with a `serve:` section (a bare cluster is a valid goal)."""
    return "serve" in inventory.model_fields_set


def without_mpi(inventory: Inventory) -> str | None:
    """Why this cluster needs no container sshd, ssh mesh, hostfile or mpirun (None: it does): an engine whose ranks
    meet over their own sockets serves (a bare cluster keeps the mesh: it is what `sparkctl nccl-tests` and a
    hand-run mpirun use)."""
    engine = inventory.engine()
    if serving_enabled(inventory) and not engine.needs_mpi:
        return (f"{engine.label} serves (serve.engine: {engine.name}): its ranks meet over their own sockets, "
                "not mpirun's")
    return None


def serves(inventory: Inventory, node: str) -> bool:
    """Does `node` take part in a launch, of any world (it needs the model, the token and the config)?"""
    return serving_enabled(inventory) and any(node in world.nodes for world in inventory.worlds())


def unit_nodes(inventory: Inventory) -> list[str]:
    """The nodes that run a serving unit of any world, in inventory order: every node of a world with an engine of
    one unit per rank, else each world's head (its mpirun reaches the others)."""
    if not serving_enabled(inventory):
        return []
    per_rank = inventory.engine().unit_per_rank
    held = {node for world in inventory.worlds() for node in (world.nodes if per_rank else world.nodes[:1])}
    return [n.name for n in inventory.nodes if n.name in held]


def has_unit(inventory: Inventory, node: str) -> bool:
    """Does `node` run a serving unit of any world (unit_nodes)?"""
    return node in unit_nodes(inventory)


def left_out(inventory: Inventory) -> list[str]:
    """The nodes of a serving cluster that no model runs on (more nodes than its worlds take)."""
    if not serving_enabled(inventory):
        return []
    return [n.name for n in inventory.nodes if not serves(inventory, n.name)]


def relay_mode(inventory: Inventory) -> bool:
    """container.distribute: relay: the head pulls the image once and sends it to the peers over the fabric."""
    return inventory.container.distribute == "relay" and len(inventory.nodes) > 1


def copy_mode(inventory: Inventory) -> bool:
    """serve.distribute: copy: the head downloads once and sends the snapshots to the peers over the fabric."""
    return (serving_enabled(inventory) and inventory.serve.distribute == "copy"
            and len(inventory.serving_nodes()) > 1)


def rdma_up(facts: Facts) -> list[str]:
    """The node's RoCE devices whose twin is Up: what NCCL could have used."""
    return [d.device for d in facts.roce if facts.interface_up(d.netdev)]


def fell_back_to_sockets(report: NcclReport, facts: Facts) -> bool:
    """NCCL ran over TCP sockets where RDMA was there to use: the devices NCCL_IB_HCA lists were not found (the
    silent fallback), or it chose Socket while RoCE devices are Up and IB is not disabled. NCCL picks its network
    once, when the communicator starts: a server started before the devices were ready keeps sockets until it is
    restarted (doctor reports it, serve.launch restarts it)."""
    ib_disabled = report.env.get("NCCL_IB_DISABLE") == "1"
    return report.silent_tcp_fallback or (report.network == "Socket" and bool(rdma_up(facts)) and not ib_disabled)
