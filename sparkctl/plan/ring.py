"""PURE: a ring of Sparks, each node's two ports cabled to its neighbours (port 0 to the next node's port 1),
made into one network: host routes to every address a node is not attached to, forwarding through the
neighbours where two nodes are not adjacent.

Routes go toward the node that owns the address, the short way round (the same path both ways), each twin's traffic
on the same twin of the cable (both twins of a cable carry half the peers' addresses). A neighbour's address on
its other cable is reached through that neighbour itself: it accepts traffic for any of its own addresses, so a
ring of 3 needs no forwarding. From 4 nodes on, the nodes in between relay: their fabric interfaces forward
(net.ipv4.conf.<twin>.forwarding, never the management port's), and reverse-path filtering is loose on them
(rp_filter 2, as Ubuntu's default), since the two ways round a ring of even size are equally short and a reply
may come back the other way.
"""

from __future__ import annotations

from sparkctl.plan.fabric import FabricPlan

#: Rings sparkctl builds. Past 8, the farthest nodes are 4+ hops apart through nodes relaying in the kernel:
#: use a switch.
RING_SIZES = range(3, 9)
#: A ring smaller than this has every node adjacent to every other: no node relays.
RELAY_FROM = 4


def ring_hop(order: list[str], node: str, peer: str) -> str:
    """The neighbour `node` sends to on its way to `peer` (peer itself when adjacent): the short way round; on a
    tie (two nodes opposite in a ring of even size) the earlier node of the two goes clockwise and the later one
    counter-clockwise, so a reply retraces the request's path and arrives on the interface it left from (a
    socket bound to a device, like `ping -I`, sees it)."""
    n, i, j = len(order), order.index(node), order.index(peer)
    clockwise, counter = (j - i) % n, (i - j) % n
    forward = clockwise < counter or (clockwise == counter and i < j)
    return order[(i + 1) % n] if forward else order[(i - 1) % n]


def _twin_index(fabric: FabricPlan, node: str, iface: str) -> int:
    interfaces = fabric.ports[node].interfaces
    return interfaces.index(iface) % 2 if iface in interfaces else 0


def ring_routes(fabric: FabricPlan, order: list[str], node: str) -> dict[str, list[tuple[str, str]]]:
    """{interface: [(destination/32, via)]}: a host route to every peer address on a subnet `node` is not on."""
    mine = fabric.addresses.get(node, {})
    attached = {a.network for a in mine.values()}
    routes: dict[str, list[tuple[str, str]]] = {}
    for peer in order:
        if peer == node:
            continue
        hop = ring_hop(order, node, peer)
        # the links to the hop, by twin: (my interface, the hop's address on that cable)
        links = {_twin_index(fabric, node, iface): (iface, hop_addr)
                 for iface, addr in mine.items()
                 for hop_addr in fabric.addresses.get(hop, {}).values() if hop_addr.network == addr.network}
        if not links:
            continue  # not cabled as planned: network.verify and preflight say why
        for peer_iface, addr in fabric.addresses.get(peer, {}).items():
            if addr.network in attached:
                continue
            iface, via = links.get(_twin_index(fabric, peer, peer_iface)) or links[min(links)]
            routes.setdefault(iface, []).append((f"{addr.ip}/32", str(via.ip)))
    return routes


def relays(order: list[str]) -> bool:
    """Whether the nodes of this ring forward for each other."""
    return len(order) >= RELAY_FROM


def forwarding_settings(fabric: FabricPlan, order: list[str], node: str) -> dict[str, str]:
    """The sysctls (`net/ipv4/conf/<twin>/forwarding`, `/rp_filter`) a relaying ring node needs on its fabric
    twins; {} when the ring does not relay."""
    if not relays(order):
        return {}
    out = {}
    for iface in fabric.ports[node].interfaces:
        # the `/` form: an interface name may hold a dot (a VLAN), which the dotted form would split
        out[f"net/ipv4/conf/{iface}/forwarding"] = "1"
        out[f"net/ipv4/conf/{iface}/rp_filter"] = "2"
    return out


def conf_key(sysctl: str) -> str:
    """`net/ipv4/conf/<iface>/<key>` -> the facts' `<iface>.<key>` (Facts.ipv4_conf)."""
    _, _, rest = sysctl.partition("net/ipv4/conf/")
    iface, _, key = rest.rpartition("/")
    return f"{iface}.{key}"


def render_sysctl(cluster: str, node: str, settings: dict[str, str]) -> str:
    lines = [f"# Managed by sparkctl (cluster {cluster}): {node} relays the ring's traffic between its",
             "# neighbours on its fabric twins only. Edit the inventory and rerun `sparkctl cluster bootstrap`."]
    lines += [f"{key} = {value}" for key, value in settings.items()]
    return "\n".join(lines) + "\n"
