"""The support bundle: one tar.gz with what a bug report needs, every secret redacted on the way in."""

from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import os
import re
import tarfile
import time
from pathlib import Path
from typing import Any

import yaml

from sparkctl.doctor.findings import Diagnosis
from sparkctl.doctor.snapshot import Snapshot
from sparkctl.engine.journal import latest_runs
from sparkctl.secrets import MASK, redact, redact_known

JOURNALS = 5
#: A key whose value is a secret: VAR=..., `password: ...`, netplan's auth password, NetworkManager's
#: `wifi-security.psk`, a JSON "api_key": ...
_SECRET_KEY = r"[A-Za-z0-9_.-]*(?:token|password|passwd|passphrase|secret|api[_-]?key|psk|wep-key)[A-Za-z0-9_.-]*"
_SECRET_KEY_NAME = re.compile(rf"(?i)^{_SECRET_KEY}$")
# Token shapes redacted even when nobody registered them: Hugging Face, NGC, GitHub, bearer headers, and the
# value of any key whose name says it is secret, quoted ("x", 'x', JSON's \"x\") or bare.
_TOKEN_PATTERNS = [
    re.compile(r"\bhf_[A-Za-z0-9]{16,}"),
    re.compile(r"\bnvapi-[A-Za-z0-9_-]{16,}"),
    re.compile(r"\bgh[pousr]_[A-Za-z0-9]{20,}"),
    re.compile(r"(?i)(bearer\s+)[A-Za-z0-9._~+/-]{16,}=*"),
    re.compile(rf"(?i)\b({_SECRET_KEY}(?:\\?[\"'])?\s*[=:]\s*(\\?[\"']))(?!{re.escape(MASK)}\2).*?(\2)"),
    # bare values only after a bare key: a JSON key's bare value is a number, true, false or null
    re.compile(rf"(?i)\b({_SECRET_KEY}\s*[=:]\s*)(?![\\\"'])(?!{re.escape(MASK)})[^\s\"',}}\]]+"),
]
#: Structural masking ignores shorter values (masking every "1" would wreck the bundle); the key patterns
#: above still mask them where they stand.
MIN_STRUCTURAL = 4


def scrub(text: str) -> str:
    """Registered secrets (sudo password, HF token of this run) and anything shaped like a token, masked."""
    text = redact_known(text)
    for pattern in _TOKEN_PATTERNS:
        text = pattern.sub(_mask, text)
    return text


def _mask(m: re.Match) -> str:
    if m.re.groups == 3:  # quoted: keep the key and both quotes
        return m.group(1) + MASK + m.group(3)
    return (m.group(1) if m.re.groups else "") + MASK


def netplan_secrets(text: str | None) -> set[str]:
    """Values under secret keys of a netplan document (auth.password, a NetworkManager passthrough psk, ...),
    as they may be written in it or in JSON: masked wherever they appear, whatever the quoting or layout."""
    try:
        document = yaml.safe_load(text or "")
    except yaml.YAMLError:
        return set()
    found: set[str] = set()

    def walk(value: Any, secret: bool) -> None:
        if isinstance(value, dict):
            for k, v in value.items():
                walk(v, secret or bool(_SECRET_KEY_NAME.match(str(k))))
        elif isinstance(value, list):
            for v in value:
                walk(v, secret)
        elif secret and value is not None and not isinstance(value, bool):
            found.add(str(value))

    walk(document, False)
    out = set()
    for value in found:
        if len(value) >= MIN_STRUCTURAL:
            out |= {value, json.dumps(value)[1:-1], json.dumps(json.dumps(value))[3:-3]}
    return out


def unwritable_reason(path: str | Path) -> str | None:
    """Why a file cannot be written at `path` (checked before the work that produces it), or None."""
    target = Path(path).absolute()
    if target.is_dir():
        return "is a directory"
    if target.exists():
        return None if os.access(target, os.W_OK) else "permission denied"
    parent = target.parent
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir():
        return f"{parent} is not a directory"
    if not os.access(parent, os.W_OK | os.X_OK):
        return f"cannot create files in {parent}: permission denied"
    return None


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
    # netplan may hold Wi-Fi keys (NetworkManager writes them to 90-NM-*.yaml): found by structure, then
    # masked in every file (facts.json carries the same documents)
    secrets = set().union(*(netplan_secrets(f.content) for facts in snapshot.facts.values()
                            for f in facts.netplan_files))
    top = f"sparkctl-doctor-{time.strftime('%Y%m%dT%H%M%S')}"
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name, text in sorted(files.items()):
            data = scrub(redact(text, secrets)).encode("utf-8")
            info = tarfile.TarInfo(f"{top}/{name}")
            info.size, info.mode, info.mtime = len(data), 0o600, int(time.time())
            tar.addfile(info, io.BytesIO(data))
    payload = buf.getvalue()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.touch(mode=0o600, exist_ok=True)
    path.chmod(0o600)
    path.write_bytes(payload)
    return hashlib.sha256(payload).hexdigest()
