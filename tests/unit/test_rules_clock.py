"""rules/clock.py: one rule for clock skew (preflight warns, doctor reports) and for a clock set wrong."""

from __future__ import annotations

from sparkctl.rules.clock import MAX_CLOCK_OFFSET_S, MAX_SKEW_S, clock_skew, set_wrong
from tests.taskkit import spark_facts

NOW = 1_800_000_000.0


def read_at(node: str, clock: float, round_trip: tuple[float, float] | None = (NOW - 0.2, NOW + 0.2)):
    facts = spark_facts(node)
    facts.time, facts.controller_time = clock, round_trip
    return facts


def test_each_node_is_judged_against_this_machine_s_clock_beyond_its_round_trip():
    skew = clock_skew({"spark1": read_at("spark1", NOW), "spark2": read_at("spark2", NOW + 3.5),
                       "spark3": read_at("spark3", NOW - MAX_SKEW_S - 0.5)})
    assert skew.against == "this machine's clock"
    assert {n: round(o, 1) for n, o in skew.offsets.items()} == {"spark2": 3.3, "spark3": -2.3}
    # a slow round trip explains what falls inside it: the network is never blamed
    slow = read_at("spark2", NOW + 3.5, (NOW - 5, NOW + 5))
    assert clock_skew({"spark2": slow}).offsets == {}


def test_without_this_machine_s_clock_the_nodes_median_is_the_reference():
    skew = clock_skew({"spark1": read_at("spark1", NOW, None), "spark2": read_at("spark2", NOW + 1.5, None),
                       "spark3": read_at("spark3", NOW + 5, None)})
    assert skew.against == "the nodes' median" and skew.offsets == {"spark3": 3.5}
    assert clock_skew({"spark1": read_at("spark1", NOW, None)}).offsets == {}


def test_a_clock_minutes_off_this_machine_s_was_set_wrong():
    assert set_wrong(read_at("spark1", NOW + MAX_CLOCK_OFFSET_S + 1))
    assert not set_wrong(read_at("spark1", NOW + MAX_CLOCK_OFFSET_S - 1))
    assert not set_wrong(read_at("spark1", NOW + 10 * MAX_CLOCK_OFFSET_S, None))  # not known: not judged
