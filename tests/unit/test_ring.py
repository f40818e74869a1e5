"""Rings of 3 to 8 (plan/ring.py): every node reaches every address of every other node by the planned routes,
the short way round, relayed only by nodes that forward on the twin the packet came in on; the settings, the
hostfile and the plan's words fit the shape."""

from __future__ import annotations

import ipaddress

import pytest

from sparkctl.cli.plan_view import render_plan_text
from sparkctl.plan import plan_cluster
from sparkctl.plan.ring import ring_hop
from sparkctl.plan.ssh import peer_route
from tests.taskkit import inventory, inventory_from_yaml

PORT0 = ("enp1s0f0np0", "enP2p1s0f0np0")
PORT1 = ("enp1s0f1np1", "enP2p1s0f1np1")


def ring(n: int, tmp_path):
    nodes = "".join(f"  - {{name: spark{i}, host: 10.0.0.{10 + i}}}\n" for i in range(1, n + 1))
    return inventory_from_yaml(f"cluster: {{name: r{n}}}\nuser: nvidia\nnodes:\n{nodes}fabric: {{topology: ring}}\n"
                               "serve: {tp_size: 1}\n", tmp_path)


def owner(plan, ip):
    return next((node, iface) for node, addrs in plan.fabric.addresses.items()
                for iface, addr in addrs.items() if addr.ip == ip)


def walk(plan, src: str, dst_ip) -> list[tuple[str, str | None]]:
    """The nodes a packet from src to dst_ip visits, each with the interface it came in on."""
    path: list[tuple[str, str | None]] = [(src, None)]
    current = src
    for _ in range(16):
        mine = plan.fabric.addresses[current]
        if any(a.ip == dst_ip for a in mine.values()):
            return path
        attached = [(iface, a) for iface, a in mine.items() if dst_ip in a.network]
        if attached:
            nxt, iface_in = owner(plan, dst_ip)
            out_iface = attached[0][0]
        else:
            out_iface, via = next((iface, ipaddress.ip_address(via))
                                  for iface, routes in plan.nodes[current].routes.items()
                                  for to, via in routes if ipaddress.ip_network(to).network_address == dst_ip)
            assert via in mine[out_iface].network, f"{current}: {via} is not on {out_iface}"
            nxt, iface_in = owner(plan, via)
        assert plan.fabric.addresses[nxt][iface_in].network == mine[out_iface].network
        path.append((nxt, iface_in))
        current = nxt
    raise AssertionError(f"no delivery from {src} to {dst_ip}: {path}")


@pytest.mark.parametrize("n", range(3, 9))
def test_every_node_reaches_every_address_the_short_way_relayed_only_where_forwarding_is_on(n, tmp_path):
    plan = plan_cluster(ring(n, tmp_path))
    order = [f"spark{i}" for i in range(1, n + 1)]
    for src in order:
        for dst in order:
            if dst == src:
                continue
            distance = min((order.index(dst) - order.index(src)) % n, (order.index(src) - order.index(dst)) % n)
            for addr in plan.fabric.addresses[dst].values():
                path = walk(plan, src, addr.ip)
                assert path[-1][0] == dst
                assert len(path) - 1 == distance, (src, str(addr.ip), path)
                for relay, iface_in in path[1:-1]:
                    assert plan.nodes[relay].sysctl.get(f"net/ipv4/conf/{iface_in}/forwarding") == "1", \
                        f"{relay} relays from {iface_in} without forwarding there"
                # the reply, to the address the request left from, retraces the path and comes in where it left
                first_hop = plan.fabric.addresses[path[1][0]][path[1][1]].network
                out_iface = next(i for i, a in plan.fabric.addresses[src].items() if a.network == first_hop)
                back = walk(plan, dst, plan.fabric.addresses[src][out_iface].ip)
                assert [node for node, _ in back] == [node for node, _ in reversed(path)], (path, back)
                assert back[-1][1] == out_iface
    for name in order:
        sysctl = plan.nodes[name].sysctl
        if n == 3:
            assert sysctl == {} and plan.nodes[name].sysctl_file is None  # neighbours only: nobody relays
        else:
            # forwarding and loose reverse-path filtering on the four fabric twins, nothing else
            assert set(sysctl) == {f"net/ipv4/conf/{i}/{k}" for i in (*PORT0, *PORT1)
                                   for k in ("forwarding", "rp_filter")}
            assert "ip_forward" not in plan.nodes[name].sysctl_file and "enP7s7" not in plan.nodes[name].sysctl_file


def test_each_twin_carries_its_own_half_and_ties_go_clockwise(tmp_path):
    plan = plan_cluster(ring(4, tmp_path))
    order = ["spark1", "spark2", "spark3", "spark4"]
    # two hops either way: the earlier node goes clockwise, the later one back the same way
    assert ring_hop(order, "spark1", "spark3") == "spark2" and ring_hop(order, "spark3", "spark1") == "spark2"
    assert ring_hop(order, "spark2", "spark4") == "spark3" and ring_hop(order, "spark4", "spark2") == "spark3"
    assert ring_hop(order, "spark1", "spark4") == "spark4"
    for iface, routes in plan.nodes["spark1"].routes.items():
        for to, via in routes:
            to_iface = owner(plan, ipaddress.ip_network(to).network_address)[1]
            # a twin-2 address is reached over twin 2 of the cable, a twin-1 address over twin 1
            assert (to_iface.startswith("enP2")) == iface.startswith("enP2"), (to, via, iface)


def test_ring_settings_hostfile_ssh_and_the_plans_words(tmp_path):
    inv = inventory("four-sparks-ring.yaml")
    plan = plan_cluster(inv)
    for name in ("spark1", "spark2", "spark3", "spark4"):
        env = plan.nodes[name].container.env
        assert env["NCCL_SOCKET_IFNAME"] == env["UCX_NET_DEVICES"] == ",".join((*PORT0, *PORT1))
        assert env["OMPI_MCA_btl_tcp_if_include"] == env["OMPI_MCA_oob_tcp_if_include"] == PORT0[0]
    assert plan.hostfile.splitlines() == ["10.200.0.1", "10.200.2.1", "10.200.4.1", "10.200.6.1"]
    # non-neighbours ssh over the fabric, through the relay: no management detour
    assert peer_route(inv, plan.fabric, "spark1", "spark3") == ("10.200.4.1", "")
    text = render_plan_text(inv, plan)
    assert "fabric.port in the inventory" not in text
    assert "both ports: the ring's port 0 to the next node, port 1 to the previous" in text
    assert "Open MPI (TCP):    enp1s0f0np0  (one interface, the same name on every node" in text
    assert "forwarding:" in text and "- to: 10.200.4.1/32\n          via: 10.200.0.2" in text


def test_network_verify_pings_every_routed_address_too():
    from sparkctl.rules.mesh import link_pings

    inv = inventory("four-sparks-ring.yaml")
    plan = plan_cluster(inv)
    order = ["spark1", "spark2", "spark3", "spark4"]
    pings = link_pings(plan.fabric, order, "spark1", plan.nodes["spark1"].routes)
    reached = {p.address for p in pings}
    others = {str(a.ip) for n in order[1:] for a in plan.fabric.addresses[n].values()}
    assert reached == others  # every address of every other node: neighbours directly, the rest relayed
    relayed = next(p for p in pings if p.address == "10.200.4.1")
    assert (relayed.peer, relayed.interface) == ("spark3", "enp1s0f0np0")
