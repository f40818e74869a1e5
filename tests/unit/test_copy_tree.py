"""plan/copy_tree.py: who sends a repo to whom, round by round; a tree at 4+ nodes, the star on a pair."""

from __future__ import annotations

from sparkctl.plan.copy_tree import next_round


def ring(n: int):
    names = [f"spark{i + 1}" for i in range(n)]

    def cabled(a: str, b: str) -> bool:
        i, j = names.index(a), names.index(b)
        return (i - j) % n in (1, n - 1)
    return names, cabled


def every_round(holders, waiting, cabled):
    have, left, out = list(holders), list(waiting), []
    while left:
        pairs = next_round(have, left, cabled)
        assert pairs and all(s in have and r in left for s, r in pairs)
        assert len({s for s, _ in pairs}) == len(pairs)  # one receiver per sender and round
        out.append(pairs)
        have += [r for _, r in pairs]
        left = [n for n in left if n not in have]
    return out


def test_a_ring_of_four_is_a_tree_over_the_cables_in_two_rounds():
    names, cabled = ring(4)
    assert every_round(["spark1"], names[1:], cabled) == [
        [("spark1", "spark2")], [("spark1", "spark4"), ("spark2", "spark3")]]


def test_a_ring_of_eight_sends_over_cables_and_relays_only_to_a_node_no_holder_is_cabled_to():
    names, cabled = ring(8)
    assert every_round(["spark1"], names[1:], cabled) == [
        [("spark1", "spark2")],
        [("spark1", "spark8"), ("spark2", "spark3")],
        # spark1 and spark2 have no waiting neighbour left: they reach spark5 and spark6 over relays, which no holder
        # is cabled to; spark4 and spark7 come over their cables
        [("spark1", "spark5"), ("spark2", "spark6"), ("spark8", "spark7"), ("spark3", "spark4")]]


def test_a_switch_doubles_the_senders_each_round_and_a_pair_is_the_star():
    names = [f"spark{i}" for i in range(1, 9)]
    rounds = every_round(["spark1"], names[1:], lambda a, b: True)
    assert [len(r) for r in rounds] == [1, 2, 4]
    assert every_round(["spark1"], ["spark2"], lambda a, b: True) == [[("spark1", "spark2")]]


def test_peers_that_hold_it_already_send_from_the_first_round():
    names, cabled = ring(4)
    assert next_round(["spark1", "spark3"], ["spark2", "spark4"], cabled) == [
        ("spark1", "spark2"), ("spark3", "spark4")]
