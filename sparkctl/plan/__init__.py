"""PURE planning: (inventory, facts) -> the desired state of every node. No I/O here."""

from __future__ import annotations

import shlex
from dataclasses import dataclass

from sparkctl.facts import Facts
from sparkctl.inventory import Inventory
from sparkctl.plan.container import (
    ContainerSpec,
    container_spec,
    render_entrypoint,
    render_hostfile,
    serving_hosts,
)
from sparkctl.plan.fabric import FabricPlan, PlanError, plan_fabric, render_netplan
from sparkctl.plan.ring import forwarding_settings, render_sysctl, ring_routes
from sparkctl.plan.serve import launch_command, render_serve_config
from sparkctl.plan.vllm import VllmLaunch, vllm_launch

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
    hostfile: str
    entrypoint: str
    serve_config: str
    launch_command: str
    #: serve.engine vllm: every serving node's command (serve_config is then its --config file, launch_command the
    #: head's `vllm serve`)
    vllm: VllmLaunch | None = None


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
    if inventory.serve_spec().engine == "vllm":
        vllm = vllm_launch(inventory, fabric)
        return ClusterPlan(fabric=fabric, nodes=nodes, hostfile="", entrypoint="", serve_config=vllm.config_text(),
                           launch_command=shlex.join(vllm.serve[inventory.serving_nodes()[0]]), vllm=vllm)
    return ClusterPlan(
        fabric=fabric, nodes=nodes, hostfile=render_hostfile(inventory, fabric),
        entrypoint=render_entrypoint(inventory), serve_config=render_serve_config(inventory),
        launch_command=launch_command(inventory, serving_hosts(inventory, fabric)),
    )
