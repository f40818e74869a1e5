"""`inventory init`: the inventory written from what the nodes report, and every assumption said aloud."""

from __future__ import annotations

import yaml

from sparkctl.inventory import load_inventory
from sparkctl.runs.inventory_init import describe_cluster
from tests.taskkit import spark_facts


def doc(result):
    return yaml.safe_load(result.text)


def facts(name, **kw):
    f = spark_facts(name, **kw)
    f.hostname = name
    return f


def test_a_pair_on_port_1_is_written_as_such_and_loads(tmp_path):
    result = describe_cluster(["10.0.0.11", "10.0.0.12"], [facts("spark-a"), facts("spark-b")], cluster="home")
    assert result.problems == [] and result.assumptions == []
    d = doc(result)
    assert d["fabric"] == {"topology": "pair", "port": 1, "mtu": 9000}
    assert [n["name"] for n in d["nodes"]] == ["spark-a", "spark-b"]
    path = tmp_path / "inventory.yaml"
    path.write_text(result.text)
    assert load_inventory(path).topology == "pair"


def test_different_up_ports_mean_auto_and_say_so():
    result = describe_cluster(["a", "b"], [facts("s1", up_ports=(0,)), facts("s2", up_ports=(1,))])
    assert doc(result)["fabric"]["port"] == "auto"
    assert any("different Up ports" in a for a in result.assumptions)
    assert all(f"# assumed: {a}" in result.text for a in result.assumptions)


def test_three_nodes_with_both_ports_up_are_assumed_a_ring():
    result = describe_cluster(["a", "b", "c"], [facts(n, up_ports=(0, 1)) for n in ("x", "y", "z")])
    assert doc(result)["fabric"]["topology"] == "ring"
    assert any("ring" in a for a in result.assumptions)


def test_problems_are_reported_not_guessed():
    result = describe_cluster(["a", "b"], [facts("s1", user="nvidia"), facts("s2", user="alice", up_ports=())])
    assert any("username differs" in p for p in result.problems)
    assert any("no QSFP port is Up on b" in p for p in result.problems)


def test_the_controller_itself_is_marked_local():
    result = describe_cluster(["10.0.0.11", "10.0.0.12"], [facts("s1"), facts("s2")],
                              controller_addrs=frozenset({"10.0.0.11"}))
    assert doc(result)["nodes"][0] == {"name": "s1", "host": "10.0.0.11", "local": True}
    assert "local" not in doc(result)["nodes"][1]


def _lab_ring_132() -> list:
    """The lab ring cabled 1,3,2 as its lldpd reported it (real captures, tests/fixtures/lldp/)."""
    from pathlib import Path

    from sparkctl.facts.lldp import parse_lldp

    lldp = Path(__file__).resolve().parents[1] / "fixtures" / "lldp"
    out = []
    for i in (1, 2, 3):
        f = facts(f"spark{i}", up_ports=(0, 1))
        f.lldp = parse_lldp((lldp / f"ring3-order132.spark{i}.json").read_text())
        out.append(f)
    return out


def test_a_ring_is_written_in_the_order_lldp_sees_head_first(tmp_path):
    result = describe_cluster(["10.0.0.11", "10.0.0.12", "10.0.0.13"], _lab_ring_132())
    d = doc(result)
    assert d["fabric"]["topology"] == "ring"
    assert [(n["name"], n["host"]) for n in d["nodes"]] == [("spark1", "10.0.0.11"), ("spark3", "10.0.0.13"),
                                                             ("spark2", "10.0.0.12")]
    assert result.problems == [] and not any("ring" in a for a in result.assumptions)
    assert any("spark1 -> spark3 -> spark2" in line for line in result.seen)
    assert "# seen with LLDP: a ring, cabled in the order" in result.text
    path = tmp_path / "inventory.yaml"
    path.write_text(result.text)
    assert load_inventory(path).topology == "ring"


def test_a_pair_seen_by_lldp_is_not_an_assumption():
    from sparkctl.facts import Lldp, LldpNeighbor

    a, b = facts("s1", up_ports=(0,)), facts("s2", up_ports=(1,))
    a.lldp = Lldp("ok", neighbors=[LldpNeighbor("enp1s0f0np0", "s2", port_descr="enp1s0f1np1")])
    result = describe_cluster(["a", "b"], [a, b])
    assert doc(result)["fabric"]["topology"] == "pair" and doc(result)["fabric"]["port"] == "auto"
    assert result.seen == ["the two nodes are cabled to each other"]
