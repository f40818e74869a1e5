"""Every rich Console sparkctl prints with, made here: a closed stdout is the command's to handle (cli/main.py),
not rich's, whose own handler exits 1, the code of a failed task (and of doctor's errors). rich is loaded by the
commands that print with it only (not for --json, `--version` or `--help`)."""

from __future__ import annotations

import errno
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rich.console import Console


def _pipe_gone(_console: object) -> None:
    raise BrokenPipeError(errno.EPIPE, "the reader of stdout went away")


def console(**options: Any) -> Console:
    """A rich Console with `options`, whose closed stdout raises BrokenPipeError."""
    from rich.console import Console

    Console.on_broken_pipe = _pipe_gone  # type: ignore[method-assign,assignment]
    return Console(**options)
