"""Live progress of a long transfer: a log event every few seconds with the bytes so far, read from the node.

`hf download` and the fabric copy print nothing useful while they run over a non-interactive channel, so a
second command reads the growing size of the target directory on the node (`du -sb`) in a background thread
while the transfer runs. The events are `log` events carrying `data["progress"]`; the console view shows them
at default verbosity (in a terminal as the live status line), JSON lines carry the numbers.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from sparkctl.errors import Interrupted
from sparkctl.taskgraph.events import Event
from sparkctl.transport.base import Transport, q

PROGRESS_EVERY_S = 5.0


def human_bytes(count: float) -> str:
    for unit, size in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if count >= size:
            return f"{count / size:.2f} {unit}"
    return f"{int(count)} B"


def rate_text(count: float, seconds: float) -> str:
    return f"{count / seconds / 1e6:.1f} MB/s" if seconds > 0 else "- MB/s"


def directory_size_reader(transport: Transport, path: str) -> Callable[[], int | None]:
    """Bytes under `path` on the node (0 when it does not exist yet); None when it cannot be read."""
    command = f"if [ -e {q(path)} ]; then du -sb {q(path)} 2>/dev/null | cut -f1; else echo 0; fi"

    def read() -> int | None:
        result = transport.run(command, timeout=30)
        value = result.stdout.strip()
        return int(value) if result.ok and value.isdigit() else None

    return read


class TransferProgress:
    """While the `with` block runs, emit a progress event every `interval` seconds.

    `measure()` returns the bytes on the target so far; the rate counts only what arrived since the block
    started (a resumed download starts from what an earlier run left). With `total`, the line has a percentage.
    """

    def __init__(self, emit: Callable[[Event], None], *, task: str, node: str, what: str,
                 measure: Callable[[], int | None], total: int | None = None,
                 interval: float | None = None):
        self.emit = emit
        self.task, self.node, self.what = task, node, what
        self.measure = measure
        self.total = total
        self.interval = PROGRESS_EVERY_S if interval is None else interval
        self.reports = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name=f"progress-{node}", daemon=True)
        self._baseline: int | None = None
        self._started = 0.0

    def __enter__(self) -> TransferProgress:
        self._started = time.monotonic()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=self.interval + 35)

    def _loop(self) -> None:
        self._baseline = self._safe_measure()
        while not self._stop.wait(self.interval):
            current = self._safe_measure()
            if current is not None and not self._stop.is_set():
                self._report(current)

    def _safe_measure(self) -> int | None:
        try:
            return self.measure()
        except Exception:  # noqa: BLE001 (a lost progress reading never fails the transfer)
            return None
        except Interrupted:
            # Ctrl-C: the transport refuses the reading. The transfer's own thread stops the run; this one only
            # stops reading (raised here, it printed a traceback of its own)
            self._stop.set()
            return None

    def _report(self, current: int) -> None:
        elapsed = time.monotonic() - self._started
        arrived = max(0, current - (self._baseline or 0))
        text = f"{self.what}: {human_bytes(current)}"
        if self.total:
            text += f" of {human_bytes(self.total)} ({min(100.0, 100.0 * current / self.total):.0f}%)"
        text += f" after {elapsed:.0f}s, {rate_text(arrived, elapsed)}"
        progress = {"what": self.what, "bytes": current, "total": self.total, "seconds": round(elapsed, 1)}
        self.reports += 1
        self.emit(Event("log", task=self.task, node=self.node, message=text, data={"progress": progress}))
