"""PURE: how nodes reach each other with the cluster key, and the ssh config block that makes them do it."""

from __future__ import annotations

import posixpath

from sparkctl.inventory import Inventory
from sparkctl.plan.fabric import FabricPlan
from sparkctl.plan.paths import cluster_key_name
from sparkctl.plan.render import render

#: ssh from one node to another over the fabric, in a script: no prompt, a dead peer found within a minute
FABRIC_SSH_OPTIONS = "-o BatchMode=yes -o ConnectTimeout=10 -o ServerAliveInterval=15"


def peer_route(inventory: Inventory, fabric: FabricPlan, node: str, peer: str) -> tuple[str, str]:
    """How `node` reaches `peer` with the cluster key: (address, extra ssh options).

    On a link they share: the peer's address there and no options (the ssh config block names that address).
    A peer with no shared link (non-neighbours in a ring of 4+): its first fabric address, which the ring's
    routes reach through the nodes in between (plan/ring.py); without such routes, its management address, its
    ssh port and the cluster key named outright.
    """
    for link in fabric.links(node):
        for other, _iface, address in link.peers:
            if other == peer:
                return str(address.ip), ""
    first = fabric.first_address(peer)
    if inventory.topology == "ring" and first is not None:
        return str(first), ""
    spec = inventory.node(peer)
    port = int(spec.port or inventory.ssh.port or 22)
    # ssh expands the ~ of -i itself: the line works unquoted and inside a double-quoted variable alike
    return str(spec.host), f"-p {port} -o IdentitiesOnly=yes -i ~/.ssh/{cluster_key_name(inventory.cluster.name)}"


def peer_routes(inventory: Inventory, fabric: FabricPlan, node: str, peer: str) -> list[tuple[str, str]]:
    """Every way `node` reaches `peer` over the fabric: the peer's address on each twin subnet they share (a pair
    of Sparks shares two: one per twin of the cabled port), else the one peer_route gives."""
    shared = [(str(address.ip), "") for link in fabric.links(node) for other, _iface, address in link.peers
              if other == peer]
    return list(dict.fromkeys(shared)) or [peer_route(inventory, fabric, node, peer)]


def ssh_config_block(inventory: Inventory, hosts: list[str], home: str) -> str:
    """The Host block that makes `ssh <peer fabric address>` use the cluster key and the pinned host keys."""
    cluster = inventory.cluster.name
    return render("ssh-config-cluster.j2", cluster=cluster, user=inventory.user, hosts=hosts or ["none"],
                  identity_file=posixpath.join(home, ".ssh", cluster_key_name(cluster)),
                  known_hosts=posixpath.join(home, ".ssh", "known_hosts"))
