"""Reads ahead: a later task's read-only script, run beside a node's first facts read of the run (the facts
script's side reads, facts/script.py), so that a no-op rerun reads the node, its ssh files and mesh, and its
container in one round trip instead of one after another.

The controller keeps, per cluster, the read script each such task last sent to each node (its framing nonce
replaced by a placeholder; runs/proofs.py keeps the record). A node's first facts read of a run sends those
scripts along. When the task comes, it renders its script from the CURRENT plan; what was read ahead counts only
if the script is the same text, the node's facts were not read again since (nothing changed on it) and no change
was applied anywhere in the run since (a peer's keys, a container recreated). It is then exactly what the task
would have read, only earlier. In every other case the task reads for itself, as it always did: a read ahead
only ever saves time.

A read marked `root` runs in the facts' root shell (facts/script.py), where the node gives passwordless sudo: a
read only root can make (another process's files, through /proc) costs no `sudo` of its own there. Its task never
runs such a script itself: it reads the same things its own way (ctx.read_root_ahead)."""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any, Protocol

from sparkctl.facts.script import SideRead
from sparkctl.transport.framing import Framing, Section

RECORD = "reads-ahead"
PLACEHOLDER = "@@sparkctl-nonce@@"
#: How long a read ahead may run beside the facts. A no-op's reads take well under a second; one that needs
#: longer (a peer down, its ssh timing out) is cut, and its task reads for itself with its own time limit.
BUDGET_S = 10.0


class Records(Protocol):
    def get(self, key: str) -> Any | None: ...

    def put(self, key: str, value: Any | None) -> None: ...


@dataclass(frozen=True)
class Sent:
    normalized: str   # the script as recorded (placeholder for the nonce)
    nonce: str        # the nonce it was sent with
    root: bool = False


class ReadsAhead:
    """The scripts on record and what was sent and remembered in this run; thread-safe."""

    def __init__(self, records: Records | None):
        self._records = records
        self._recorded = _valid(records.get(RECORD) if records is not None else None)
        self._sent: dict[tuple[str, str], Sent] = {}
        self._seen: dict[str, dict[str, tuple[str, float, bool]]] = {}
        self._lock = threading.Lock()

    def side_reads(self, node: str) -> dict[str, SideRead]:
        """name -> the read to send with the node's first facts read."""
        out = {}
        with self._lock:
            for name, (normalized, timeout, root) in self._recorded.get(node, {}).items():
                nonce = Framing().nonce
                self._sent[(node, name)] = Sent(normalized, nonce, root)
                out[name] = SideRead(normalized.replace(PLACEHOLDER, nonce), min(float(timeout), BUDGET_S), root)
        return out

    def remember(self, node: str, name: str, script: str, framing: Framing, timeout: float,
                 root: bool = False) -> str:
        """Record what the task sends (for the next run); returns it normalized."""
        normalized = script.replace(framing.nonce, PLACEHOLDER)
        with self._lock:
            self._seen.setdefault(node, {})[name] = (normalized, float(timeout), root)
        return normalized

    def sent(self, node: str, name: str) -> Sent | None:
        with self._lock:
            return self._sent.get((node, name))

    def save(self) -> None:
        """Keep this run's scripts for the next run (nodes not read this run keep theirs)."""
        if self._records is None or not self._seen:
            return
        with self._lock:
            merged = {node: dict(tasks) for node, tasks in self._recorded.items()}
            for node, tasks in self._seen.items():
                merged[node] = dict(tasks)
            if merged == self._recorded:
                return
            self._records.put(RECORD, {n: {t: [script, timeout, *([True] if root else [])]
                                           for t, (script, timeout, root) in tasks.items()}
                                       for n, tasks in merged.items()})


def answer(section: Section | None, sent: Sent | None, normalized: str, framing: Framing,
           root: bool = False) -> str | None:
    """The stdout the task would have read, if the read ahead ran the same script, as the same user, and finished
    cleanly."""
    if (section is None or sent is None or section.rc != 0 or sent.normalized != normalized
            or sent.root != root):
        return None
    return section.output.replace(sent.nonce, framing.nonce)


def _valid(data: Any) -> dict[str, dict[str, tuple[str, float, bool]]]:
    """The record as written by save() (a root read's entry ends in `true`); anything else in the file is ignored
    (the tasks read for themselves)."""
    out: dict[str, dict[str, tuple[str, float, bool]]] = {}
    if not isinstance(data, dict):
        return out
    for node, tasks in data.items():
        if not isinstance(node, str) or not isinstance(tasks, dict):
            continue
        for name, value in tasks.items():
            if (isinstance(name, str) and isinstance(value, list) and len(value) in (2, 3)
                    and isinstance(value[0], str) and PLACEHOLDER in value[0]
                    and isinstance(value[1], (int, float)) and not isinstance(value[1], bool) and value[1] > 0
                    and value[2:] in ([], [True])):
                out.setdefault(node, {})[name] = (value[0], float(value[1]), len(value) == 3)
    return out
