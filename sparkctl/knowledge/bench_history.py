"""PURE: a fabric bench against an earlier one (the first recorded, "at bootstrap", and the one before it):
which links and which NCCL figure got slower."""

from __future__ import annotations

from dataclasses import dataclass

#: Slower by more than this share counts as a regression (run-to-run noise of perftest is a few percent).
REGRESSION_FRACTION = 0.20


@dataclass
class Regression:
    subject: str  # a link key, or "NCCL all-reduce"
    node: str  # the node to name in a finding (the client end of a link, the head for NCCL)
    now: float
    then: float
    unit: str
    then_time: str
    reference: str  # "first bench" | "last bench"
    now_summary: str = ""

    @property
    def percent_lower(self) -> int:
        return round(100 * (1 - self.now / self.then)) if self.then else 0

    def line(self) -> str:
        return (f"{self.subject}: {self.now:.3g} {self.unit} now, {self.then:.3g} {self.unit} at the {self.reference} "
                f"({self.then_time}): {self.percent_lower}% slower")


def _figures(record: dict) -> dict[str, tuple[float, str, str, str]]:
    """subject -> (value, unit, node, summary) of one recorded bench."""
    out = {}
    for link in record.get("links", []):
        if link.get("gbps") is not None:
            out[link["key"]] = (float(link["gbps"]), "Gb/s", link.get("client", ""), link.get("summary", ""))
    nccl = record.get("nccl") or {}
    if nccl.get("busbw") is not None:
        out["NCCL all-reduce"] = (float(nccl["busbw"]), "GB/s", (record.get("nodes") or [""])[0],
                                  nccl.get("summary", ""))
    return out


def regressions(history: list[dict], fraction: float = REGRESSION_FRACTION) -> list[Regression]:
    """The newest record (history[0], newest first) against the first ever and the previous one; one regression
    per subject, against the reference it fell furthest below."""
    if len(history) < 2:
        return []
    latest, previous, first = history[0], history[1], history[-1]
    now = _figures(latest)
    found: dict[str, Regression] = {}
    references = [("first bench", first)] + ([("last bench", previous)] if previous is not first else [])
    for label, record in references:
        for subject, (then, unit, _, _) in _figures(record).items():
            if subject not in now or then <= 0:
                continue
            value, _, node, summary = now[subject]
            if value < then * (1 - fraction):
                candidate = Regression(subject, node, value, then, unit, record.get("time", "?"), label, summary)
                if subject not in found or candidate.percent_lower > found[subject].percent_lower:
                    found[subject] = candidate
    return list(found.values())
