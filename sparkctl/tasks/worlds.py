"""The serving tasks' view of one world: a node and the cluster as one world of several sees them.

A cluster serves one world per placed model (inventory/placement.py). What a serving task does for one world (its
config, its unit, its launch) reads `ctx.inventory` as that world's (Inventory.for_world: serve: is its model,
serve.nodes its nodes, the world's names its own): these views hand it that inventory and share everything else
with the context they view (the connection, the facts read, the run's plan, its events), so a node is read once
whatever number of worlds it holds.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sparkctl.facts import Facts
from sparkctl.facts.script import SideRead
from sparkctl.inventory import Inventory
from sparkctl.plan import ClusterPlan
from sparkctl.plan.launch import Launch
from sparkctl.taskgraph.task import TaskFailed
from sparkctl.tasks.context import ClusterContext, NodeContext


class WorldNode(NodeContext):
    """A node as one world sees it: its inventory is the world's; its state (facts, connection) the node's own."""

    def __init__(self, whole: NodeContext, inventory: Inventory):  # noqa: D107 - no NodeContext state of its own
        object.__setattr__(self, "_whole", whole)
        object.__setattr__(self, "_world_inventory", inventory)

    @property
    def inventory(self) -> Inventory:
        return self._world_inventory

    def __getattr__(self, name: str) -> Any:
        return getattr(self._whole, name)

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self._whole, name, value)

    def _read_facts(self, side_reads: Mapping[str, tuple[str, float] | SideRead] | None = None) -> Facts:
        # a node's facts are the cluster's read of it, whichever world asks
        return self._whole._read_facts(side_reads)


class WorldCluster(ClusterContext):
    """The cluster as one world sees it: its inventory and its head are the world's, its nodes seen as the world
    sees them; the run (plan, events, lost nodes, records) is the cluster's."""

    def __init__(self, whole: ClusterContext, inventory: Inventory):  # noqa: D107
        object.__setattr__(self, "_whole", whole)
        object.__setattr__(self, "_world_inventory", inventory)
        object.__setattr__(self, "_views", {name: WorldNode(node, inventory) for name, node in whole.nodes.items()})

    @property
    def inventory(self) -> Inventory:  # type: ignore[override]  # a view's is read-only
        return self._world_inventory

    @property
    def nodes(self) -> dict[str, NodeContext]:  # type: ignore[override]
        return self._views

    def __getattr__(self, name: str) -> Any:
        return getattr(self._whole, name)

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self._whole, name, value)

    def plan(self) -> ClusterPlan:
        return self._whole.plan()

    def head(self) -> NodeContext:
        """The world's head: the node of its rank 0 (its API server)."""
        head = self.inventory.serving_nodes()[0]
        if head not in self.nodes:
            raise TaskFailed(f"{head}, the head of the world of {self.inventory.serve_spec().served_name}, cannot be "
                             "read in this run")
        return self.nodes[head]


def world_inventories(inventory: Inventory) -> list[Inventory]:
    """The inventory as each of its worlds sees it, in the order of serve.models."""
    return [inventory.for_world(world) for world in inventory.worlds()]


def node_worlds(ctx: NodeContext) -> list[NodeContext]:
    """`ctx`'s node as each world that runs on it sees it."""
    return [WorldNode(ctx, view) for view in world_inventories(ctx.inventory) if ctx.name in view.serving_nodes()]


def cluster_worlds(ctx: ClusterContext) -> list[ClusterContext]:
    """The cluster as each of its worlds sees it."""
    return [WorldCluster(ctx, view) for view in world_inventories(ctx.inventory)]


def world_launch(ctx: NodeContext | ClusterContext) -> Launch:
    """The launch of the world `ctx` sees (the first world's for a context of the whole cluster)."""
    return ctx.plan().launches[ctx.inventory.world_key]
