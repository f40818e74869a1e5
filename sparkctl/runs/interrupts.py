"""Ctrl-C during a run: the first one stops the run cleanly (what runs is cut, nothing more starts, the recap and
the journal say what finished, what was cut and what did not start; exit 130); a second one stops at once."""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager

from sparkctl.exitcodes import ExitStatus
from sparkctl.taskgraph import Interruption

AT_ONCE = b"\nsparkctl: interrupted again: stopped at once (no recap; the journal has every event until now)\n"


@contextmanager
def ctrl_c_stops(interruption: Interruption) -> Iterator[None]:
    """While inside: SIGINT asks `interruption` to stop the run; a second SIGINT exits 130 at once.

    Only the main thread can own a signal handler; elsewhere (a run started from a thread) Ctrl-C keeps Python's
    default behaviour."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def on_sigint(_signum: int, _frame: object) -> None:
        if not interruption.request():
            os.write(2, AT_ONCE)
            os._exit(int(ExitStatus.INTERRUPTED))

    previous = signal.signal(signal.SIGINT, on_sigint)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
