"""What every command that reports shares: `--json` (one object per line, cli/json_schema.py), `-v`/`-vv`,
`-o/--output` with `-` for stdout, and tables that fit the terminal and degrade to plain columns in a pipe."""

from __future__ import annotations

import json
import logging
import os
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime, timezone
from typing import IO, TYPE_CHECKING, Any, Union

import click

from sparkctl.errors import BadInput
from sparkctl.exitcodes import ExitStatus
from sparkctl.runs.outputs import check_writable
from sparkctl.secrets import RedactingFilter, redacted
from sparkctl.taskgraph.events import SCHEMA_VERSION

#: ctx.meta key: this command prints JSON (its errors too, as an `error` line)
JSON_META = "sparkctl.json"
STDOUT = "-"


def note_json(ctx: click.Context, _param: click.Parameter, value: bool) -> bool:
    ctx.meta[JSON_META] = bool(value)
    return value


def json_option(func):
    return click.option("--json", "as_json", is_flag=True, callback=note_json, is_eager=True,
                        help="One JSON object per line on stdout (docs/events.md); the last line carries the exit "
                             "status.")(func)


VERBOSE_HELP = "-v: more detail (durations, notes, commands run); -vv: also command output and tracebacks."
#: ctx.meta key: how many -v (-vv: the group prints an internal error's traceback, as --debug does)
VERBOSE_META = "sparkctl.verbose"
#: the transport's loggers: each command sent to a node (and, below it, what the command printed)
COMMANDS_LOGGER = "sparkctl.transport"
OUTPUT_LOGGER = "sparkctl.transport.shell.output"


def note_verbose(ctx: click.Context, _param: click.Parameter, value: int) -> int:
    ctx.meta[VERBOSE_META] = value
    return value


def _show_commands(ctx: click.Context, param: click.Parameter, value: int) -> int:
    """A command that walks no playbook has no view to show what it runs: the transport's own log does, on
    stderr, through the redaction (-v: each command's first line, exit code and time; -vv: whole, and what it
    printed). --debug already shows all of it."""
    note_verbose(ctx, param, value)
    if value and not ctx.find_root().params.get("debug"):
        handler = logging.StreamHandler(sys.stderr)
        handler.addFilter(_CommandLines(value))
        handler.addFilter(RedactingFilter())  # last: it sees the text that is printed
        handler.setFormatter(logging.Formatter("  %(message)s"))
        logger = logging.getLogger(COMMANDS_LOGGER)
        logger.addHandler(handler)
        level = logger.level
        logger.setLevel(logging.DEBUG)

        def done() -> None:
            logger.removeHandler(handler)
            logger.setLevel(level)

        ctx.call_on_close(done)
    return value


class _CommandLines(logging.Filter):
    def __init__(self, verbosity: int):
        super().__init__()
        self.verbosity = verbosity

    def filter(self, record: logging.LogRecord) -> bool:
        if self.verbosity >= 2:
            return True
        if record.name.startswith(OUTPUT_LOGGER):
            return False
        brief = getattr(record, "brief", None)
        if brief is not None:
            record.msg, record.args = brief, None
        return True


def verbose_option(func):
    """-v/-vv of a command that walks no playbook (a run's view shows its own: options.run_options)."""
    return click.option("-v", "--verbose", count=True, help=VERBOSE_HELP, callback=_show_commands)(func)


def utc_now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def json_line(obj: dict[str, Any], stream: IO[str] | None = None) -> None:
    """One object, redacted, with the schema version and the time, as one line on stdout."""
    line = {"schema": SCHEMA_VERSION, **obj}
    line.setdefault("time", utc_now())
    (stream or sys.stdout).write(json.dumps(redacted(line), ensure_ascii=False) + "\n")
    (stream or sys.stdout).flush()


def report_line(report: str, exit_status: ExitStatus | int, **fields: Any) -> None:
    """The one line of a reporting command's --json."""
    json_line({"event": "report", "report": report, **fields, "exit_status": int(exit_status)})


def error_line(message: str, exit_status: int, hint: str | None = None, details: Sequence[str] = ()) -> None:
    obj: dict[str, Any] = {"event": "error", "message": message, "exit_status": int(exit_status)}
    if hint:
        obj["hint"] = hint
    if details:
        obj["details"] = list(details)
    json_line(obj)


# --- output files -----------------------------------------------------------------------------------------------

@contextmanager
def output_file(path: str, option: str, *, binary: bool = False) -> Iterator[IO]:
    """Where -o/--output writes: stdout for `-`, else the file (its folder must exist: never created)."""
    if path == STDOUT:
        yield sys.stdout.buffer if binary else sys.stdout
        return
    check_writable(path, option)
    try:
        with open(path, "wb" if binary else "w") as handle:
            yield handle
    except OSError as err:
        # a full disk (/dev/full), a file the kernel refuses (/proc/version): bad input, one line
        raise BadInput(f"{option} {path}: cannot write it: {err.strerror or type(err).__name__}") from None


# --- tables -----------------------------------------------------------------------------------------------------

def terminal_width(stream: IO[str] | None = None) -> int | None:
    """COLUMNS when set (in a pipe too), the terminal's width on a terminal, else None: no width to fit."""
    columns = os.environ.get("COLUMNS", "")
    if columns.isdigit() and int(columns) > 0:
        return int(columns)
    stream = stream or sys.stdout
    if stream.isatty():
        return os.get_terminal_size(stream.fileno()).columns
    return None


if TYPE_CHECKING:
    from rich.text import Text

#: a table cell: text, or rich's styled Text (rich is imported only by what prints a table: `--version` and `--help`
#: stay without it)
Cell = Union[str, "Text"]


def _plain(cell: Cell) -> str:
    return cell if isinstance(cell, str) else cell.plain


def print_table(title: str | None, headers: Sequence[str], rows: Sequence[Sequence[Cell]], *,
                err: bool = False) -> None:
    """A rich table as wide as the terminal (COLUMNS honoured); in a pipe without COLUMNS, plain aligned
    columns that are never cut (a cell's lines joined by '; '), so grep and awk see whole values. `err`: on
    stderr (stdout carries something else)."""
    width = terminal_width(sys.stderr if err else sys.stdout)
    if width is None:
        flat = [[_plain(cell).replace("\n", "; ") for cell in row] for row in rows]
        sizes = [max(len(h), *(len(r[i]) for r in flat)) if flat else len(h) for i, h in enumerate(headers)]
        if title:
            click.echo(title, err=err)
        for line in [list(headers), *flat]:
            click.echo("  ".join(cell.ljust(size) for cell, size in zip(line, sizes, strict=True)).rstrip(), err=err)
        return
    from rich.table import Table

    from sparkctl.cli.console import console

    table = Table(title=title, show_lines=any("\n" in _plain(cell) for row in rows for cell in row))
    for header in headers:
        table.add_column(header, overflow="fold")
    for cells in rows:
        table.add_row(*cells)
    console(width=width, highlight=False, stderr=err).print(table)
