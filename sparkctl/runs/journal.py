"""The run journal: every event of a run as JSON lines on disk, the last runs kept."""

from __future__ import annotations

import json
import os
import re
import threading
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, TextIO

from sparkctl.secrets import redacted
from sparkctl.taskgraph.events import Event
from sparkctl.userfiles import controller_state_dir

KEEP_RUNS = 50


def runs_dir(cluster: str | None = None) -> Path:
    """`$XDG_STATE_HOME/sparkctl/runs` (default `~/.local/state/sparkctl/runs`); a cluster's journals in its own
    folder below it (pruned and bundled on their own: one cluster's runs never push out another's)."""
    base = Path(controller_state_dir()) / "runs"
    return base / _safe(cluster) if cluster else base


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", name).lstrip(".") or "_"


def _run_files(directory: Path) -> list[Path]:
    # Names start with a fixed-width UTC timestamp, so name order is time order.
    return sorted(p for p in directory.glob("*.jsonl") if p.is_file())


def latest_runs(n: int, dir: Path | str | None = None, *, cluster: str | None = None) -> list[Path]:
    """The journals of the last `n` runs (of `cluster`), newest first."""
    directory = Path(dir) if dir is not None else runs_dir(cluster)
    if not directory.is_dir() or n <= 0:
        return []
    return list(reversed(_run_files(directory)))[:n]


def read_run(path: Path | str) -> list[dict[str, Any]]:
    """The events of one journal; a line cut short by a crash is dropped, not fatal."""
    events = []
    for line in Path(path).read_text(encoding="utf-8").splitlines():
        try:
            events.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return events


class Journal:
    """An event sink writing one JSON-lines file per run: `<UTC timestamp>-<command>.jsonl`.

    The file is created on the first event (0600, in a 0700 directory) and older runs beyond `keep`
    are pruned then. Every string is redacted (sparkctl.secrets) before it reaches the disk.
    """

    def __init__(self, dir: Path | str | None = None, *, command: str = "run", keep: int = KEEP_RUNS,
                 cluster: str | None = None):
        self.dir = Path(dir) if dir is not None else runs_dir(cluster)
        self.command = re.sub(r"[^A-Za-z0-9_.-]+", "_", command) or "run"
        self.keep = max(1, keep)
        self.path: Path | None = None
        self._file: TextIO | None = None
        self._lock = threading.Lock()

    def _open(self) -> None:
        # sparkctl's own state, not an output the user named: its folders are made as needed, private
        self.dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%S.%fZ")
        path = self.dir / f"{stamp}-{self.command}.jsonl"
        suffix = 1
        while path.exists():
            suffix += 1
            path = self.dir / f"{stamp}-{self.command}-{suffix}.jsonl"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        self._file = os.fdopen(fd, "w", encoding="utf-8")
        self.path = path
        self.prune()

    def prune(self) -> list[Path]:
        """Delete all but the newest `keep` journals; returns what was deleted."""
        files = _run_files(self.dir)
        doomed = files[:-self.keep] if len(files) > self.keep else []
        for old in doomed:
            if old != self.path:
                old.unlink(missing_ok=True)
        return doomed

    def __call__(self, event: Event) -> None:
        line = json.dumps(redacted(event.to_dict()), ensure_ascii=False, sort_keys=False)
        with self._lock:
            if self._file is None and self.path is not None:
                self._file = open(self.path, "a", encoding="utf-8")  # noqa: SIM115 (kept open for the run)
            elif self._file is None:
                self._open()
            assert self._file is not None  # _open() opened it or raised
            self._file.write(line + "\n")
            self._file.flush()

    write = __call__

    def close(self) -> None:
        with self._lock:
            if self._file is not None:
                self._file.close()
                self._file = None

    def __enter__(self) -> Journal:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def latest_runs(self, n: int) -> list[Path]:
        return latest_runs(n, self.dir)
