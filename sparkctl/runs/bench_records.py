"""Where `fabric bench` and `serve bench` keep their figures on the controller: per cluster, beside the run
journals (`$XDG_STATE_HOME/sparkctl/<kind>/<cluster>/<UTC time>.json`, kind `fabric-bench` or `serve-bench`). Of
the fabric's, the first record to measure a figure in a given way (a link by RDMA or by TCP, the all-reduce over
given sizes: knowledge.bench_history) is kept for good, as that figure's baseline; of the others the newest KEEP."""

from __future__ import annotations

import json
import os
import re
from datetime import datetime, timezone
from pathlib import Path
from typing import Literal

from sparkctl.knowledge.bench_history import comparable_keys
from sparkctl.runs.journal import runs_dir
from sparkctl.secrets import redacted

KEEP = 20


BenchKind = Literal["fabric-bench", "serve-bench"]


def records_dir(cluster: str, base: Path | None = None, kind: BenchKind = "fabric-bench") -> Path:
    safe = re.sub(r"[^A-Za-z0-9_.-]+", "_", cluster) or "cluster"
    return (base or runs_dir().parent / kind) / safe


def record_bench(cluster: str, result: dict, base: Path | None = None, kind: BenchKind = "fabric-bench") -> Path:
    directory = records_dir(cluster, base, kind)
    directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%S.%fZ")
    path = directory / f"{stamp}.json"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        json.dump(redacted(result), handle, indent=1)
    _prune(directory, baselines=kind == "fabric-bench")
    return path


def _prune(directory: Path, baselines: bool) -> None:
    files = sorted(directory.glob("*.json"))
    seen: set[tuple[str, str]] = set()
    for old in files[:-KEEP]:
        keys = _measured(old) if baselines else set()
        if baselines and (old == files[0] or keys - seen):
            seen |= keys  # a baseline: the first record of a figure measured this way
        else:
            old.unlink(missing_ok=True)


def _measured(path: Path) -> set[tuple[str, str]]:
    try:
        return comparable_keys(json.loads(path.read_text(encoding="utf-8")))
    except (OSError, json.JSONDecodeError):
        return set()


def bench_history(cluster: str, base: Path | None = None) -> list[dict]:
    """The recorded benches, newest first (a file cut short is skipped)."""
    directory = records_dir(cluster, base)
    out = []
    for path in sorted(directory.glob("*.json"), reverse=True) if directory.is_dir() else []:
        try:
            out.append(json.loads(path.read_text(encoding="utf-8")))
        except (OSError, json.JSONDecodeError):
            continue
    return out
