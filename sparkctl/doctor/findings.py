"""What doctor reports: findings with stable ids, ordered for people (node, errors first, phase)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from sparkctl.doctor.remedies import Remedy, remedy_of
from sparkctl.rules.cabling import CablingMap

SEVERITIES = ("error", "warning", "info")
#: Findings about the whole cluster carry this node name.
CLUSTER = "(cluster)"
PHASE_ORDER = ("node", "preflight", "network", "ssh", "container", "mpi", "model", "serve", "verify")


@dataclass(frozen=True)
class Finding:
    """One thing wrong (or worth knowing) on one node.

    `id` is stable (tests and scripts match on it); `evidence` says what was seen against what was
    expected; `fix` is an exact command or the sparkctl command that repairs it.
    """

    id: str
    severity: str
    node: str
    summary: str
    evidence: str = ""
    fix: str = ""
    phase: str = "node"
    details: tuple[str, ...] = field(default=(), compare=False)

    def __post_init__(self) -> None:
        if self.severity not in SEVERITIES:
            raise ValueError(f"severity must be one of {SEVERITIES}, not {self.severity!r}")

    @property
    def is_error(self) -> bool:
        return self.severity == "error"

    @property
    def remedy(self) -> Remedy | None:
        """How it closes: the tasks that repair it, or why a person must (doctor/remedies.py)."""
        return remedy_of(self.id)

    def to_dict(self) -> dict:
        out = asdict(self)
        out["details"] = list(self.details)
        if not out["details"]:
            del out["details"]
        remedy = self.remedy
        if remedy is not None:
            out["closed_by"] = remedy.closed_by
        return out


def sort_findings(findings: list[Finding], node_order: list[str] | None = None) -> list[Finding]:
    """By node (inventory order, the cluster last), then errors first, then phase, then id."""
    order = {n: i for i, n in enumerate(node_order or [])}

    def key(f: Finding):
        node_rank = len(order) + 1 if f.node == CLUSTER else order.get(f.node, len(order))
        phase_rank = PHASE_ORDER.index(f.phase) if f.phase in PHASE_ORDER else len(PHASE_ORDER)
        return (node_rank, f.node, SEVERITIES.index(f.severity), phase_rank, f.id, f.summary)

    return sorted(dedupe(findings), key=key)


def dedupe(findings: list[Finding]) -> list[Finding]:
    seen: set[tuple[str, str, str]] = set()
    out = []
    for f in findings:
        k = (f.id, f.node, f.summary)
        if k not in seen:
            seen.add(k)
            out.append(f)
    return out


@dataclass
class Diagnosis:
    """A whole doctor run: every finding, and which nodes were looked at."""

    findings: list[Finding]
    nodes: list[str] = field(default_factory=list)
    #: the cabling map (sparkctl.rules.cabling.CablingMap) when the topology has cables
    cabling: CablingMap | None = None

    @property
    def errors(self) -> list[Finding]:
        return [f for f in self.findings if f.is_error]

    @property
    def healthy(self) -> bool:
        return not self.errors

    def ids(self, node: str | None = None, severity: str | None = None) -> set[str]:
        return {f.id for f in self.findings
                if (node is None or f.node == node) and (severity is None or f.severity == severity)}

    def to_dict(self) -> dict:
        return {"healthy": self.healthy, "findings": [f.to_dict() for f in self.findings]}
