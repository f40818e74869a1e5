"""Events: the single source for every view (console, JSON lines) and for the run journal."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, fields
from datetime import datetime, timezone
from typing import Any

#: The version of every JSON object sparkctl prints or journals (docs/events.md): additions keep it, a field
#: removed, renamed or changed in meaning bumps it.
SCHEMA_VERSION = 1

EVENT_KINDS = ("run_start", "task_start", "task_changes", "task_result", "node_lost", "interrupt", "warning", "finding",
               "log", "recap", "error", "report")

#: The task of the result an unreachable node gets at the start of a run (it never reached a task).
CONNECT_TASK = "connect"

Sink = Callable[["Event"], None]


def _utc_now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")


@dataclass
class Event:
    """One thing that happened during a run.

    `node` is None for cluster scope. `changes` holds plain dicts ({summary, diff}) so an event is JSON-safe
    as it stands. `data` carries extras a kind needs (run_start: nodes; finding: severity, code ...); its keys
    are merged at the top level by `to_dict` without overriding the named fields.
    """

    event: str
    time: str = field(default_factory=_utc_now)
    task: str | None = None
    phase: str | None = None
    node: str | None = None
    status: str | None = None
    message: str | None = None
    hint: str | None = None
    changes: list[dict[str, Any]] = field(default_factory=list)
    details: list[str] = field(default_factory=list)
    duration: float | None = None
    would_change: bool | None = None
    traceback: str | None = None
    # recap only
    nodes: dict[str, dict[str, int]] | None = None
    exit_status: int | None = None
    check_mode: bool | None = None
    data: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.event not in EVENT_KINDS:
            raise ValueError(f"unknown event kind {self.event!r} (one of {', '.join(EVENT_KINDS)})")
        # Status enums (str subclasses) would serialise as "Status.OK" with some encoders.
        if self.status is not None:
            self.status = str(getattr(self.status, "value", self.status))

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe dict without None, empty lists or a False `would_change` (no noise)."""
        out: dict[str, Any] = {"schema": SCHEMA_VERSION}
        for f in fields(self):
            if f.name == "data":
                continue
            value = getattr(self, f.name)
            if value is None or (isinstance(value, (list, dict)) and not value):
                continue
            if f.name == "would_change" and not value:
                continue
            if f.name == "duration":
                value = round(value, 3)
            out[f.name] = _json_safe(value)
        for key, value in self.data.items():
            out.setdefault(key, _json_safe(value))
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Event:
        """Inverse of `to_dict` (for journals read back): unknown keys land in `data`."""
        names = {f.name for f in fields(cls)} - {"data"}
        known = {k: v for k, v in data.items() if k in names}
        extra = {k: v for k, v in data.items() if k not in names and k != "schema"}
        return cls(**known, data=extra)


def _json_safe(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [_json_safe(v) for v in value]
    if value is None or isinstance(value, (bool, int, float, str)):
        return getattr(value, "value", value)
    return str(getattr(value, "value", value))


class EventBus:
    """Fans one event out to every sink, one event at a time (sinks need not be thread-safe)."""

    def __init__(self, sinks: Iterable[Sink] = ()):
        self._sinks: list[Sink] = list(sinks)
        self._lock = threading.RLock()

    def add(self, sink: Sink) -> None:
        with self._lock:
            self._sinks.append(sink)

    def remove(self, sink: Sink) -> None:
        with self._lock:
            self._sinks.remove(sink)

    def emit(self, event: Event) -> None:
        with self._lock:
            for sink in list(self._sinks):
                sink(event)

    __call__ = emit

    def warning(self, message: str, *, task: str | None = None, node: str | None = None,
                hint: str | None = None, details: list[str] | None = None) -> None:
        self.emit(Event("warning", task=task, node=node, message=message, hint=hint, details=details or []))

    def log(self, message: str, *, task: str | None = None, node: str | None = None) -> None:
        self.emit(Event("log", task=task, node=node, message=message))
