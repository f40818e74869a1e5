"""preflight.node and preflight.cluster on recorded facts: one fixture per case in tests/fixtures/tasks/preflight.*/.

A case lists the problems (exactly, in order: they stop the run) and the warnings (exactly: the run goes on).
Preflight is read-only: no case may send a single command.
"""

from __future__ import annotations

import pytest

from sparkctl.engine.task import TaskFailed
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


def test_pinned_interface_absent_or_down(tmp_path):
    from tests.taskkit import inventory_from_yaml

    inv = inventory_from_yaml("""
user: nvidia
nodes:
  - {name: spark1, host: 10.0.0.11, fabric: {interfaces: [enp1s0f0np0, enp9s0f0np0]}}
  - {name: spark2, host: 10.0.0.12}
""", tmp_path)
    kit = make_kit(inv, {n: spark_facts(n) for n in ("spark1", "spark2")})
    assert outcome(NodePreflight(), kit.node("spark1")) == [
        "pinned fabric interface enp1s0f0np0 is Down", "pinned fabric interface enp9s0f0np0 is absent"]


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


def test_a_port_that_is_not_up_says_what_lldp_sees_on_the_other_port(tmp_path):
    from sparkctl.facts import Lldp, LldpNeighbor
    from tests.taskkit import inventory_from_yaml

    inv = inventory_from_yaml("""
user: nvidia
nodes:
  - {name: spark1, host: 10.0.0.11}
  - {name: spark2, host: 10.0.0.12}
fabric: {port: 1}
""", tmp_path)
    facts = {"spark1": spark_facts("spark1", up_ports=(0,)), "spark2": spark_facts("spark2")}
    facts["spark1"].lldp = Lldp("ok", neighbors=[LldpNeighbor("enp1s0f0np0", "spark2", port_descr="enp1s0f1np1")])
    kit = make_kit(inv, facts)
    (problem,) = outcome(NodePreflight(), kit.node("spark1"))
    assert problem.endswith("check the cable in port 1; LLDP: port 0 faces spark2 enp1s0f1np1")
