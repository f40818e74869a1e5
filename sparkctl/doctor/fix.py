"""--fix: the bootstrap tasks that repair each finding (doctor/remedies.py), run as one bootstrap of just those
(runs/doctor.py); the findings a person must close are left alone and said so."""

from __future__ import annotations

from sparkctl.doctor.findings import Diagnosis, Finding
from sparkctl.doctor.remedies import tasks_for_id
from sparkctl.engine import Graph


def tasks_for(finding: Finding) -> tuple[str, ...]:
    return tasks_for_id(finding.id)


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
