"""The pure planner: addressing per topology, per-node names, never renumbering, legacy facts, no Up port."""

from __future__ import annotations

import copy
import ipaddress
from collections import Counter

import pytest

from sparkctl.plan import PlanError, plan_cluster
from sparkctl.plan.fabric import plan_fabric
from tests.taskkit import inventory, inventory_from_yaml, spark_facts

PORT0 = ("enp1s0f0np0", "enP2p1s0f0np0")
PORT1 = ("enp1s0f1np1", "enP2p1s0f1np1")


def all_addresses(plan) -> list[ipaddress.IPv4Interface]:
    return [a for per_node in plan.fabric.addresses.values() for a in per_node.values()]


def assert_one_subnet_per_twin(plan) -> None:
    """No duplicate address anywhere; no node with two interfaces in one subnet."""
    ips = Counter(a.ip for a in all_addresses(plan))
    assert [ip for ip, n in ips.items() if n > 1] == []
    for node, addrs in plan.fabric.addresses.items():
        nets = [a.network for a in addrs.values()]
        assert len(nets) == len(set(nets)), f"{node} has two twins in one subnet: {addrs}"


def pair_inventory(tmp_path, extra: str = "", spark2: str = ""):
    return inventory_from_yaml(f"""
cluster: {{name: t}}
user: nvidia
nodes:
  - {{name: spark1, host: 10.0.0.11}}
  - {{name: spark2, host: 10.0.0.12{spark2}}}
fabric: {{topology: pair, subnets: [192.168.100.0/24, 192.168.101.0/24]{extra}}}
""", tmp_path)


# --- ring of three ------------------------------------------------------------------------------------------

def test_ring_of_three_one_subnet_per_cable_twin():
    inv = inventory("three-sparks-ring.yaml")
    plan = plan_cluster(inv)
    assert_one_subnet_per_twin(plan)
    by_subnet: dict[ipaddress.IPv4Network, list[tuple[str, str, str]]] = {}
    for node, addrs in plan.fabric.addresses.items():
        assert set(addrs) == {*PORT0, *PORT1}
        for iface, addr in addrs.items():
            by_subnet.setdefault(addr.network, []).append((node, iface, str(addr.ip)))
    # cable i: node i port 0 <-> node i+1 port 1; twin t of that cable in subnets[2i + t]
    expected = {}
    names = ["spark1", "spark2", "spark3"]
    for i, name in enumerate(names):
        nxt = names[(i + 1) % 3]
        for twin in (0, 1):
            net = ipaddress.IPv4Network(f"10.200.{2 * i + twin}.0/24")
            expected[net] = sorted([(name, PORT0[twin], str(net.network_address + 1)),
                                    (nxt, PORT1[twin], str(net.network_address + 2))])
    assert {k: sorted(v) for k, v in by_subnet.items()} == expected
    # every cable end sees exactly its one peer on that twin
    for link in plan.fabric.links("spark1"):
        assert len(link.peers) == 1
    assert plan.fabric.ports["spark2"].interfaces == (*PORT0, *PORT1)
    env = plan.nodes["spark2"].container.env
    assert env["NCCL_IB_HCA"] == "rocep1s0f0,roceP2p1s0f0,rocep1s0f1,roceP2p1s0f1"


def test_ring_netplan_addresses_all_four_twins():
    plan = plan_cluster(inventory("three-sparks-ring.yaml"))
    netplan = plan.nodes["spark1"].netplan
    for iface in (*PORT0, *PORT1):
        assert f"    {iface}:\n" in netplan
    assert "- 10.200.0.1/24" in netplan and "- 10.200.5.2/24" in netplan  # spark1 port 1 ends cable 2


def test_ring_open_mpi_uses_one_interface_with_the_same_name_on_every_node():
    """Open MPI 4.1's TCP BTL mis-pairs a node's interfaces with a peer's addresses across cables (hang or
    "Network is unreachable"), and mpirun copies the head's OMPI_MCA_* into every rank: one name for all."""
    plan = plan_cluster(inventory("three-sparks-ring.yaml"))
    for node in ("spark1", "spark2", "spark3"):
        env = plan.nodes[node].container.env
        assert env["OMPI_MCA_btl_tcp_if_include"] == env["OMPI_MCA_oob_tcp_if_include"] == PORT0[0]
        # NCCL and UCX keep every twin of both cables
        assert env["NCCL_SOCKET_IFNAME"] == env["UCX_NET_DEVICES"] == ",".join((*PORT0, *PORT1))
    # the hostfile names each node's address on that interface (cable i's first end), head first
    assert plan.hostfile.splitlines() == ["10.200.0.1", "10.200.2.1", "10.200.4.1"]


def test_ring_routes_reach_each_neighbours_far_cable_through_the_shared_one():
    plan = plan_cluster(inventory("three-sparks-ring.yaml"))
    netplan = plan.nodes["spark1"].netplan
    # spark2's cable-1 addresses via spark2's end of cable 0; spark3's cable-1 ends via spark3's end of cable 2;
    # each twin's address through the same twin of the shared cable (both twins carry traffic)
    for to, via in (("10.200.2.1/32", "10.200.0.2"), ("10.200.3.1/32", "10.200.1.2"),
                    ("10.200.2.2/32", "10.200.4.1"), ("10.200.3.2/32", "10.200.5.1")):
        assert f"- to: {to}\n          via: {via}\n" in netplan
    # so every node's hostfile (MPI) address is reachable from every other node, over the direct cable
    for node in ("spark1", "spark2", "spark3"):
        rendered = plan.nodes[node].netplan
        own = {str(a.ip) for a in plan.fabric.addresses[node].values()}
        for line in plan.hostfile.splitlines():
            if line not in own:
                assert f"- to: {line}/32\n" in rendered or any(
                    ipaddress.ip_address(line) in a.network for a in plan.fabric.addresses[node].values())


def test_pair_and_switch_open_mpi_settings_keep_both_twins():
    for name in ("two-sparks.yaml", "four-sparks-switch.yaml"):
        plan = plan_cluster(inventory(name))
        for node in plan.nodes.values():
            assert node.container.env["OMPI_MCA_btl_tcp_if_include"] == ",".join(PORT1)
        assert "routes:" not in plan.nodes["spark1"].netplan


# --- switch of four -----------------------------------------------------------------------------------------

def test_switch_of_four_addresses_by_position():
    inv = inventory("four-sparks-switch.yaml")
    plan = plan_cluster(inv)
    assert_one_subnet_per_twin(plan)
    for i, name in enumerate(["spark1", "spark2", "spark3", "spark4"]):
        assert {k: str(v) for k, v in plan.fabric.addresses[name].items()} == {
            "enp1s0f1np1": f"192.168.100.{10 + i}/24", "enP2p1s0f1np1": f"192.168.101.{10 + i}/24"}
        assert plan.nodes[name].rank == i
    assert plan.hostfile.splitlines() == [f"192.168.100.{10 + i}" for i in range(4)]
    assert all(len(link.peers) == 3 for link in plan.fabric.links("spark1"))
    # spark4's user is `admin`: its own home in its mounts
    mounts = {inside: host for host, inside, _ in plan.nodes["spark4"].container.mounts}
    assert mounts["/root/.cache/huggingface/"] == "/home/admin/.cache/huggingface/"
    assert plan.nodes["spark1"].container.env["NCCL_DEBUG"] == "WARN"  # inventory container.env
    assert "--tp_size 4" in plan.launch.head_command()


def test_switch_nodes_on_different_ports_each_use_their_own_names():
    inv = inventory("four-sparks-switch.yaml")
    facts = {"spark1": spark_facts("spark1", up_ports=(1,)), "spark2": spark_facts("spark2", up_ports=(0,)),
             "spark3": spark_facts("spark3", up_ports=(1,)), "spark4": spark_facts("spark4", up_ports=(0,))}
    plan = plan_cluster(inv, facts)
    assert_one_subnet_per_twin(plan)
    assert list(plan.fabric.addresses["spark2"]) == list(PORT0)
    assert plan.fabric.ports["spark2"].source == "facts"


# --- which twins a node uses ------------------------------------------------------------------------------

def test_pinned_interfaces_are_used_as_written(tmp_path):
    inv = pair_inventory(tmp_path, spark2=", fabric: {interfaces: [enp1s0f0np0, enP2p1s0f0np0]}")
    plan = plan_cluster(inv)  # offline: pinned names, RoCE devices from the Spark naming
    ports = plan.fabric.ports["spark2"]
    assert (ports.source, ports.interfaces) == ("pinned", PORT0)
    env = plan.nodes["spark2"].container.env
    assert env["NCCL_SOCKET_IFNAME"] == "enp1s0f0np0,enP2p1s0f0np0"
    assert env["NCCL_IB_HCA"] == "rocep1s0f0,roceP2p1s0f0"
    assert {k: str(v) for k, v in plan.fabric.addresses["spark2"].items()} == {
        "enp1s0f0np0": "192.168.100.11/24", "enP2p1s0f0np0": "192.168.101.11/24"}
    assert plan.fabric.ports["spark1"].interfaces == PORT1


def test_pinned_interfaces_take_roce_devices_from_the_node(tmp_path):
    inv = pair_inventory(tmp_path, spark2=", fabric: {interfaces: [enp1s0f0np0, enP2p1s0f0np0]}")
    spark2 = spark_facts("spark2", up_ports=(0,))
    for dev in spark2.roce:
        dev.device = "mlx5_" + dev.netdev  # a node whose RDMA names differ from the usual ones
    plan = plan_cluster(inv, {"spark1": spark_facts("spark1"), "spark2": spark2})
    assert plan.nodes["spark2"].container.env["NCCL_IB_HCA"] == "mlx5_enp1s0f0np0,mlx5_enP2p1s0f0np0"


def test_up_port_differs_from_peer_each_node_uses_its_own_names(tmp_path):
    inv = pair_inventory(tmp_path)
    facts = {"spark1": spark_facts("spark1", up_ports=(0,)), "spark2": spark_facts("spark2", up_ports=(1,))}
    plan = plan_cluster(inv, facts)
    one, two = plan.nodes["spark1"].container.env, plan.nodes["spark2"].container.env
    for key in ("UCX_NET_DEVICES", "NCCL_SOCKET_IFNAME", "OMPI_MCA_btl_tcp_if_include",
                "OMPI_MCA_oob_tcp_if_include"):
        assert one[key] == "enp1s0f0np0,enP2p1s0f0np0", key
        assert two[key] == "enp1s0f1np1,enP2p1s0f1np1", key
    assert one["NCCL_IB_HCA"] == "rocep1s0f0,roceP2p1s0f0"
    assert two["NCCL_IB_HCA"] == "rocep1s0f1,roceP2p1s0f1"
    # the twins still pair up by subnet: twin 1 of both nodes in .100, twin 2 in .101
    assert {k: str(v) for k, v in plan.fabric.addresses["spark1"].items()} == {
        "enp1s0f0np0": "192.168.100.10/24", "enP2p1s0f0np0": "192.168.101.10/24"}
    assert plan.hostfile.splitlines() == ["192.168.100.10", "192.168.100.11"]
    assert "enp1s0f0np0:" in plan.nodes["spark1"].netplan and "enp1s0f1np1" not in plan.nodes["spark1"].netplan


def test_two_up_ports_prefer_port_1_and_fabric_port_is_honoured(tmp_path):
    both = {n: spark_facts(n, up_ports=(0, 1)) for n in ("spark1", "spark2")}
    assert plan_fabric(pair_inventory(tmp_path), both).ports["spark1"].interfaces == PORT1
    pinned_port = pair_inventory(tmp_path, extra=", port: 0")
    assert plan_fabric(pinned_port, both).ports["spark1"].interfaces == PORT0


# --- never renumber ------------------------------------------------------------------------------------------

def test_existing_valid_addresses_are_kept(tmp_path):
    inv = pair_inventory(tmp_path)
    facts = {"spark1": spark_facts("spark1", addresses={"enp1s0f1np1": ["192.168.100.50/24"],
                                                         "enP2p1s0f1np1": ["192.168.101.77/24"]}),
             "spark2": spark_facts("spark2", addresses={"enp1s0f1np1": ["192.168.100.10/24"]})}
    plan = plan_fabric(inv, facts)
    got = {n: {k: str(v) for k, v in a.items()} for n, a in plan.addresses.items()}
    assert got["spark1"] == {"enp1s0f1np1": "192.168.100.50/24", "enP2p1s0f1np1": "192.168.101.77/24"}
    # spark2 keeps .10 (its own); spark2's twin 2 takes its default .11
    assert got["spark2"]["enp1s0f1np1"] == "192.168.100.10/24"
    assert got["spark2"]["enP2p1s0f1np1"] == "192.168.101.11/24"
    assert plan.kept == {"spark1": {"enp1s0f1np1", "enP2p1s0f1np1"}, "spark2": {"enp1s0f1np1"}}


def test_default_taken_by_a_kept_address_goes_to_a_free_one(tmp_path):
    inv = pair_inventory(tmp_path)
    # spark2 already holds spark1's default .10: spark1 must not get it too
    facts = {"spark1": spark_facts("spark1"),
             "spark2": spark_facts("spark2", addresses={"enp1s0f1np1": ["192.168.100.10/24"]})}
    plan = plan_cluster(inv, facts)
    assert str(plan.fabric.addresses["spark2"]["enp1s0f1np1"]) == "192.168.100.10/24"
    assert plan.fabric.addresses["spark1"]["enp1s0f1np1"].ip != ipaddress.ip_address("192.168.100.10")
    assert_one_subnet_per_twin(plan)
    # the hostfile follows: head first, each node's own first-twin address
    assert plan.hostfile.splitlines() == [str(plan.fabric.addresses["spark1"]["enp1s0f1np1"].ip), "192.168.100.10"]


def test_duplicate_existing_addresses_keep_only_one(tmp_path):
    inv = pair_inventory(tmp_path)
    same = {"enp1s0f1np1": ["192.168.100.10/24"]}
    plan = plan_fabric(inv, {n: spark_facts(n, addresses=same) for n in ("spark1", "spark2")})
    assert plan.kept["spark1"] == {"enp1s0f1np1"} and plan.kept["spark2"] == set()
    assert str(plan.addresses["spark2"]["enp1s0f1np1"]) == "192.168.100.11/24"


def test_addresses_outside_the_twin_subnet_are_not_kept(tmp_path):
    inv = pair_inventory(tmp_path)
    facts = {"spark1": spark_facts("spark1", addresses={"enp1s0f1np1": ["10.9.9.9/24", "192.168.100.0/24"]})}
    plan = plan_fabric(inv, facts)
    assert str(plan.addresses["spark1"]["enp1s0f1np1"]) == "192.168.100.10/24"
    assert plan.kept["spark1"] == set()


@pytest.mark.parametrize("legacy", [
    # speculative-decoding playbook: both twins in 192.168.200/24
    {"enp1s0f1np1": ["192.168.200.12/24"], "enP2p1s0f1np1": ["192.168.200.14/24"]},
    # connect-two-sparks, Nov 2025: both twins in one /24 that happens to be twin 1's subnet
    {"enp1s0f1np1": ["192.168.100.10/24"], "enP2p1s0f1np1": ["192.168.100.14/24"]},
])
def test_legacy_both_twins_in_one_subnet_are_renumbered(tmp_path, legacy):
    inv = pair_inventory(tmp_path)
    facts = {"spark1": spark_facts("spark1", addresses=legacy), "spark2": spark_facts("spark2")}
    plan = plan_cluster(inv, facts)
    mine = plan.fabric.addresses["spark1"]
    assert mine["enp1s0f1np1"].network == ipaddress.IPv4Network("192.168.100.0/24")
    assert str(mine["enP2p1s0f1np1"]) == "192.168.101.10/24"
    assert_one_subnet_per_twin(plan)


# --- no plan possible ---------------------------------------------------------------------------------------

def test_no_up_port_anywhere_is_a_plan_error_with_a_hint(tmp_path):
    facts = {n: spark_facts(n, up_ports=()) for n in ("spark1", "spark2")}
    with pytest.raises(PlanError) as err:
        plan_cluster(pair_inventory(tmp_path), facts)
    assert err.value.message.startswith("spark1: no fabric port is Up")
    assert "ibdev2netdev" in err.value.hint and "same port" in err.value.hint


def test_a_node_without_carrier_takes_its_peers_port_in_a_pair(tmp_path):
    # e.g. both its twins lost carrier because the peer's ends are set down: the peer's port is the one to plan
    facts = {"spark1": spark_facts("spark1", up_ports=()), "spark2": spark_facts("spark2", up_ports=(0,))}
    plan = plan_cluster(pair_inventory(tmp_path), facts)
    assert plan.fabric.ports["spark1"].interfaces == ("enp1s0f0np0", "enP2p1s0f0np0")
    assert plan.fabric.ports["spark1"].source == "peer"


def test_one_twin_up_is_enough_to_know_where_the_cable_is(tmp_path):
    facts = {n: spark_facts(n, up_ports=(0,)) for n in ("spark1", "spark2")}
    facts["spark1"].interfaces["enP2p1s0f0np0"].operstate = "DOWN"
    plan = plan_cluster(pair_inventory(tmp_path), facts)
    assert plan.fabric.ports["spark1"].ports == (0,) and plan.fabric.ports["spark1"].source == "facts"


def test_a_twin_set_down_is_the_cabled_port_when_nothing_else_is(tmp_path):
    facts = {n: spark_facts(n, up_ports=()) for n in ("spark1", "spark2")}
    for n in ("enp1s0f0np0", "enP2p1s0f0np0"):
        facts["spark1"].interfaces[n].flags = ["BROADCAST", "MULTICAST"]
    plan = plan_cluster(pair_inventory(tmp_path), facts)
    assert plan.fabric.ports["spark1"].ports == (0,) and plan.fabric.ports["spark2"].ports == (0,)


def test_the_inventorys_port_is_planned_even_without_carrier(tmp_path):
    # why it has none (the cable in port 1) is preflight's to say, across the cable (rules/twins.py)
    facts = {n: spark_facts(n, up_ports=(1,)) for n in ("spark1", "spark2")}
    plan = plan_cluster(pair_inventory(tmp_path, extra=", port: 0"), facts)
    assert plan.fabric.ports["spark1"].interfaces == ("enp1s0f0np0", "enP2p1s0f0np0")
    assert plan.fabric.ports["spark1"].source == "inventory"


def test_addresses_follow_the_twins_order_whichever_were_kept(tmp_path):
    facts = {n: spark_facts(n, addresses={"enP2p1s0f1np1": [f"192.168.101.{10 + i}/24"]})
             for i, n in enumerate(("spark1", "spark2"))}
    plan = plan_cluster(pair_inventory(tmp_path), facts)
    assert list(plan.fabric.addresses["spark1"]) == ["enp1s0f1np1", "enP2p1s0f1np1"]


# --- single Spark, purity --------------------------------------------------------------------------------

def test_single_spark_has_no_fabric():
    plan = plan_cluster(inventory("single-spark.yaml"))
    node = plan.nodes["spark1"]
    assert node.netplan is None and plan.fabric.addresses == {"spark1": {}}
    assert not any(k.startswith(("NCCL_", "UCX_")) for k in node.container.env)
    assert plan.hostfile == "spark-1.local\n"


def test_plan_is_pure_and_deterministic(tmp_path):
    inv = pair_inventory(tmp_path)
    facts = {n: spark_facts(n, addresses={"enp1s0f1np1": ["192.168.100.40/24"]}) for n in ("spark1", "spark2")}
    before = copy.deepcopy(facts)
    first, second = plan_cluster(inv, facts), plan_cluster(inv, facts)
    assert facts == before
    assert first == second


def test_a_ring_of_three_serving_tp_2_launches_two_ranks_on_the_first_two_nodes():
    """The ring example (TP=2 preset, three nodes): trtllm-serve wants tp_size x pp_size ranks exactly, so the
    launch names them; the third node is left out."""
    inv = inventory("three-sparks-ring.yaml")
    plan = plan_cluster(inv)
    hosts = plan.hostfile.splitlines()
    assert inv.serving_nodes() == ["spark1", "spark2"]
    assert f"mpirun -np 2 --host {hosts[0]},{hosts[1]} --mca" in plan.launch.head_command()
    assert "--tp_size 2" in plan.launch.head_command() and "--pp_size" not in plan.launch.head_command()


def test_named_serving_nodes_and_pipeline_parallelism_in_the_launch(tmp_path):
    ring = inventory("three-sparks-ring.yaml")
    inv = inventory_from_yaml(
        "user: nvidia\nnodes: [{name: spark1, host: h1}, {name: spark2, host: h2}, {name: spark3, host: h3}, "
        "{name: spark4, host: h4}]\nfabric: {topology: switch}\n"
        "serve: {preset: qwen3-235b-eagle3, tp_size: 1, pp_size: 2, nodes: [spark1, spark4]}\n", tmp_path)
    plan = plan_cluster(inv)
    hosts = plan.hostfile.splitlines()
    assert f"-np 2 --host {hosts[0]},{hosts[3]} " in plan.launch.head_command()
    assert "--tp_size 1 --pp_size 2 " in plan.launch.head_command()
    assert "-np" not in plan_cluster(inventory("two-sparks.yaml")).launch.head_command()  # every node serves
    assert ring.serve_spec().world_size == 2
