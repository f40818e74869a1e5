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
