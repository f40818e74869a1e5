"""`sparkctl doctor`: look at the whole cluster read-only; per node, what is wrong, why, and the exact fix."""

from __future__ import annotations

import dataclasses
import sys

import click
from rich.console import Console
from rich.text import Text

from sparkctl.cli.console import console as rich_console
from sparkctl.cli.json_view import JsonView
from sparkctl.cli.options import become_password, csv_set, load
from sparkctl.cli.report import json_line, json_option, report_line, verbose_option
from sparkctl.cli.views import ConsoleView
from sparkctl.doctor.catalog import FINDINGS, remedies_markdown
from sparkctl.doctor.findings import CLUSTER, KINDS, Diagnosis, Finding
from sparkctl.errors import BadInput
from sparkctl.exitcodes import ExitStatus
from sparkctl.rules.cabling import CablingMap
from sparkctl.runs.doctor import STDOUT, DoctorRequest, Repair, finding_event, run_doctor
from sparkctl.secrets import redacted
from sparkctl.taskgraph.runner import DEFAULT_FORKS

_STYLE = {"error": "bold red", "warning": "yellow", "info": "blue"}


def _shown(f: Finding) -> Finding:
    """The finding as it may be printed: the one redaction over every text of it."""
    texts = ("summary", "evidence", "fix", "details")
    shown = redacted({k: list(f.details) if k == "details" else getattr(f, k) for k in texts})
    return dataclasses.replace(f, **{**shown, "details": tuple(shown["details"])})


def render_diagnosis(console: Console, diagnosis: Diagnosis, *, verbose: bool = False) -> None:
    """Grouped by node (inventory order, the cluster last), errors first, then by phase."""
    by_node: dict[str, list[Finding]] = {}
    for f in diagnosis.findings:
        by_node.setdefault(f.node, []).append(f)
    for node in [*diagnosis.nodes, CLUSTER]:
        findings = [_shown(f) for f in by_node.pop(node, [])]
        if node == CLUSTER and not findings:
            continue
        console.print(Text(node, style="bold"))
        shown = [f for f in findings if f.severity != "info" or verbose]
        if not [f for f in findings if f.severity != "info"]:
            console.print(Text("  ok", style="green"))
        for f in shown:
            line = Text("  ")
            line.append(f"{f.severity:<8}", style=_STYLE[f.severity])
            line.append(f"{f.id} ", style="bold")
            line.append(f"[{f.phase}] ", style="dim")
            line.append(f.summary)
            console.print(line, soft_wrap=True)
            if f.evidence:
                console.print(Text(f"      seen: {f.evidence}"), soft_wrap=True)
            if f.fix:
                console.print(Text(f"      fix:  {f.fix}", style="cyan"), soft_wrap=True)
            if f.severity != "info" and f.remedy is not None:
                console.print(Text(f"      {_closes(f)}", style="dim"), soft_wrap=True)
            for detail in f.details:
                console.print(Text(f"      | {detail}", style="dim"), soft_wrap=True)
    if diagnosis.cabling is not None and diagnosis.cabling.rows:
        render_cabling(console, diagnosis.cabling)
    errors = len(diagnosis.errors)
    warnings = sum(1 for f in diagnosis.findings if f.severity == "warning")
    infos = sum(1 for f in diagnosis.findings if f.severity == "info")
    verdict = Text("healthy", style="bold green") if diagnosis.healthy else Text("unhealthy", style="bold red")
    console.print(Text(f"\n{errors} error(s), {warnings} warning(s)"
                       + (f", {infos} note(s) (-v shows them)" if infos and not verbose else "")
                       + f" on {len(diagnosis.nodes)} node(s): ").append(verdict))


def list_remedies(as_json: bool) -> None:
    """--list: the Markdown table, or with --json a `remedy` line per finding id and a `report` line."""
    if not as_json:
        click.echo(remedies_markdown(), nl=False)
        return
    for finding_id, remedy in sorted(FINDINGS.items()):
        json_line({"event": "remedy", "id": finding_id, "about": remedy.about, "closed_by": remedy.closed_by})
    report_line("doctor --list", ExitStatus.SUCCESS, remedies=len(FINDINGS), kinds=dict(KINDS))


def cabling_report(cabling: CablingMap) -> dict:
    return {"inferred": cabling.inferred, "lldp_unavailable": dict(cabling.lldp_unavailable),
            "ports": [row.to_dict() for row in cabling.rows]}


def render_cabling(console: Console, cabling: CablingMap) -> None:
    """Each QSFP port: its twins, what is at the far end and how that is known, what the inventory wants there."""
    how = "inferred from carrier (no LLDP)" if cabling.inferred else "from LLDP"
    if cabling.lldp_unavailable and not cabling.inferred:
        how += "; no LLDP on " + ", ".join(cabling.lldp_unavailable)
    console.print(Text(f"\ncabling ({how})", style="bold"))
    for row in cabling.rows:
        line = Text(f"  {row.node} port {row.port} ")
        line.append(f"{'/'.join(row.interfaces)} ", style="dim")
        line.append(f"-> {row.far} ")
        line.append(f"[{row.source}]", style="dim")
        if row.problem:
            line.append(f"  wrong: the inventory wants {row.wanted}", style="bold red")
        console.print(line, soft_wrap=True)


@click.command("doctor")
@click.argument("file", type=click.Path(), required=False)
@click.option("--list", "list_ids", is_flag=True,
              help="Print every finding id with the bootstrap tasks that repair it or why a person must (no FILE).")
@json_option
@click.option("--fix", is_flag=True, help="Run the bootstrap tasks that repair what was found (errors and warnings), "
              "then check again; what needs a person is left alone, with the reason.")
@click.option("--bundle", "bundle_path", type=click.Path(dir_okay=False),
              help="Write a support bundle (tar.gz, secrets redacted) to this path ('-': stdout; the report then "
                   "goes to stderr).")
@click.option("--limit", metavar="NODE[,NODE]", help="Diagnose (and with --fix, change) these nodes only; every node "
                                                     "is read: what the cluster shares is judged from all of them.")
@click.option("--forks", type=click.IntRange(1, 256), default=DEFAULT_FORKS, show_default=True)
@verbose_option
@click.option("-K", "--ask-become-pass", is_flag=True, help="Prompt once for the sudo password.")
@click.option("--become-password-file", type=click.Path(dir_okay=False, exists=True),
              help="Read the sudo password from this file (first line).")
def doctor_command(file: str | None, list_ids: bool, as_json: bool, fix: bool, bundle_path: str | None,
                   limit: str | None, forks: int, verbose: int, ask_become_pass: bool,
                   become_password_file: str | None) -> None:
    """Find what is broken on the cluster, why, and how to fix it (read-only unless --fix).

    Exit 0 when no errors are found, 1 otherwise. With --json: one `finding` line per finding, the repair run's
    events with --fix, then a `report` line (docs/events.md).
    """
    if list_ids:
        list_remedies(as_json)
        return
    if file is None:
        raise click.UsageError("Missing argument 'FILE'.")
    if bundle_path == STDOUT and as_json:
        raise BadInput("--bundle - and --json both want stdout", hint="write the bundle to a file")
    inventory = load(file, warn=not as_json)
    request = DoctorRequest(limit=csv_set(limit), forks=forks, fix=fix, bundle=bundle_path,
                            become_password=become_password(ask_become_pass, become_password_file))
    console = rich_console(stderr=as_json or bundle_path == STDOUT, highlight=False, soft_wrap=True)
    repair_view = ConsoleView(console, verbosity=verbose) if not as_json else JsonView(sys.stdout)

    def before_repair(diagnosis: Diagnosis) -> None:
        if as_json:
            _finding_lines(diagnosis, "first")
        else:
            render_diagnosis(console, diagnosis, verbose=verbose > 0)

    try:
        outcome = run_doctor(inventory, request, before_repair=before_repair, repair_emit=repair_view)
    finally:
        repair_view.close()
    diagnosis = outcome.diagnosis
    # doctor's 1 is a task's: something is wrong that a run (or a person) must change
    exit_status = ExitStatus.SUCCESS if diagnosis.healthy else ExitStatus.TASK_FAILED
    if as_json:
        _finding_lines(diagnosis, "after-fix" if outcome.repair is not None else None)
        extra: dict = {}
        if outcome.repair is not None:
            extra["fix"] = _repair_report(outcome.repair)
        if diagnosis.cabling is not None:
            extra["cabling"] = cabling_report(diagnosis.cabling)
        if outcome.bundle_sha256:
            extra["bundle"] = {"path": bundle_path, "sha256": outcome.bundle_sha256}
        report_line("doctor", exit_status, healthy=diagnosis.healthy, nodes=diagnosis.nodes,
                    errors=len(diagnosis.errors), **_counts(diagnosis), **extra)
        sys.exit(int(exit_status))
    if outcome.repair is not None:
        _show_repair(console, outcome.repair)
        console.print(Text("\nafter the repair:", style="bold"))
    render_diagnosis(console, diagnosis, verbose=verbose > 0)
    if outcome.bundle_bytes is not None:
        sys.stdout.buffer.write(outcome.bundle_bytes)
        sys.stdout.buffer.flush()
        console.print(Text(f"bundle: stdout\nsha256: {outcome.bundle_sha256}"))
    elif bundle_path:
        console.print(Text(f"bundle: {bundle_path}\nsha256: {outcome.bundle_sha256}"))
    sys.exit(int(exit_status))


def _counts(diagnosis: Diagnosis) -> dict[str, int]:
    return {"warnings": sum(1 for f in diagnosis.findings if f.severity == "warning"),
            "notes": sum(1 for f in diagnosis.findings if f.severity == "info")}


def _finding_lines(diagnosis: Diagnosis, which: str | None) -> None:
    for finding in diagnosis.findings:
        json_line(finding_event(finding, which).to_dict())


def _closes(f: Finding) -> str:
    remedy = f.remedy
    assert remedy is not None
    if remedy.repairable:
        return f"repair: `sparkctl doctor --fix` or a bootstrap rerun runs {', '.join(remedy.tasks)}"
    return remedy.needs_person


def _repair_report(repair: Repair) -> dict:
    return {"ran": sorted(repair.ran),
            "exit_status": int(repair.result.exit_status()) if repair.result is not None else None,
            "needs_you": [f.to_dict() for f in repair.needs_you]}


def _show_repair(console: Console, repair: Repair) -> None:
    if not repair.ran:
        console.print(Text("nothing sparkctl can repair by itself; see each fix above", style="yellow"))
    for f in repair.needs_you:
        why = f.remedy.needs_person if f.remedy is not None else "needs you"
        console.print(Text(f"left alone: {f.node}: {f.id}: {why}; fix: {f.fix}", style="yellow"), soft_wrap=True)
