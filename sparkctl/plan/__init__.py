"""PURE planning: (inventory, facts) -> the desired state of every node. No I/O here."""

from __future__ import annotations

from dataclasses import dataclass

from sparkctl.facts import Facts
from sparkctl.inventory import Inventory
from sparkctl.plan.container import ContainerSpec, container_spec, render_entrypoint, render_hostfile
from sparkctl.plan.fabric import FabricPlan, PlanError, plan_fabric, render_netplan
from sparkctl.plan.launch import Launch
from sparkctl.plan.launches import plan_launch
from sparkctl.plan.ring import forwarding_settings, render_sysctl, ring_routes

__all__ = ["ClusterPlan", "FabricPlan", "PlanError", "NodePlan", "plan_cluster"]


@dataclass
class NodePlan:
    name: str
    rank: int
    netplan: str | None
    container: ContainerSpec
    #: sysctls the node needs (a relaying ring node's forwarding), and the file that keeps them; {} / None: none
    sysctl: dict[str, str]
    sysctl_file: str | None
    #: the netplan file's routes: {interface: [(destination, via)]} (a ring's, plan/ring.py)
    routes: dict[str, list[tuple[str, str]]]


@dataclass
class ClusterPlan:
    fabric: FabricPlan
    nodes: dict[str, NodePlan]
    #: the containers' mesh mpirun needs (a bare cluster keeps it too: `sparkctl nccl-tests`, a hand-run mpirun);
    #: "" where the engine's ranks meet by themselves
    hostfile: str
    entrypoint: str
    #: each world's launch, by its key (World.key; "" the first), in the order of serve.models: its config file
    #: and each of its nodes' line (plan/launch.py)
    launches: dict[str, Launch]

    @property
    def launch(self) -> Launch:
        """The first world's launch (a cluster of one model has no other)."""
        return self.launches[""]

    @property
    def hosts(self) -> dict[str, str]:
        """Where each world's API server answers, by its key (Launch.host)."""
        return {key: launch.host for key, launch in self.launches.items()}


def plan_cluster(inventory: Inventory, facts_by_node: dict[str, Facts] | None = None) -> ClusterPlan:
    facts_by_node = facts_by_node or {}
    fabric = plan_fabric(inventory, facts_by_node)
    order = [n.name for n in inventory.nodes]
    ring = inventory.topology == "ring"
    nodes = {}
    for rank, node in enumerate(inventory.nodes):
        routes = ring_routes(fabric, order, node.name) if ring else None
        netplan = render_netplan(inventory, node.name, fabric, routes) if fabric.ports[node.name].interfaces \
            else None
        sysctl = forwarding_settings(fabric, order, node.name) if ring else {}
        nodes[node.name] = NodePlan(
            name=node.name, rank=rank, netplan=netplan,
            container=container_spec(inventory, node, fabric, facts_by_node.get(node.name)),
            sysctl=sysctl, sysctl_file=render_sysctl(inventory.cluster.name, node.name, sysctl) if sysctl else None,
            routes=routes or {},
        )
    mpi = inventory.engine().needs_mpi
    return ClusterPlan(
        fabric=fabric, nodes=nodes, hostfile=render_hostfile(inventory, fabric) if mpi else "",
        entrypoint=render_entrypoint(inventory) if mpi else "",
        launches={world.key: plan_launch(inventory.for_world(world), fabric) for world in inventory.worlds()})
