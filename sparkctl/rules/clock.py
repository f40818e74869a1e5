"""PURE: whether a node's clock is off, one rule for preflight and doctor.

Two limits. Between the machines, MAX_SKEW_S: NTP keeps clocks well within it, and beyond it the nodes' logs (and
NCCL's timestamps in them) no longer line up (preflight warns, doctor reports node.clock_skew). Against this
controller, MAX_CLOCK_OFFSET_S: a clock that far off is not drifting for want of NTP (seconds a day) but set wrong,
and TLS (docker pull, the Hugging Face Hub) refuses certificates "not yet valid" or "expired" (preflight refuses
that node before anything changes).
"""

from __future__ import annotations

from dataclasses import dataclass

from sparkctl.facts import Facts

MAX_SKEW_S = 2.0
MAX_CLOCK_OFFSET_S = 300.0


@dataclass(frozen=True)
class Skew:
    offsets: dict[str, float]   # node -> seconds ahead (+) or behind (-), only the nodes off by more than MAX_SKEW_S
    against: str                # what they were compared with, in words


def clock_skew(facts: dict[str, Facts]) -> Skew:
    """The nodes whose clock is more than MAX_SKEW_S off: from this machine's clock, beyond what the round trip of
    each node's read can explain (Facts.clock_offset: the decision never blames the network), when every node's
    facts carry it; else from the nodes' median (two nodes: the earlier clock)."""
    offsets = {node: f.clock_offset() for node, f in facts.items() if f.time}
    if offsets and all(offset is not None for offset in offsets.values()):
        return Skew({n: o for n, o in offsets.items() if o is not None and abs(o) > MAX_SKEW_S},
                    "this machine's clock")
    times = {node: f.time for node, f in facts.items() if f.time}
    if len(times) < 2:
        return Skew({}, "")
    ordered = sorted(times.values())
    median = ordered[(len(ordered) - 1) // 2]
    return Skew({n: t - median for n, t in times.items() if abs(t - median) > MAX_SKEW_S}, "the nodes' median")


def set_wrong(facts: Facts) -> bool:
    """The node's clock is so far from this machine's that it was set wrong (not only drifting)."""
    offset = facts.clock_offset()
    return offset is not None and abs(offset) > MAX_CLOCK_OFFSET_S
