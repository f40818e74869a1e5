"""--fix: the bootstrap tasks that repair each finding (its type in doctor/catalog.py), run as one bootstrap of just
those (runs/doctor.py); the findings a person must close are left alone and said so."""

from __future__ import annotations

from sparkctl.doctor.catalog import FINDINGS
from sparkctl.doctor.findings import Diagnosis, Finding
from sparkctl.taskgraph import Graph


def tasks_for(finding: Finding) -> tuple[str, ...]:
    kind = finding.type or FINDINGS.get(finding.id)
    return kind.tasks if kind is not None else ()


def repair_selection(diagnosis: Diagnosis, graph: Graph) -> tuple[set[str], list[Finding]]:
    """(tasks/phases to run with --only, the errors sparkctl cannot repair). Errors and warnings a task repairs
    are repaired; notes are not. Entries the graph lacks (a phase not built yet) count as not repairable."""
    only: set[str] = set()
    manual: list[Finding] = []
    for finding in diagnosis.findings:
        if finding.severity == "info":
            continue
        known = [t for t in tasks_for(finding) if t in graph or t in graph.phases]
        if known:
            only.update(known)
        elif finding.is_error:
            manual.append(finding)
    return only, manual
