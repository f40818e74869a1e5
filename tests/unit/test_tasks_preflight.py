"""preflight.node and preflight.cluster on recorded facts: one fixture per case in tests/fixtures/tasks/preflight.*/.

A case lists the problems (exactly, in order: they stop the run) and the warnings (exactly: the run goes on).
Preflight is read-only: no case may send a single command.
"""

from __future__ import annotations

import pytest

from sparkctl.taskgraph.task import TaskFailed
from sparkctl.tasks.context import RunOptions
from sparkctl.tasks.preflight.checks import ClusterPreflight, NodePreflight
from tests.taskkit import inventory, kit_from_case, make_kit, spark_facts, task_cases

NODE_CASES = task_cases("preflight.node")
CLUSTER_CASES = task_cases("preflight.cluster")


def outcome(task, ctx) -> list[str]:
    try:
        assert task.check(ctx) == []
    except TaskFailed as err:
        assert err.message.startswith(f"{len(err.details)} preflight problem(s) ")
        return err.details
    return []


@pytest.mark.parametrize("case", [c for _, c in NODE_CASES], ids=[n for n, _ in NODE_CASES])
def test_node_preflight(case):
    kit = kit_from_case(case)
    assert outcome(NodePreflight(), kit.node("spark1")) == case["expect"]["problems"]
    assert kit.warnings() == case["expect"]["warnings"]
    assert kit.log == []


@pytest.mark.parametrize("case", [c for _, c in CLUSTER_CASES], ids=[n for n, _ in CLUSTER_CASES])
def test_cluster_preflight(case):
    kit = kit_from_case(case)
    assert outcome(ClusterPreflight(), kit.cluster) == case["expect"]["problems"]
    assert kit.warnings() == case["expect"]["warnings"]
    assert kit.log == []


def test_node_preflight_rereads_facts():
    kit = make_kit(inventory(), {n: spark_facts(n) for n in ("spark1", "spark2")})
    ctx = kit.node("spark1")
    ctx.facts()
    ctx.shows = spark_facts("spark1", user="ubuntu")  # the node changed since the last read
    assert outcome(NodePreflight(), ctx) == ["logged in as 'ubuntu', the inventory says user 'nvidia'"]


def test_become_password_satisfies_sudo():
    facts = {n: spark_facts(n, sudo=False) for n in ("spark1", "spark2")}
    kit = make_kit(inventory(), facts, RunOptions(become_password="not-a-real-password"))
    assert outcome(NodePreflight(), kit.node("spark1")) == []


def test_single_spark_needs_no_fabric():
    kit = make_kit(inventory("single-spark.yaml"), {"spark1": spark_facts("spark1", up_ports=())})
    assert outcome(NodePreflight(), kit.node("spark1")) == []


def test_pinned_interface_absent_or_without_carrier(tmp_path):
    from tests.taskkit import inventory_from_yaml

    inv = inventory_from_yaml("""
user: nvidia
nodes:
  - {name: spark1, host: 10.0.0.11, fabric: {interfaces: [enp1s0f0np0, enp9s0f0np0]}}
  - {name: spark2, host: 10.0.0.12}
""", tmp_path)
    kit = make_kit(inv, {n: spark_facts(n) for n in ("spark1", "spark2")})
    assert outcome(NodePreflight(), kit.node("spark1")) == []  # judged across the cable, by preflight.cluster
    assert outcome(ClusterPreflight(), kit.cluster) == [
        "spark1 enp1s0f0np0 has no carrier with both ends up (spark2's end enp1s0f1np1 not set down): the cable or "
        "the port; reseat or replace the QSFP cable between spark1 port 0 and spark2 port 1",
        "spark1 enp9s0f0np0 does not exist (the CX-7 driver or card: `ibdev2netdev`); check the CX-7 driver "
        "(`ibdev2netdev` lists enp9s0f0np0?), or pin fabric.interfaces for this node"]


# --- why a planned twin is not Up, across the cable (rules/twins.py) ---------------------------------------------

PORT1 = """
user: nvidia
nodes:
  - {name: spark1, host: 10.0.0.11}
  - {name: spark2, host: 10.0.0.12}
fabric: {topology: pair, port: 1}
"""


def cluster_outcome(tmp_path, spark1: dict, spark2: dict, limit: tuple[str, ...] = ("spark1", "spark2")):
    from tests.taskkit import inventory_from_yaml

    inv = inventory_from_yaml(PORT1, tmp_path)
    facts = {"spark1": spark_facts("spark1", **spark1), "spark2": spark_facts("spark2", **spark2)}
    kit = make_kit(inv, {n: f for n, f in facts.items() if n in limit})
    node = {n: outcome(NodePreflight(), kit.node(n)) for n in limit}
    return node, outcome(ClusterPreflight(), kit.cluster), [e for e in kit.events if e.event == "warning"]


def test_a_twin_set_down_here_does_not_stop_the_run_and_its_peers_lost_carrier_is_said_under_it(tmp_path):
    node, problems, warnings = cluster_outcome(tmp_path, {"set_down": ("enP2p1s0f1np1",)},
                                               {"no_carrier": ("enP2p1s0f1np1",)})
    assert node == {"spark1": [], "spark2": []} and problems == []
    assert [(w.node, w.message, w.details) for w in warnings] == [(
        "spark1", "spark1 enP2p1s0f1np1 is administratively down; the network phase (network.netplan) brings it Up, "
                  "Up is part of the planned state",
        ["spark2 enP2p1s0f1np1 has no carrier because spark1's end is administratively down"])]
    assert not any("cable" in (w.message + " ".join(w.details)) for w in warnings)


def test_both_twins_set_down_are_one_warning_with_both_consequences_as_one(tmp_path):
    twins = ("enp1s0f1np1", "enP2p1s0f1np1")
    _, problems, warnings = cluster_outcome(tmp_path, {"no_carrier": twins}, {"set_down": twins})
    assert problems == []
    assert [(w.node, w.details) for w in warnings] == [
        ("spark2", ["spark1 enp1s0f1np1 and enP2p1s0f1np1 have no carrier because spark2's ends are "
                    "administratively down"])]


def test_no_carrier_with_both_ends_up_is_the_cable_said_once(tmp_path):
    _, problems, warnings = cluster_outcome(tmp_path, {"no_carrier": ("enP2p1s0f1np1",)},
                                            {"no_carrier": ("enP2p1s0f1np1",)})
    assert problems == [
        "spark1 enP2p1s0f1np1 has no carrier with both ends up (spark2's end enP2p1s0f1np1 not set down): the cable "
        "or the port (spark2 enP2p1s0f1np1 has no carrier either (the same cable)); reseat or replace the QSFP "
        "cable between spark1 port 1 and spark2 port 1"]
    assert warnings == []


def test_the_cable_in_another_port_is_named_on_its_node(tmp_path):
    # spark1's cable is in port 0, its far end in spark2's port 1 (which the inventory plans)
    _, problems, _ = cluster_outcome(tmp_path, {"up_ports": (0,)}, {"up_ports": (1,)})
    assert problems == [
        "spark1 enp1s0f1np1 and enP2p1s0f1np1 have no carrier: the cable is in port 0 of spark1, the inventory plans "
        "port 1; move the cable to port 1 on both nodes, or set fabric.port: auto in the inventory"]


def test_a_far_end_not_looked_at_is_said_so(tmp_path):
    _, problems, _ = cluster_outcome(tmp_path, {"no_carrier": ("enP2p1s0f1np1",)}, {}, limit=("spark1",))
    assert problems == [
        "spark1 enP2p1s0f1np1 has no carrier; the far end (spark2's end enP2p1s0f1np1) was not looked at: the "
        "cable, the port, or that end; reseat or replace the QSFP cable between spark1 port 1 and spark2 port 1"]


def test_behind_a_switch_the_far_end_is_the_switch_port():
    inv = inventory("four-sparks-switch.yaml")
    names = [n.name for n in inv.nodes]
    facts = {n: spark_facts(n) for n in names}
    facts[names[2]] = spark_facts(names[2], no_carrier=("enP2p1s0f1np1",))
    kit = make_kit(inv, facts)
    assert outcome(ClusterPreflight(), kit.cluster) == [
        f"{names[2]} enP2p1s0f1np1 has no carrier: the cable, the port, or the switch port; reseat or replace the "
        f"QSFP cable in {names[2]} port 1 (and its switch port)"]


def test_a_twin_set_down_behind_a_switch_is_repaired_too():
    inv = inventory("four-sparks-switch.yaml")
    names = [n.name for n in inv.nodes]
    facts = {n: spark_facts(n) for n in names}
    facts[names[1]] = spark_facts(names[1], set_down=("enp1s0f1np1",))
    kit = make_kit(inv, facts)
    assert outcome(ClusterPreflight(), kit.cluster) == []
    assert [w.node for w in kit.events if w.event == "warning"] == [names[1]]


def _ring_as_cabled_132(lldp: bool = True) -> dict:
    """The lab ring cabled 1,3,2, as each node's real lldpd reported it (tests/fixtures/lldp/)."""
    from pathlib import Path

    from sparkctl.facts import Lldp
    from sparkctl.facts.lldp import parse_lldp

    captures = Path(__file__).resolve().parents[1] / "fixtures" / "lldp"
    facts = {}
    for i in (1, 2, 3):
        f = spark_facts(f"spark{i}", up_ports=(0, 1))
        f.lldp = parse_lldp((captures / f"ring3-order132.spark{i}.json").read_text()) if lldp else \
            Lldp("absent", "lldpcli is not installed")
        facts[f"spark{i}"] = f
    return facts


def test_a_ring_cabled_in_another_order_is_refused_naming_node_port_and_neighbour():
    kit = make_kit(inventory("three-sparks-ring.yaml"), _ring_as_cabled_132())
    problems = outcome(ClusterPreflight(), kit.cluster)
    assert problems[0] == ("spark1 port 0 (enp1s0f0np0): the inventory wants spark2 port 1 here (the ring in "
                           "inventory order spark1 -> spark2 -> spark3 -> spark1, port 0 to the next node's port 1); "
                           "LLDP sees spark3 port 1 (enp1s0f1np1, enP2p1s0f1np1)")
    assert len(problems) == 7 and "sparkctl inventory init" in problems[-1]
    assert kit.log == []


def test_without_lldp_the_ring_is_not_refused_on_a_guess():
    kit = make_kit(inventory("three-sparks-ring.yaml"), _ring_as_cabled_132(lldp=False))
    assert outcome(ClusterPreflight(), kit.cluster) == []


def test_a_cable_lldp_places_on_the_other_port_is_said_once_with_its_far_end(tmp_path):
    from sparkctl.facts import Lldp, LldpNeighbor
    from tests.taskkit import inventory_from_yaml

    inv = inventory_from_yaml("""
user: nvidia
nodes:
  - {name: spark1, host: 10.0.0.11}
  - {name: spark2, host: 10.0.0.12}
fabric: {port: 1}
""", tmp_path)
    facts = {"spark1": spark_facts("spark1", up_ports=(0,)), "spark2": spark_facts("spark2", up_ports=(1,))}
    facts["spark1"].lldp = Lldp("ok", neighbors=[LldpNeighbor("enp1s0f0np0", "spark2", port_descr="enp1s0f1np1")])
    kit = make_kit(inv, facts)
    assert outcome(NodePreflight(), kit.node("spark1")) == []
    # one line for the one cause, the one that names the far end (LLDP), not the twins' fault besides it
    assert outcome(ClusterPreflight(), kit.cluster) == [
        "spark1 port 0 (enp1s0f0np0): a cable to spark2 port 1 (enp1s0f1np1) is on port 0, the inventory plans port "
        "1: move it to port 1 (or set fabric.port: auto)"]


@pytest.mark.parametrize("offset, problem", [
    (-3 * 86400, "its clock is 3 d behind this controller's (the node says 2026-01-01 00:00:00 UTC)"),
    (2 * 3600 + 600, "its clock is 2 h 10 min ahead of this controller's (the node says 2026-01-01 00:00:00 UTC)"),
    (299, None),  # minutes off for want of NTP: preflight.cluster warns about skew between nodes, not this
    (-4, None),
])
def test_a_clock_far_off_the_controller_s_is_refused_on_that_node(offset, problem):
    facts = spark_facts("spark1")
    facts.time = 1767225600.0  # 2026-01-01T00:00:00Z, what the node said
    # the controller's clock around the round trip that read it (1 s long)
    facts.controller_time = (facts.time - offset - 0.5, facts.time - offset + 0.5)
    kit = make_kit(inventory(), {"spark1": facts, "spark2": spark_facts("spark2")})
    problems = outcome(NodePreflight(), kit.node("spark1"))
    if problem is None:
        assert problems == []
    else:
        (only,) = problems
        assert only.startswith(problem + ": TLS downloads (docker pull, the Hub) fail on a clock that far off")


def test_a_round_trip_too_slow_to_say_is_not_blamed_on_the_clock():
    facts = spark_facts("spark1")
    facts.time = 1767225600.0
    facts.controller_time = (facts.time - 200, facts.time + 400)  # a 10-minute round trip brackets the node's time
    kit = make_kit(inventory(), {"spark1": facts, "spark2": spark_facts("spark2")})
    assert outcome(NodePreflight(), kit.node("spark1")) == []


# --- a node lost before preflight.cluster (issue 17): its cabling is unknown, not wrong ---------------------------

RING_AS_CABLED = """
user: nvidia
nodes:
  - {name: spark1, host: spark-1.local}
  - {name: spark3, host: spark-3.local}
  - {name: spark2, host: spark-2.local}
fabric: {topology: ring}
"""


def _lose(kit, node: str) -> None:
    from sparkctl.errors import Unreachable

    kit.node(node).shows = Unreachable(f"{node}: stopped answering", node=node)


def test_a_node_lost_before_it_was_read_is_not_called_miscabled(tmp_path):
    from tests.taskkit import inventory_from_yaml

    kit = make_kit(inventory_from_yaml(RING_AS_CABLED, tmp_path), _ring_as_cabled_132())
    _lose(kit, "spark2")
    assert outcome(ClusterPreflight(), kit.cluster) == []  # the healthy nodes go on
    assert kit.cluster.lost.why("spark2") == "spark2: stopped answering"
    assert kit.warnings() == []
    assert kit.log == []


def test_a_miscabled_ring_is_refused_with_a_node_lost_on_what_the_others_see():
    kit = make_kit(inventory("three-sparks-ring.yaml"), _ring_as_cabled_132())
    _lose(kit, "spark3")
    problems = outcome(ClusterPreflight(), kit.cluster)
    # spark1's lldpd still names spark3 (by its system name) at the far end of port 0, where spark2 belongs
    assert problems[0] == ("spark1 port 0 (enp1s0f0np0): the inventory wants spark2 port 1 here (the ring in "
                           "inventory order spark1 -> spark2 -> spark3 -> spark1, port 0 to the next node's port 1); "
                           "LLDP sees spark3 port 1 (enp1s0f1np1, enP2p1s0f1np1)")
    assert "spark2 port 0 (enp1s0f0np0): the inventory wants spark3 port 1 here" in problems[2]
    assert not [p for p in problems if p.startswith("spark3 ")]  # nothing said of the lost node's own ports
    assert "sparkctl inventory init" in problems[-1]
    assert kit.log == []
