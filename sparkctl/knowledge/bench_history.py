"""PURE: a fabric bench against earlier ones: which links and which NCCL figure got slower. A figure is compared
only with figures measured the same way (a link: the method, RDMA perftest or TCP iperf3, and the tool's settings;
the all-reduce: the message sizes, iterations and ranks), against the first recorded bench that measured it that
way and the last one that did."""

from __future__ import annotations

import json
from dataclasses import dataclass

#: Slower by more than this share counts as a regression (run-to-run noise of perftest is a few percent).
REGRESSION_FRACTION = 0.20
NCCL = "NCCL all-reduce"


@dataclass
class Regression:
    subject: str  # a link key, or "NCCL all-reduce"
    node: str  # the node to name in a finding (the client end of a link, the head for NCCL)
    now: float
    then: float
    unit: str
    then_time: str
    reference: str  # "first bench" | "last bench" (of those that measured the subject the same way)
    now_summary: str = ""
    how: str = ""  # how both figures were measured, in words

    @property
    def percent_lower(self) -> int:
        return round(100 * (1 - self.now / self.then)) if self.then else 0

    def line(self) -> str:
        return (f"{self.subject}: {self.now:.3g} {self.unit} now, {self.then:.3g} {self.unit} at the {self.reference} "
                f"({self.then_time}): {self.percent_lower}% slower")


@dataclass(frozen=True)
class Figure:
    value: float
    unit: str
    node: str
    summary: str
    how: str | None  # how it was measured, in words; None when the record does not say (nothing compares to it)


def _how_link(link: dict) -> str | None:
    settings = link.get("settings")
    if not link.get("method") or not isinstance(settings, dict):
        return None
    return f"{link['method']}, " + ", ".join(f"{k} {v}" for k, v in sorted(settings.items()))


def _how_nccl(nccl: dict) -> str | None:
    settings = nccl.get("settings")
    if not isinstance(settings, dict):
        return None
    return ", ".join(f"{k} {json.dumps(v) if isinstance(v, list) else v}" for k, v in sorted(settings.items()))


def figures(record: dict) -> dict[str, Figure]:
    """subject -> its figure in one recorded bench."""
    out = {}
    for link in record.get("links") or []:
        if link.get("gbps") is not None:
            out[link["key"]] = Figure(float(link["gbps"]), "Gb/s", link.get("client", ""), link.get("summary", ""),
                                      _how_link(link))
    nccl = record.get("nccl") or {}
    if nccl.get("busbw") is not None:
        out[NCCL] = Figure(float(nccl["busbw"]), "GB/s", (record.get("nodes") or [""])[0], nccl.get("summary", ""),
                           _how_nccl(nccl))
    return out


def comparable_keys(record: dict) -> set[tuple[str, str]]:
    """(subject, how) of each figure of a record that says how it was measured."""
    return {(subject, f.how) for subject, f in figures(record).items() if f.how is not None}


def _alike(history: list[dict], subject: str, now: Figure) -> list[tuple[dict, Figure]]:
    """The earlier records (newest first) that measured `subject` the way `now` was measured."""
    if now.how is None:
        return []
    return [(r, f) for r in history[1:] if (f := figures(r).get(subject)) and f.how == now.how and f.value > 0]


def compared(history: list[dict]) -> list[str]:
    """The newest record's subjects that an earlier record measured the same way."""
    return [s for s, now in figures(history[0]).items() if _alike(history, s, now)] if history else []


def regressions(history: list[dict], fraction: float = REGRESSION_FRACTION) -> list[Regression]:
    """The newest record (history[0], newest first) against the first and the last earlier record that measured
    the same subject the same way; one regression per subject, against the reference it fell furthest below."""
    if len(history) < 2:
        return []
    found: dict[str, Regression] = {}
    for subject, now in figures(history[0]).items():
        alike = _alike(history, subject, now)
        if not alike:
            continue
        references = [("first bench", *alike[-1])] + ([("last bench", *alike[0])] if len(alike) > 1 else [])
        for label, record, then in references:
            if now.value < then.value * (1 - fraction):
                candidate = Regression(subject, now.node, now.value, then.value, now.unit, record.get("time", "?"),
                                       label, now.summary, now.how or "")
                if subject not in found or candidate.percent_lower > found[subject].percent_lower:
                    found[subject] = candidate
    return list(found.values())


def incomparable(history: list[dict]) -> list[str]:
    """The newest record's figures that earlier records measured, but never the same way: one line each, saying
    how it was measured now and before (nothing to compare it with)."""
    if len(history) < 2:
        return []
    out = []
    for subject, now in figures(history[0]).items():
        before = [f for r in history[1:] if (f := figures(r).get(subject))]
        if before and not any(f.how is not None and f.how == now.how for f in before):
            earlier = sorted({f.how or "not recorded" for f in before})
            out.append(f"{subject}: no earlier bench measured it the same way (now: {now.how or 'not recorded'}; "
                       f"before: {'; '.join(earlier)})")
    return out
