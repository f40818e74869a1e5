"""LLDP: lldpcli's JSON (every shape it has, from real captures in tests/fixtures/lldp/) and the cabling map built
from it: the wrong cable named by node, port and the neighbour seen; the ring order proposed from the wire."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sparkctl.facts import Lldp, LldpNeighbor
from sparkctl.facts.lldp import ABSENT, parse_lldp, parse_neighbors_json
from sparkctl.rules.cabling import SWITCH, cabling_map, propose
from tests.taskkit import inventory, inventory_from_yaml, spark_facts

LLDP = Path(__file__).resolve().parents[1] / "fixtures" / "lldp"


def capture(name: str) -> str:
    return (LLDP / name).read_text()


def test_several_neighbours_are_a_list_of_one_key_objects():
    neighbors = parse_neighbors_json(capture("ring3-order132.spark1.json"))
    assert [(n.interface, n.system, n.port_descr) for n in neighbors] == [
        ("enp1s0f0np0", "spark3", "enp1s0f1np1"), ("enP2p1s0f0np0", "spark3", "enP2p1s0f1np1"),
        ("enp1s0f1np1", "spark2", "enp1s0f0np0"), ("enP2p1s0f1np1", "spark2", "enP2p1s0f0np0")]
    first = neighbors[0]
    assert first.port_id_type == "mac" and len(first.port_id) == 17 and first.port_name == "enp1s0f1np1"
    assert first.mgmt_ips and first.chassis_id


def test_one_neighbour_is_an_object_not_a_list():
    assert isinstance(json.loads(capture("one-neighbour.json"))["lldp"]["interface"], dict)
    neighbors = parse_neighbors_json(capture("one-neighbour.json"))
    assert [(n.interface, n.system, n.port_descr) for n in neighbors] == [("enp1s0f0np0", "spark3", "enp1s0f1np1")]


def test_no_neighbour_is_an_empty_lldp_object():
    assert parse_lldp(capture("no-neighbours.json")) == Lldp("ok", neighbors=[])


def test_lldpd_stopped_absent_and_denied_are_told_apart():
    stopped = parse_lldp(capture("lldpd-stopped.txt"))
    assert stopped.status == "stopped" and "/run/lldpd.socket" in stopped.detail
    assert parse_lldp(capture("nonroot.txt")).status == "denied"
    assert parse_lldp(ABSENT + "\n").status == "absent"
    assert parse_lldp("garbage").status == "error"


def test_a_chassis_without_a_name_and_two_management_addresses():
    # json_element_cleanup keys an object by its `name` only when it has one; a list of two stays a list
    text = json.dumps({"lldp": {"interface": {"enp1s0f1np1": {
        "via": "LLDP", "chassis": {"id": {"type": "mac", "value": "00:11:22:33:44:55"},
                                   "mgmt-ip": ["10.0.0.2", "fe80::1"]},
        "port": {"id": {"type": "ifname", "value": "Ethernet12"}, "descr": "to spark1"}}}}})
    (n,) = parse_neighbors_json(text)
    assert (n.system, n.chassis_id, n.port_name, n.mgmt_ips) == ("", "00:11:22:33:44:55", "Ethernet12",
                                                                ["10.0.0.2", "fe80::1"])


def _ring_facts(captured: bool = True) -> dict:
    """The three nodes of the lab ring cabled 1,3,2 (captures), each with both ports Up."""
    facts = {}
    for i in (1, 2, 3):
        f = spark_facts(f"spark{i}", up_ports=(0, 1))
        f.lldp = parse_lldp(capture(f"ring3-order132.spark{i}.json")) if captured else Lldp("stopped", "x")
        facts[f"spark{i}"] = f
    return facts


def test_a_ring_cabled_out_of_order_names_each_wrong_cable():
    m = cabling_map(inventory("three-sparks-ring.yaml"), _ring_facts())
    assert len(m.problems) == 6 and not m.lldp_unavailable
    row = m.row("spark1", 0)
    assert row.wanted == "spark2 port 1" and row.source == "lldp (spark1, spark3)"
    assert "spark1 port 0 (enp1s0f0np0): the inventory wants spark2 port 1 here" in row.problem
    assert row.problem.endswith("LLDP sees spark3 port 1 (enp1s0f1np1, enP2p1s0f1np1)")


def test_the_same_ring_in_its_cabled_order_has_no_problem(tmp_path):
    text = (Path(__file__).resolve().parents[2] / "inventories" / "three-sparks-ring.yaml").read_text()
    reordered = text.replace("name: spark2", "name: TMP").replace("name: spark3", "name: spark2") \
        .replace("name: TMP", "name: spark3")
    inv = inventory_from_yaml(reordered, tmp_path)
    assert [n.name for n in inv.nodes] == ["spark1", "spark3", "spark2"]
    m = cabling_map(inv, _ring_facts())
    assert m.problems == [] and all(r.source.startswith("lldp") for r in m.rows)


def test_one_end_with_lldp_is_enough_to_map_a_cable():
    facts = _ring_facts()
    facts["spark2"].lldp = Lldp("stopped", "lldpd is not running")
    m = cabling_map(inventory("three-sparks-ring.yaml"), facts)
    assert m.lldp_unavailable == {"spark2": "lldpd is not running"}
    row = m.row("spark2", 1)  # cabled to spark3 port 0, seen by spark3's lldpd
    assert row.source == "lldp (spark3)" and "spark3 port 0" in row.far and row.problem


def test_without_lldp_the_map_is_inferred_and_refuses_nothing():
    m = cabling_map(inventory("three-sparks-ring.yaml"), _ring_facts(captured=False))
    assert m.inferred and m.problems == []
    assert {r.source for r in m.rows} == {"inferred"}
    assert m.row("spark1", 0).far == "carrier, no LLDP (assumed spark2 port 1)"


def _neighbor(local: str, system: str, port: str) -> LldpNeighbor:
    return LldpNeighbor(interface=local, system=system, port_id=port, port_id_type="ifname", port_descr=port)


def test_a_pair_cable_on_the_wrong_port_is_named(tmp_path):
    text = (Path(__file__).resolve().parents[2] / "inventories" / "two-sparks.yaml").read_text()
    inv = inventory_from_yaml(text.replace("port: auto", "port: 1"), tmp_path)
    assert inv.fabric.port == 1
    s1, s2 = spark_facts("spark1", up_ports=(1,)), spark_facts("spark2", up_ports=(0,))
    s1.lldp = Lldp("ok", neighbors=[_neighbor("enp1s0f1np1", "spark2", "enp1s0f0np0")])
    s2.lldp = Lldp("ok", neighbors=[_neighbor("enp1s0f0np0", "spark1", "enp1s0f1np1")])
    m = cabling_map(inv, {"spark1": s1, "spark2": s2})
    (row,) = m.problems
    assert row.node == "spark2" and row.port == 0
    assert row.problem.startswith("spark2 port 0 (enp1s0f0np0): a cable to spark1 port 1 (enp1s0f1np1) is on "
                                  "port 0, the inventory plans port 1")


def test_a_switch_is_not_a_miscabling_but_a_direct_cable_on_a_switch_inventory_is():
    inv = inventory("four-sparks-switch.yaml")
    facts = {n.name: spark_facts(n.name, up_ports=(inv.fabric.port,) if inv.fabric.port in (0, 1) else (1,))
             for n in inv.nodes}
    twin = next(iter(facts["spark1"].up_ports().values()))[0]
    for name, f in facts.items():
        f.lldp = Lldp("ok", neighbors=[_neighbor(twin, "leaf-1", f"Ethernet{name[-1]}")])
    m = cabling_map(inv, facts)
    assert m.problems == [] and m.row("spark1", int(twin[-1])).wanted == SWITCH
    facts["spark1"].lldp = Lldp("ok", neighbors=[_neighbor(twin, "spark2", twin)])
    assert [r.node for r in cabling_map(inv, facts).problems] == ["spark1", "spark2"]


@pytest.mark.parametrize("head,order", [("spark1", ["spark1", "spark3", "spark2"]),
                                        ("spark2", ["spark2", "spark1", "spark3"])])
def test_the_ring_order_is_proposed_from_the_wire_head_first(head, order):
    facts = _ring_facts()
    names = [head] + [n for n in facts if n != head]
    proposal = propose(names, facts)
    assert (proposal.topology, proposal.order, proposal.problems) == ("ring", order, [])


def test_a_ring_with_a_port_0_to_port_0_cable_has_no_order():
    facts = {f"spark{i}": spark_facts(f"spark{i}", up_ports=(0, 1)) for i in (1, 2, 3)}
    facts["spark1"].lldp = Lldp("ok", neighbors=[_neighbor("enp1s0f0np0", "spark2", "enp1s0f0np0")])
    proposal = propose(list(facts), facts)
    assert proposal.order is None
    assert "spark1 port 0 is cabled to spark2 port 0: a ring cables port 0 to the next node's port 1" in \
        proposal.problems


def test_nodes_that_face_a_switch_are_proposed_as_a_switch_and_no_lldp_proposes_nothing():
    facts = {f"spark{i}": spark_facts(f"spark{i}") for i in (1, 2, 3)}
    assert propose(list(facts), facts).topology is None
    for f in facts.values():
        f.lldp = Lldp("ok", neighbors=[_neighbor("enp1s0f1np1", "leaf-1", "Ethernet1")])
    assert propose(list(facts), facts).topology == SWITCH.strip("()")
