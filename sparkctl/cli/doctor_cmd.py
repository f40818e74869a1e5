"""`sparkctl doctor`: look at the whole cluster read-only; per node, what is wrong, why, and the exact fix."""

from __future__ import annotations

import contextlib
import json
import sys

import click
from rich.console import Console
from rich.text import Text

from sparkctl.cli.run_options import become_password
from sparkctl.doctor.findings import CLUSTER, Diagnosis, Finding
from sparkctl.engine import Journal
from sparkctl.engine.events import Event
from sparkctl.errors import BadInput, SparkctlError
from sparkctl.exitcodes import ExitStatus
from sparkctl.inventory import load_inventory

_STYLE = {"error": "bold red", "warning": "yellow", "info": "blue"}


def render_diagnosis(console: Console, diagnosis: Diagnosis, *, verbose: bool = False) -> None:
    """Grouped by node (inventory order, the cluster last), errors first, then by phase."""
    by_node: dict[str, list[Finding]] = {}
    for f in diagnosis.findings:
        by_node.setdefault(f.node, []).append(f)
    for node in [*diagnosis.nodes, CLUSTER]:
        findings = by_node.pop(node, [])
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
            for detail in f.details:
                console.print(Text(f"      | {detail}", style="dim"), soft_wrap=True)
    errors = len(diagnosis.errors)
    warnings = sum(1 for f in diagnosis.findings if f.severity == "warning")
    infos = sum(1 for f in diagnosis.findings if f.severity == "info")
    verdict = Text("healthy", style="bold green") if diagnosis.healthy else Text("unhealthy", style="bold red")
    console.print(Text(f"\n{errors} error(s), {warnings} warning(s)"
                       + (f", {infos} note(s) (-v shows them)" if infos and not verbose else "")
                       + f" on {len(diagnosis.nodes)} node(s): ").append(verdict))


def _journal(diagnosis: Diagnosis, journal: Journal, label: str) -> None:
    for f in diagnosis.findings:
        journal(Event("finding", node=None if f.node == CLUSTER else f.node, phase=f.phase, status=f.severity,
                      message=f"{f.id}: {f.summary}", hint=f.fix, details=[f.evidence] if f.evidence else [],
                      data={"severity": f.severity, "code": f.id, "pass": label}))


@click.command("doctor")
@click.argument("file", type=click.Path(dir_okay=False))
@click.option("--json", "as_json", is_flag=True, help='Print {"healthy": bool, "findings": [...]} as JSON.')
@click.option("--fix", is_flag=True, help="Run the bootstrap tasks that own the errors found, then check again.")
@click.option("--bundle", "bundle_path", type=click.Path(dir_okay=False),
              help="Write a support bundle (tar.gz, secrets redacted) to this path.")
@click.option("--limit", metavar="NODE[,NODE]", help="Diagnose these nodes only.")
@click.option("--forks", type=click.IntRange(1, 256), default=32, show_default=True)
@click.option("-v", "--verbose", is_flag=True, help="Also show notes (info findings).")
@click.option("-K", "--ask-become-pass", is_flag=True, help="Prompt once for the sudo password.")
@click.option("--become-password-file", type=click.Path(dir_okay=False, exists=True),
              help="Read the sudo password from this file (first line).")
def doctor_command(file: str, as_json: bool, fix: bool, bundle_path: str | None, limit: str | None, forks: int,
                   verbose: bool, ask_become_pass: bool, become_password_file: str | None) -> None:
    """Find what is broken on the cluster, why, and how to fix it (read-only unless --fix).

    Exit 0 when no errors are found, 1 otherwise.
    """
    from sparkctl.doctor.bundle import unwritable_reason
    from sparkctl.doctor.diagnose import DoctorRequest, diagnose

    if bundle_path and (reason := unwritable_reason(bundle_path)):
        raise BadInput(f"--bundle {bundle_path}: {reason}")
    inventory = load_inventory(file)
    _register_hf_token(inventory)
    password = become_password(ask_become_pass, become_password_file)
    request = DoctorRequest(limit={n.strip() for n in limit.split(",") if n.strip()} if limit else None,
                            forks=forks, become_password=password, want_logs=bool(bundle_path))
    console = Console(stderr=as_json, highlight=False, soft_wrap=True)
    out: dict = {}
    with Journal(command="doctor") as journal:
        diagnosis, snapshot = diagnose(inventory, request)
        _journal(diagnosis, journal, "first")
        if fix and not diagnosis.healthy:
            out["fix"] = _repair(inventory, diagnosis, request, console, journal, as_json)
            if not as_json:
                console.print(Text("\nafter the repair:", style="bold"))
            diagnosis, snapshot = diagnose(inventory, request)
            _journal(diagnosis, journal, "after-fix")
        if bundle_path:
            from sparkctl.doctor.bundle import write_bundle

            journal.close()
            try:
                digest = write_bundle(bundle_path, diagnosis, snapshot)
            except OSError as exc:
                raise SparkctlError(f"cannot write the bundle {bundle_path}: {exc.strerror or exc}") from exc
            out["bundle"] = {"path": bundle_path, "sha256": digest}
    if as_json:
        click.echo(json.dumps({**diagnosis.to_dict(), **out}, indent=2))
    else:
        render_diagnosis(console, diagnosis, verbose=verbose)
        if bundle_path:
            console.print(Text(f"bundle: {bundle_path}\nsha256: {out['bundle']['sha256']}"))
    sys.exit(int(ExitStatus.HEALTHY if diagnosis.healthy else ExitStatus.FINDINGS))


def _register_hf_token(inventory) -> None:
    """Read the HF token the way bootstrap does, only so redaction knows it (bundle, journal, output)."""
    from sparkctl.engine.task import TaskFailed
    from sparkctl.tasks.model import hf_token

    # an unreadable token file: nothing to register; doctor reports a missing token on the nodes itself
    with contextlib.suppress(TaskFailed):
        hf_token(inventory)


def _repair(inventory, diagnosis: Diagnosis, request, console: Console, journal: Journal, as_json: bool) -> dict:
    from sparkctl.cli.views import ConsoleView
    from sparkctl.doctor.fix import repair
    from sparkctl.engine import EventBus

    if not as_json:
        render_diagnosis(console, diagnosis)
    sinks = [journal] if as_json else [journal, ConsoleView(console)]
    bus = EventBus(sinks)
    result, only, manual = repair(inventory, diagnosis, bus, limit=request.limit, forks=request.forks,
                                  become_password=request.become_password)
    for sink in sinks:
        close = getattr(sink, "close", None)
        if close and sink is not journal:
            close()
    if not as_json:
        if not only:
            console.print(Text("nothing sparkctl can repair by itself; see each fix above", style="yellow"))
        for f in manual:
            console.print(Text(f"needs you: {f.node}: {f.id}: {f.fix}", style="yellow"), soft_wrap=True)
    return {"ran": sorted(only), "exit_status": int(result.exit_status()) if result is not None else None,
            "needs_you": [f.to_dict() for f in manual]}
