"""Early asks: what a read-only cluster task asks of the outside world (not of the nodes' connections), started in
a thread of its own as the run begins, so that a slow answer (the smoke test's chat completion) comes while the
other tasks check the nodes instead of after them.

When the task comes, it takes the answer only if no change was applied anywhere in the run since the ask began:
it is then what the task would have been told, only earlier (the run holds the cluster lock: what changes the nodes
meanwhile is what could as well change them right after the task, a process's own crash or restart). A change, an
error, or nothing asked: the task asks for itself, as it always did. An early ask only ever saves time.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

#: An ask a change made stale may still be under way: the task's own ask waits this long for it to end first, so
#: that the two do not meet at the server (the second's figures would count the first's work).
STALE_WAIT_S = 5.0


@dataclass
class _Ask:
    changes: int  # the run's changes applied when it began
    done: threading.Event = field(default_factory=threading.Event)
    value: Any = None


class EarlyAsks:
    """Asks started by `start`, taken once by `take`; thread-safe. `changes_applied` counts the run's changes."""

    def __init__(self, changes_applied: Callable[[], int]):
        self._changes = changes_applied
        self._asks: dict[str, _Ask] = {}
        self._lock = threading.Lock()

    def start(self, name: str, ask: Callable[[], Any]) -> None:
        """Run `ask` in a daemon thread now (its None, or an exception, means: the task asks for itself)."""
        entry = _Ask(self._changes())
        with self._lock:
            if name in self._asks:
                return
            self._asks[name] = entry

        def run() -> None:
            try:
                entry.value = ask()
            except Exception:  # noqa: BLE001 - the task asks again for itself, and reports what it meets then
                entry.value = None
            finally:
                entry.done.set()
        threading.Thread(target=run, name=f"sparkctl-early-{name}", daemon=True).start()

    def take(self, name: str) -> Any:
        """What the ask `name` was told, waiting for it if it still runs; None when it was never started, found
        nothing, or a change was applied since it began (then waiting at most STALE_WAIT_S for it to end)."""
        with self._lock:
            entry = self._asks.pop(name, None)
        if entry is None:
            return None
        if self._changes() != entry.changes:
            entry.done.wait(STALE_WAIT_S)
            return None
        entry.done.wait()
        return entry.value if self._changes() == entry.changes else None
