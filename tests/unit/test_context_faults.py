"""What a task sees when a node is lost mid-run or a peer is slow: the real contexts on recorded facts.

A node's loss is the node's: a peer planning from it goes on with what was last read of it; the lost node's own
task is told it is unreachable. In a stage of node tasks, peers plan from each other's facts as the stage began,
so no node waits for a slower one in the middle of its own tasks.
"""

from __future__ import annotations

import pytest

from sparkctl.errors import Unreachable
from sparkctl.tasks.context import HandOver
from tests.taskkit import inventory, make_kit, spark_facts


def pair_kit():
    return make_kit(inventory(), {n: spark_facts(n) for n in ("spark1", "spark2")})


def test_a_peer_lost_while_planning_is_taken_out_and_the_planner_goes_on():
    kit = pair_kit()
    spark1, spark2 = kit.node("spark1"), kit.node("spark2")
    before = kit.cluster.plan()
    spark2.invalidate()
    spark2.shows = Unreachable("spark2 (10.0.0.12): stopped answering", node="spark2")
    plan = spark1.plan()  # planned from what was last read of spark2
    assert plan.nodes["spark2"].netplan == before.nodes["spark2"].netplan
    assert kit.cluster.lost.why("spark2") == "spark2 (10.0.0.12): stopped answering"
    assert kit.cluster.lost.during("spark2") == "reading its facts for a peer"
    with pytest.raises(Unreachable) as lost:
        spark2.plan()  # the lost node's own task: nothing more to do on it in this run
    assert lost.value.node == "spark2"
    with pytest.raises(Unreachable):
        spark2.run("true")
    assert kit.transport("spark2").calls == []  # never reached again


def test_a_node_never_read_before_it_was_lost_is_planned_without_facts():
    kit = pair_kit()
    kit.node("spark2").shows = Unreachable("spark2: no route to host", node="spark2")
    assert set(kit.cluster.facts_by_node()) == {"spark1"}
    assert kit.node("spark1").plan().nodes["spark2"].netplan  # the inventory's defaults still plan it


def test_in_a_stage_of_node_tasks_peers_plan_from_the_facts_as_the_stage_began():
    kit = pair_kit()
    spark1, spark2 = kit.node("spark1"), kit.node("spark2")
    kit.cluster.facts_by_node()
    spark2.invalidate()  # spark2 changed in the stage before: read again at the barrier
    kit.cluster.begin_stage(node_scope=True)
    assert spark2.facts_round_trips == 2
    spark2.invalidate()  # spark2 changes itself in this stage (a slow docker pull, say)
    spark1.plan()
    assert spark2.facts_round_trips == 2  # spark1 did not wait to read spark2 again
    spark2.facts()
    assert spark2.facts_round_trips == 3  # spark2's own task reads itself fresh
    kit.cluster.begin_stage(node_scope=False)  # a cluster task: every read is fresh again
    spark2.invalidate()
    kit.cluster.plan()
    assert spark2.facts_round_trips == 4


READS: HandOver[str] = HandOver("verify")


def test_a_hand_over_survives_a_stage_barrier_that_pinned_the_same_facts():
    """A no-op's verify.fabric takes container.ssh's reads across the model phase's node stages: pinning the same
    facts again is no new generation. Facts read again at the barrier are, and void what was handed over."""
    kit = pair_kit()
    kit.cluster.facts_by_node()
    kit.cluster.begin_stage(node_scope=True)
    kit.cluster.hand_over(READS, "reads")
    kit.cluster.begin_stage(node_scope=False)
    kit.cluster.begin_stage(node_scope=True)
    assert kit.cluster.take_over(READS) == "reads"
    kit.cluster.hand_over(READS, "reads")
    kit.node("spark2").invalidate()
    kit.cluster.begin_stage(node_scope=True)  # spark2 read again: peers plan from new facts
    assert kit.cluster.take_over(READS) is None


def test_facts_are_read_again_once_when_the_connection_was_closed_under_them():
    kit = pair_kit()
    spark2, shows = kit.node("spark2"), kit.node("spark2").shows
    closed = Unreachable("spark2: closed the connection while a command ran", node="spark2", closed=True)
    silent = Unreachable("spark2: stopped answering while a command ran", node="spark2")

    def answers(*first):
        queue = list(first)

        def read(side_reads=None):
            if queue:
                raise queue.pop(0)
            return shows
        return read

    spark2._read_facts = answers(closed)  # sshd restarted under a read: reading again is safe
    assert spark2.facts().hostname == "spark2"
    spark2.invalidate()
    spark2._read_facts = answers(silent)  # silence: the node is gone, waiting again would only double it
    with pytest.raises(Unreachable):
        spark2.facts()
    spark2.invalidate()
    spark2._read_facts = answers(closed, closed)  # closed twice: not a restart, the node is out
    with pytest.raises(Unreachable):
        spark2.facts()
