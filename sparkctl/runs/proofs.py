"""Proofs on record, on the controller: `$XDG_STATE_HOME/sparkctl/proofs/<cluster>.json` (next to the run
journals). A record only lets a later run skip re-proving what did not change (tasks/proof.py); a lost or
unreadable file only means the proof is made again."""

from __future__ import annotations

import json
import os
import re
import tempfile
from pathlib import Path
from typing import Any

from sparkctl.runs.journal import runs_dir


def proofs_dir() -> Path:
    return runs_dir().parent / "proofs"


class ProofFile:
    def __init__(self, cluster: str, directory: Path | str | None = None):
        name = re.sub(r"[^A-Za-z0-9_.-]+", "_", cluster) or "cluster"
        self.path = Path(directory) if directory is not None else proofs_dir()
        self.path = self.path / f"{name}.json"

    def _load(self) -> dict[str, Any]:
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return {}
        return data if isinstance(data, dict) else {}

    def get(self, key: str) -> Any | None:
        return self._load().get(key)

    def put(self, key: str, value: Any | None) -> None:
        data = self._load()
        if value is None:
            if key not in data:
                return
            data.pop(key)
        else:
            data[key] = value
        try:
            self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=".proof-")
            with os.fdopen(fd, "w", encoding="utf-8") as handle:
                json.dump(data, handle)
            os.replace(tmp, self.path)
        except OSError:
            pass  # no record: the next run proves again
