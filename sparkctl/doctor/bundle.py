"""The support bundle: one tar.gz with what a bug report needs, every secret redacted on the way in."""

from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import tarfile
import time
from pathlib import Path
from typing import Any

from sparkctl.doctor.findings import Diagnosis
from sparkctl.doctor.snapshot import Snapshot
from sparkctl.inventory import dump_inventory
from sparkctl.secrets import redact, scrub, secrets_in_yaml


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
    files = {"findings.json": json.dumps(diagnosis.to_dict(), indent=2) + "\n",
             "unreachable.json": _json(snapshot.unreachable),
             "inventory.yaml": dump_inventory(snapshot.inventory)}
    if snapshot.plan_error:
        files["plan-error.txt"] = snapshot.plan_error + "\n"
    for node, facts in snapshot.facts.items():
        nm = dataclasses.replace(facts.nm, raw="") if facts.nm is not None else None
        files[f"{node}/facts.json"] = _json(dataclasses.replace(facts, nm=nm))
        for f in facts.netplan_files:
            files[f"{node}/netplan/{Path(f.path).name}"] = f.content if f.content is not None else "(unreadable)\n"
        if facts.nm is not None:
            # nmcli's own words: devices, profiles (and their files), bindings; no secrets were asked for
            files[f"{node}/nmcli.txt"] = facts.nm.raw
        for name, info in facts.containers.items():
            files[f"{node}/container-{name}.json"] = _json(info)
    for node, probe in snapshot.probes.items():
        worlds = {key: dataclasses.replace(seen, serve_log_tail="", nccl_log="") for key, seen in probe.worlds.items()}
        files[f"{node}/probes.json"] = _json(dataclasses.replace(probe, container_logs="", serve_log_tail="",
                                                                 nccl_log="", worlds=worlds))
        if probe.container_logs:
            files[f"{node}/container.log"] = probe.container_logs + "\n"
        # each world's log beside the first's (serve--<key>.log: its dir's name on the node)
        for suffix, seen in (("", probe), *((f"--{key}", seen) for key, seen in probe.worlds.items())):
            if seen.serve_log_tail:
                files[f"{node}/serve{suffix}.log"] = seen.serve_log_tail + "\n"
            if seen.nccl_log:
                files[f"{node}/nccl{suffix}.log"] = seen.nccl_log
    for journal in journals:
        try:
            files[f"journals/{journal.name}"] = journal.read_text(encoding="utf-8", errors="replace")
        except OSError as exc:
            files[f"journals/{journal.name}.error"] = f"{exc}\n"
    return files


def write_bundle(path: str | Path, diagnosis: Diagnosis, snapshot: Snapshot, journals: list[Path]) -> str:
    """Write the tar.gz (mode 600; its folder must exist) with the given run journals; returns its sha256."""
    path = Path(path)
    payload = bundle_bytes(diagnosis, snapshot, journals)
    path.touch(mode=0o600, exist_ok=True)
    path.chmod(0o600)
    path.write_bytes(payload)
    return hashlib.sha256(payload).hexdigest()


def bundle_bytes(diagnosis: Diagnosis, snapshot: Snapshot, journals: list[Path]) -> bytes:
    """The tar.gz itself, every file redacted."""
    files = bundle_files(diagnosis, snapshot, journals)
    # netplan may hold Wi-Fi keys (NetworkManager writes them to 90-NM-*.yaml): found by structure, then
    # masked in every file (facts.json carries the same documents)
    secrets = set().union(*(secrets_in_yaml(f.content) for facts in snapshot.facts.values()
                            for f in facts.netplan_files))
    top = f"sparkctl-doctor-{time.strftime('%Y%m%dT%H%M%S')}"
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name, text in sorted(files.items()):
            data = scrub(redact(text, secrets)).encode("utf-8")
            info = tarfile.TarInfo(f"{top}/{name}")
            info.size, info.mode, info.mtime = len(data), 0o600, int(time.time())
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()
