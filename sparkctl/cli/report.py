"""What every command that reports shares: `--json` (one object per line, cli/json_schema.py), `-v`/`-vv`,
`-o/--output` with `-` for stdout, and tables that fit the terminal and degrade to plain columns in a pipe."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime, timezone
from typing import IO, Any

import click
from rich.console import Console
from rich.table import Table

from sparkctl.engine.events import SCHEMA_VERSION
from sparkctl.errors import BadInput
from sparkctl.exitcodes import ExitStatus
from sparkctl.runs.outputs import check_writable
from sparkctl.secrets import redacted

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


def verbose_option(func):
    return click.option("-v", "--verbose", count=True, help=VERBOSE_HELP)(func)


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

def terminal_width() -> int | None:
    """COLUMNS when set (in a pipe too), the terminal's width on a terminal, else None: no width to fit."""
    columns = os.environ.get("COLUMNS", "")
    if columns.isdigit() and int(columns) > 0:
        return int(columns)
    if sys.stdout.isatty():
        return os.get_terminal_size(sys.stdout.fileno()).columns
    return None


def print_table(title: str | None, headers: Sequence[str], rows: Sequence[Sequence[str]]) -> None:
    """A rich table as wide as the terminal (COLUMNS honoured); in a pipe without COLUMNS, plain aligned
    columns that are never cut (a cell's lines joined by '; '), so grep and awk see whole values."""
    width = terminal_width()
    if width is None:
        flat = [[cell.replace("\n", "; ") for cell in row] for row in rows]
        sizes = [max(len(h), *(len(r[i]) for r in flat)) if flat else len(h) for i, h in enumerate(headers)]
        if title:
            click.echo(title)
        for row in [list(headers), *flat]:
            click.echo("  ".join(cell.ljust(size) for cell, size in zip(row, sizes, strict=True)).rstrip())
        return
    table = Table(title=title, show_lines=any("\n" in cell for row in rows for cell in row))
    for header in headers:
        table.add_column(header, overflow="fold")
    for row in rows:
        table.add_row(*row)
    Console(width=width, highlight=False).print(table)
