"""PURE: who sends a repo to whom, round by round, when several peers lack it (model.copy).

A star (the head sends to every peer) is bound by the head's link: at 4+ nodes each round of a tree doubles the
senders instead. Each node that holds the repo, verified (the head first), sends to one node still waiting, over a
cable the two share where it can; a holder with no waiting neighbour sends over the relays (a ring's routes) only to a
node no holder is cabled to, which would otherwise wait for a relay of its own. On a pair it is the star.
"""

from __future__ import annotations

from collections.abc import Callable


def next_round(holders: list[str], waiting: list[str], cabled: Callable[[str, str], bool]) -> list[tuple[str, str]]:
    """(sender, receiver) pairs of one round; never empty while someone waits."""
    left = list(waiting)
    pairs: list[tuple[str, str]] = []
    for sender in holders:
        if not left:
            break
        near = [node for node in left if cabled(sender, node)]
        far = [node for node in left if not any(cabled(holder, node) for holder in holders)]
        choice = near or far
        if choice:
            pairs.append((sender, choice[0]))
            left.remove(choice[0])
    if not pairs and left:
        pairs.append((holders[0], left[0]))
    return pairs

