"""What doctor reports: findings with stable ids, ordered for people (node, errors first, phase), each made by its
FindingType (doctor/catalog.py holds one per id: what it means, how grave, its phase, and how it closes)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Literal, get_args

from sparkctl.rules.cabling import CablingMap

Severity = Literal["error", "warning", "info"]
Phase = Literal["node", "preflight", "network", "ssh", "container", "mpi", "model", "serve", "verify"]
SEVERITIES: tuple[Severity, ...] = get_args(Severity)
#: Findings about the whole cluster carry this node name.
CLUSTER = "(cluster)"
PHASE_ORDER: tuple[Phase, ...] = get_args(Phase)

#: What a person deals with when sparkctl cannot: kind -> how the table and the findings name it.
KINDS: dict[str, str] = {
    "cable": "a cable or a port",
    "hardware": "the machine itself (power, driver, hardware)",
    "firmware": "firmware or a driver release",
    "password": "a password or a key only you hold",
    "account": "an account or a permission",
    "disk": "disk space",
    "process": "a process sparkctl did not start",
    "inventory": "a choice in the inventory",
    "software": "software sparkctl does not install",
    "site": "the site's network (a switch, a firewall, time servers)",
    "note": "nothing to repair",
    "sparkctl": "a bug in sparkctl",
}


@dataclass(frozen=True)
class FindingType:
    """One finding id: what it means (`about`), how grave a finding of it is and in which phase it shows (a check
    may report one graver or milder, and says why there), and how it closes: exactly one of `tasks` (bootstrap task
    or phase names that repair it: `doctor --fix` runs them, a bootstrap rerun does too) and `person` (why sparkctl
    cannot, and so what a person does), with `kind` (a key of KINDS). `finding()` makes a finding of it."""

    id: str
    severity: Severity
    phase: Phase
    about: str
    tasks: tuple[str, ...] = ()
    person: str = ""
    kind: str = ""

    def __post_init__(self) -> None:
        if bool(self.tasks) == bool(self.person):
            raise ValueError(f"a finding type has tasks or a person's reason, exactly one: {self.id}")
        if self.person and self.kind not in KINDS:
            raise ValueError(f"{self.id}: kind must be one of {sorted(KINDS)}, not {self.kind!r}")
        if self.severity not in SEVERITIES or self.phase not in PHASE_ORDER:
            raise ValueError(f"{self.id}: severity {self.severity!r} or phase {self.phase!r} unknown")

    @property
    def repairable(self) -> bool:
        return bool(self.tasks)

    @property
    def closed_by(self) -> dict:
        """As --json says it: {"tasks": [...]} or {"person": kind, "why": ...}."""
        return {"tasks": list(self.tasks)} if self.tasks else {"person": self.kind, "why": self.person}

    @property
    def needs_person(self) -> str:
        """The reason, as a finding says it: 'needs you (a cable or a port): ...'."""
        return f"needs you ({KINDS[self.kind]}): {self.person}" if self.person else ""

    @property
    def fix_line(self) -> str:
        """The fix a finding of it says when its check has no more exact one."""
        if self.tasks:
            return f"sparkctl doctor --fix (runs {', '.join(self.tasks)}; a bootstrap rerun does too)"
        return self.needs_person


@dataclass(frozen=True)
class Finding:
    """One thing wrong (or worth knowing) on one node.

    `id` is stable (tests and scripts match on it); `evidence` says what was seen against what was
    expected; `fix` is an exact command or the sparkctl command that repairs it.
    """

    id: str
    severity: Severity
    node: str
    summary: str
    evidence: str = ""
    fix: str = ""
    phase: Phase = "node"
    details: tuple[str, ...] = field(default=(), compare=False)
    #: what made it (doctor/catalog.py); None only for one made by hand (tests)
    type: FindingType | None = field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        if self.severity not in SEVERITIES:
            raise ValueError(f"severity must be one of {SEVERITIES}, not {self.severity!r}")

    @property
    def is_error(self) -> bool:
        return self.severity == "error"

    @property
    def remedy(self) -> FindingType | None:
        """How it closes: the tasks that repair it, or why a person must (doctor/catalog.py)."""
        return self.type

    def to_dict(self) -> dict:
        out = {k: v for k, v in asdict(self).items() if k != "type"}
        out["details"] = list(self.details)
        if not out["details"]:
            del out["details"]
        remedy = self.remedy
        if remedy is not None:
            out["closed_by"] = remedy.closed_by
        return out


def finding(kind: FindingType, node: str, summary: str, evidence: str = "", fix: str = "", *,
            severity: Severity | None = None, phase: Phase | None = None,
            details: tuple[str, ...] | list[str] = ()) -> Finding:
    """A finding of this type on `node`: its severity and phase unless the check says otherwise, and the type's own
    fix line unless the check has a more exact one."""
    return Finding(kind.id, severity or kind.severity, node, summary, evidence=evidence, fix=fix or kind.fix_line,
                   phase=phase or kind.phase, details=tuple(details), type=kind)


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
