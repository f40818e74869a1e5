"""What takes a run, or a node, out of play: a Ctrl-C (Interruption) and nodes lost mid-run (LostNodes).

Both are shared: the runner, the contexts that reach nodes for tasks and the transports each learn of them from
one object, so a node found gone by one is gone for all, and a stop asked once is seen everywhere.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable


class Interruption:
    """A request to stop a run. The first `request()` calls every callback once (the transports cut what runs, the
    runner says so); a callback added after the request is called at once.

    `request()` may be called from a signal handler: it only sets a flag and hands the callbacks to a thread of
    their own, so a handler never takes a lock the interrupted code may hold.
    """

    def __init__(self) -> None:
        self._event = threading.Event()
        self._lock = threading.Lock()
        self._callbacks: list[Callable[[], None]] = []
        self.done = threading.Event()  # set once every callback has run

    @property
    def requested(self) -> bool:
        return self._event.is_set()

    def on_request(self, callback: Callable[[], None]) -> None:
        with self._lock:
            if not self._event.is_set():
                self._callbacks.append(callback)
                return
        _call_quietly(callback)

    def request(self) -> bool:
        """Ask the run to stop; True the first time."""
        if self._event.is_set():
            return False
        self._event.set()
        threading.Thread(target=self._run_callbacks, name="sparkctl-interrupt", daemon=True).start()
        return True

    def _run_callbacks(self) -> None:
        with self._lock:
            callbacks, self._callbacks = self._callbacks, []
        for callback in callbacks:
            _call_quietly(callback)
        self.done.set()


def _call_quietly(callback: Callable[[], None]) -> None:
    # one transport failing to close must not keep the others open
    with contextlib.suppress(Exception):
        callback()


class LostNodes:
    """Nodes out of the run, and why: unreachable when the run started, or lost during it (then with the task
    that was running when it was noticed)."""

    def __init__(self, initial: dict[str, str] | None = None):
        self._lock = threading.Lock()
        self._why: dict[str, str] = dict(initial or {})
        self._during: dict[str, str | None] = {}
        self._listeners: list[Callable[[str, str, str | None], None]] = []

    def listen(self, listener: Callable[[str, str, str | None], None]) -> None:
        """`listener(node, why, during)` for each node lost from now on."""
        with self._lock:
            self._listeners.append(listener)

    def lose(self, node: str, why: str, during: str | None = None) -> bool:
        """Take `node` out of the run; True the first time (the listeners hear of it then)."""
        with self._lock:
            if node in self._why:
                return False
            self._why[node] = why
            self._during[node] = during
            listeners = list(self._listeners)
        for listener in listeners:
            listener(node, why, during)
        return True

    def __contains__(self, node: object) -> bool:
        with self._lock:
            return node in self._why

    def why(self, node: str) -> str | None:
        with self._lock:
            return self._why.get(node)

    def during(self, node: str) -> str | None:
        """The task that was running when `node` was lost (None: unreachable from the start)."""
        with self._lock:
            return self._during.get(node)

    def mid_run(self) -> list[str]:
        with self._lock:
            return list(self._during)

    def as_dict(self) -> dict[str, str]:
        with self._lock:
            return dict(self._why)
