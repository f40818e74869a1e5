"""The support bundle: one tar.gz with what a bug report needs, every secret redacted on the way in."""

from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import re
import tarfile
import time
from pathlib import Path
from typing import Any

from sparkctl.doctor.findings import Diagnosis
from sparkctl.doctor.snapshot import Snapshot
from sparkctl.engine.journal import latest_runs
from sparkctl.secrets import MASK, redact_known

JOURNALS = 5
# Token shapes redacted even when nobody registered them: Hugging Face, NGC, GitHub, bearer headers, and the
# value of any VAR=... whose name says it is secret.
_TOKEN_PATTERNS = [
    re.compile(r"\bhf_[A-Za-z0-9]{16,}"),
    re.compile(r"\bnvapi-[A-Za-z0-9_-]{16,}"),
    re.compile(r"\bgh[pousr]_[A-Za-z0-9]{20,}"),
    re.compile(r"(?i)(bearer\s+)[A-Za-z0-9._~+/-]{16,}=*"),
    re.compile(r"(?i)\b([A-Z0-9_]*(?:TOKEN|PASSWORD|PASSWD|SECRET|API_KEY)[A-Z0-9_]*\s*[=:]\s*)(?!<redacted>)[^\s\"',]+"),
]


def scrub(text: str) -> str:
    """Registered secrets (sudo password, HF token of this run) and anything shaped like a token, masked."""
    text = redact_known(text)
    for pattern in _TOKEN_PATTERNS:
        text = pattern.sub(lambda m: (m.group(1) if m.re.groups else "") + MASK, text)
    return text


def _plain(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return _plain(dataclasses.asdict(value))
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def _json(value: Any) -> str:
    return json.dumps(_plain(value), indent=2, sort_keys=True, default=str) + "\n"


def bundle_files(diagnosis: Diagnosis, snapshot: Snapshot, journals: list[Path]) -> dict[str, str]:
    """name in the archive -> text (not yet redacted)."""
    from sparkctl.inventory import dump_inventory

    files = {"findings.json": json.dumps(diagnosis.to_dict(), indent=2) + "\n",
             "unreachable.json": _json(snapshot.unreachable),
             "inventory.yaml": dump_inventory(snapshot.inventory)}
    if snapshot.plan_error:
        files["plan-error.txt"] = snapshot.plan_error + "\n"
    for node, facts in snapshot.facts.items():
        files[f"{node}/facts.json"] = _json(facts)
        for f in facts.netplan_files:
            files[f"{node}/netplan/{Path(f.path).name}"] = f.content if f.content is not None else "(unreadable)\n"
        for name, info in facts.containers.items():
            files[f"{node}/container-{name}.json"] = _json(info)
    for node, probe in snapshot.probes.items():
        files[f"{node}/probes.json"] = _json(dataclasses.replace(probe, container_logs="", serve_log_tail="",
                                                                 nccl_log=""))
        if probe.container_logs:
            files[f"{node}/container.log"] = probe.container_logs + "\n"
        if probe.serve_log_tail:
            files[f"{node}/serve.log"] = probe.serve_log_tail + "\n"
        if probe.nccl_log:
            files[f"{node}/nccl.log"] = probe.nccl_log
    for journal in journals:
        try:
            files[f"journals/{journal.name}"] = journal.read_text(encoding="utf-8", errors="replace")
        except OSError as exc:
            files[f"journals/{journal.name}.error"] = f"{exc}\n"
    return files


def write_bundle(path: str | Path, diagnosis: Diagnosis, snapshot: Snapshot, *,
                 journals: list[Path] | None = None) -> str:
    """Write the tar.gz (mode 600); returns its sha256."""
    path = Path(path)
    files = bundle_files(diagnosis, snapshot, latest_runs(JOURNALS) if journals is None else journals)
    top = f"sparkctl-doctor-{time.strftime('%Y%m%dT%H%M%S')}"
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name, text in sorted(files.items()):
            data = scrub(text).encode("utf-8")
            info = tarfile.TarInfo(f"{top}/{name}")
            info.size, info.mode, info.mtime = len(data), 0o600, int(time.time())
            tar.addfile(info, io.BytesIO(data))
    payload = buf.getvalue()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.touch(mode=0o600, exist_ok=True)
    path.chmod(0o600)
    path.write_bytes(payload)
    return hashlib.sha256(payload).hexdigest()
