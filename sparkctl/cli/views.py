"""The two views of a run's events: the rich console (live, Ansible-like) and JSON lines."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import replace

from rich import box
from rich.console import Console
from rich.status import Status as Spinner
from rich.table import Table
from rich.text import Text

from sparkctl.secrets import redacted
from sparkctl.taskgraph.events import CONNECT_TASK, Event
from sparkctl.taskgraph.outcome import CLUSTER_ROW as CLUSTER_ROW_KEY
from sparkctl.taskgraph.outcome import RECAP_COLUMNS

STATUS_STYLES = {
    "ok": "green",
    "changed": "yellow",
    "failed": "bold red",
    "skipped": "cyan",
    "unreachable": "bold magenta",
    "interrupted": "bold yellow",
}
INTERRUPTED = "interrupted"
WORD_WIDTH = len("would change")
CLUSTER_LABEL = "cluster"


def _clean(event: Event) -> Event:
    """The event with every human-readable string redacted; the console is a log too."""
    return replace(
        event,
        message=redacted(event.message),
        hint=redacted(event.hint),
        details=redacted(list(event.details)),
        changes=redacted([dict(c) for c in event.changes]),
        traceback=redacted(event.traceback),
        data=redacted(dict(event.data)),
    )


#: A step this long shows its duration on its result line even without -v.
LONG_STEP_S = 10.0


def _elapsed(seconds: float) -> str:
    seconds = max(0.0, seconds)
    if seconds < 60:
        return f"{seconds:.1f}s"
    return f"{int(seconds // 60)}m{int(seconds % 60):02d}s"


class _Live:
    """A renderable whose text is computed when rich draws it (the spinner redraws several times a second)."""

    def __init__(self, text: Callable[[], str]):
        self._text = text

    def __rich__(self) -> Text:
        return Text(self._text())


def _short_list(names: list[str], most: int = 4) -> str:
    """Task names, or past `most` of them their phases (`preflight.node` -> preflight) and a count."""
    if len(names) <= most:
        return ", ".join(names)
    phases = list(dict.fromkeys(n.split(".", 1)[0] for n in names))
    return f"{len(names)} tasks of {', '.join(phases)}"


class ConsoleView:
    """Live per-node progress, one line per task per node as it finishes, and a recap table at the end.

    verbosity 0: results, changes, failures, warnings. 1 (-v): also durations, tasks left out by
    --only/--skip, logs and what is being applied. 2 (-vv): also tracebacks of internal errors.
    A spinner names the running task only when the console is a terminal; otherwise output is plain lines.
    """

    def __init__(self, console: Console, verbosity: int = 0, show_diff: bool = False):
        self.console = console
        self.verbosity = verbosity
        self.show_diff = show_diff
        self.check_mode = False
        self._node_width = len(CLUSTER_LABEL)
        self._phase_shown: str | None = None
        #: what runs now -> since when (monotonic): the spinner says how long each has been running
        self._running: dict[tuple[str | None, str | None], float] = {}
        self._progress: dict[tuple[str | None, str | None], str] = {}
        self._spinner: Spinner | None = None

    def __call__(self, event: Event) -> None:
        handler = getattr(self, f"_on_{event.event}", None)
        if handler is not None:
            handler(_clean(event))

    def close(self) -> None:
        if self._spinner is not None:
            self._spinner.stop()
            self._spinner = None

    def __enter__(self) -> ConsoleView:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- live progress -------------------------------------------------------------------------------

    def _on_run_start(self, event: Event) -> None:
        nodes = event.data.get("nodes") or []
        self._node_width = max([len(CLUSTER_LABEL), *(len(n) for n in nodes)])
        self.check_mode = bool(event.check_mode)
        if self.check_mode:
            self.console.print(Text("check mode: nothing will be changed, changes are reported as "
                                    "'would change'", style="bold"))
        added = event.data.get("added_needs") or []
        if added:
            self.console.print(Text(f"also running what the selected tasks need: {_short_list(added)}",
                                    style="dim"))

    def _on_task_start(self, event: Event) -> None:
        self._running[(event.task, event.node)] = time.monotonic()
        if not self.console.is_terminal:
            return
        if self._spinner is None:
            # the text is rendered anew at every refresh of the spinner: the elapsed time moves on its own
            self._spinner = Spinner(_Live(self._spinner_text), console=self.console)
            self._spinner.start()

    def _spinner_text(self) -> str:
        by_task: dict[str | None, list[str]] = {}
        started: dict[str | None, float] = {}
        for (task, node), since in list(self._running.items()):
            progress = self._progress.get((task, node))
            by_task.setdefault(task, []).append(f"{node or CLUSTER_LABEL} ({progress})" if progress
                                                 else node or CLUSTER_LABEL)
            started[task] = min(since, started.get(task, since))
        now = time.monotonic()
        return "  ".join(f"{task}: {', '.join(nodes)} [{_elapsed(now - started[task])}]"
                         for task, nodes in by_task.items()) or "working"

    def _line(self, word: str, style: str, event: Event, text: str | None) -> Text:
        line = Text()
        line.append(f"{word:<{WORD_WIDTH}}", style=style)
        line.append("  ")
        line.append(f"{event.node or CLUSTER_LABEL:<{self._node_width}}", style="bold")
        if event.task and event.task != CONNECT_TASK:
            line.append("  ")
            line.append(event.task)
        if text:
            line.append("  ")
            line.append(text)
        if event.duration is not None and (self.verbosity >= 1 or event.duration >= LONG_STEP_S):
            line.append(f"  ({_elapsed(event.duration)})", style="dim")
        return line

    def _phase_header(self, event: Event) -> None:
        if event.phase and event.phase != self._phase_shown:
            self._phase_shown = event.phase
            self.console.print(Text(f"── {event.phase} ──", style="bold blue"))

    def _on_task_changes(self, event: Event) -> None:
        if self.verbosity >= 1:
            self._phase_header(event)
            for change in event.changes:
                self.console.print(Text(f"  applying on {event.node or CLUSTER_LABEL}: {change['summary']}",
                                        style="dim"))

    def _on_task_result(self, event: Event) -> None:
        self._running.pop((event.task, event.node), None)
        self._progress.pop((event.task, event.node), None)
        status = event.status or "ok"
        if status == "skipped" and event.data.get("reason") == "not_selected" and self.verbosity < 1:
            return
        word = "would change" if status == "changed" and event.would_change else status
        changes = event.changes
        if status == "changed":
            text = changes[0]["summary"] if len(changes) == 1 else f"{len(changes)} changes"
        else:
            text = event.message
        self._phase_header(event)
        self.console.print(self._line(word, STATUS_STYLES.get(status, ""), event, text))
        if status == "changed":
            self._print_changes(changes, listed=len(changes) > 1)
        elif status == "failed":
            self._print_failure(event)
        elif event.hint:
            self._print_hint(event.hint)

    def _print_changes(self, changes: list[dict], *, listed: bool, label: str = "") -> None:
        for change in changes:
            if listed:
                self.console.print(Text(f"    - {label}{change['summary']}", style="yellow"))
            if self.show_diff and change.get("diff"):
                self._print_diff(change["diff"])

    def _print_diff(self, diff: str) -> None:
        for row in diff.rstrip("\n").splitlines():
            style = ""
            if row.startswith(("+++", "---")):
                style = "bold"
            elif row.startswith("+"):
                style = "green"
            elif row.startswith("-"):
                style = "red"
            elif row.startswith("@@"):
                style = "cyan"
            self.console.print(Text("      " + row, style=style), soft_wrap=True)

    def _print_hint(self, hint: str) -> None:
        self.console.print(Text(f"    hint: {hint}", style="italic"))

    def _print_failure(self, event: Event) -> None:
        if event.hint:
            self._print_hint(event.hint)
        for detail in event.details:
            self.console.print(Text(f"    | {detail}", style="red"), soft_wrap=True)
        if event.changes and (self.verbosity >= 1 or self.show_diff):
            self._print_changes(event.changes, listed=True, label="attempted: ")
        if event.traceback:
            if self.verbosity >= 2:
                self.console.print(Text(event.traceback.rstrip("\n"), style="dim"), soft_wrap=True)
            else:
                self.console.print(Text("    (run with -vv for the traceback)", style="dim"))

    def _on_warning(self, event: Event) -> None:
        self.console.print(self._line("warning", "yellow", event, event.message))
        if event.hint:
            self._print_hint(event.hint)
        for detail in event.details:
            self.console.print(Text(f"    | {detail}", style="yellow"), soft_wrap=True)

    def _on_finding(self, event: Event) -> None:
        severity = str(event.data.get("severity") or event.status or "finding")
        style = {"error": "bold red", "warning": "yellow", "ok": "green"}.get(severity, "blue")
        text = event.message or " ".join(str(event.data[k]) for k in ("id", "summary") if event.data.get(k))
        self.console.print(self._line(severity, style, event, text))
        hint = event.hint or event.data.get("fix")
        if hint:
            self._print_hint(str(hint))
        for detail in event.details:
            self.console.print(Text(f"    | {detail}"), soft_wrap=True)

    def _on_log(self, event: Event) -> None:
        if event.data.get("progress") and self.verbosity < 1:
            self._on_progress(event)
            return
        if self.verbosity >= 1:
            self.console.print(self._line("log", "dim", event, event.message), style="dim")

    def _on_node_lost(self, event: Event) -> None:
        self.console.print(self._line("lost", STATUS_STYLES["unreachable"], event, event.message))
        if event.hint:
            self._print_hint(event.hint)

    def _on_interrupt(self, event: Event) -> None:
        self.close()
        self.console.print(Text(event.message or "interrupted", style=STATUS_STYLES["interrupted"]))
        if event.hint:
            self._print_hint(event.hint)

    def _on_progress(self, event: Event) -> None:
        """Bytes so far of a long transfer: the live status line in a terminal, else a line of its own."""
        if self._spinner is not None:
            key, text = (event.task, event.node), event.message or ""
            if key not in self._running and (event.task, None) in self._running:
                key, text = (event.task, None), f"{event.node}: {text}"  # a cluster task's transfer to a node
            self._progress[key] = text
        else:
            self.console.print(self._line("progress", "dim", event, event.message), style="dim")

    # -- the end -------------------------------------------------------------------------------------

    def _on_recap(self, event: Event) -> None:
        self.close()
        nodes = event.nodes or {}
        columns = RECAP_COLUMNS + ((INTERRUPTED,) if any(INTERRUPTED in row for row in nodes.values()) else ())
        table = Table(title="RECAP", title_justify="left", box=box.SIMPLE_HEAD, title_style="bold")
        table.add_column("node")
        for column in columns:
            table.add_column(column, justify="right")
        for node, counts in nodes.items():
            row_style = next((STATUS_STYLES[c] for c in ("failed", "unreachable", INTERRUPTED, "changed")
                              if counts.get(c)), "green")
            cells = [Text(str(counts.get(c, 0)), style=STATUS_STYLES[c] if counts.get(c) else "")
                     for c in columns]
            table.add_row(Text(node, style=row_style), *cells)
        self.console.print()
        self.console.print(table)
        for line in self._left_undone(event):
            self.console.print(line)
        self.console.print(self._verdict(event, nodes))
        if event.data.get("endpoint"):
            self.console.print(self._endpoint(event.data["endpoint"], event.data.get("smoke") or {}))

    @staticmethod
    def _endpoint(url: str, smoke: dict) -> Text:
        line = Text("endpoint: ", style="bold")
        line.append(f"{url}/v1", style="bold cyan")
        said = [f"answered in {smoke['seconds']:.1f}s"] if smoke.get("seconds") is not None else []
        if smoke.get("answer"):
            said.append(repr(smoke["answer"][:60]))
        if smoke.get("acceptance_length"):
            said.append(f"acceptance length {smoke['acceptance_length']:.2f}")
        if smoke.get("reachable_from_here") is False:
            said.append("not reachable from this machine (see the log line above)")
        if said:
            line.append("\nsmoke test: " + "; ".join(said))
        return line

    @staticmethod
    def _left_undone(event: Event) -> list[Text]:
        """Which node is lost and why, what it and the cluster were left without; what a Ctrl-C cut and kept from
        starting."""
        lines = []
        lost = event.data.get("lost") or {}
        for node, about in lost.items():
            during = f" during {about['during']}" if about.get("during") else " at the start"
            lines.append(Text(f"{node} lost{during}: {about.get('reason')}", style=STATUS_STYLES["unreachable"]))
            if about.get("undone"):
                lines.append(Text(f"    not done on {node}: {', '.join(about['undone'])}"))
        if lost and event.data.get("left_undone"):
            lines.append(Text(f"    left undone, they need {', '.join(lost)}: {', '.join(event.data['left_undone'])}"))
        if lost:
            lines.append(Text(f"    run again once {', '.join(lost)} answer(s): the rerun picks up the rest",
                              style="italic"))
        stopped = event.data.get("interrupted")
        if stopped:
            cut = ", ".join(f"{c['task']} on {c.get('node') or CLUSTER_LABEL}" for c in stopped.get("cut", []))
            lines.append(Text(f"cut by Ctrl-C: {cut or 'nothing (between tasks)'}", style=STATUS_STYLES[INTERRUPTED]))
            if stopped.get("not_started"):
                lines.append(Text(f"    not started: {', '.join(stopped['not_started'])}"))
            lines.append(Text("    run again to finish: every task checks first, so the rerun picks up the rest",
                              style="italic"))
        return lines

    @staticmethod
    def _verdict(event: Event, nodes: dict[str, dict[str, int]]) -> Text:
        total = {c: sum(row.get(c, 0) for row in nodes.values()) for c in (*RECAP_COLUMNS, INTERRUPTED)}
        took = f" in {event.duration:.1f}s" if event.duration is not None else ""
        if event.data.get("interrupted"):
            return Text(f"INTERRUPTED{took}: {total[INTERRUPTED]} task(s) cut, "
                        f"{len(event.data['interrupted'].get('not_started', []))} not started", style="bold yellow")
        if total["failed"]:
            return Text(f"FAILED{took}: {total['failed']} task(s) failed", style="bold red")
        if total["unreachable"]:
            lost = ", ".join(n for n, row in nodes.items() if row.get("unreachable") and n != CLUSTER_ROW_KEY)
            return Text(f"UNREACHABLE{took}: {lost}", style="bold magenta")
        if event.check_mode:
            pending = int(event.data.get("pending") or 0)
            unknown = f", {pending} cannot know until those are applied" if pending else ""
            if total["changed"] or pending:
                return Text(f"check mode{took}: {total['changed']} task(s) would change{unknown}; "
                            "run without --check to apply", style="bold yellow")
            return Text(f"check mode{took}: nothing would change", style="bold green")
        verified = event.data.get("verified")
        proof = "" if verified is None else "; verified" if verified else \
            f"; NOT verified: {event.data.get('not_verified')}"
        style = "bold green" if verified is not False else "bold yellow"
        if total["changed"]:
            return Text(f"OK{took}: {total['changed']} task(s) changed{proof}", style=style)
        return Text(f"OK{took}: nothing to change{proof}", style=style)
