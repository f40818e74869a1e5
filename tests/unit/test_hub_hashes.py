"""plan/hub_hashes.py on real files: the etag's kind of hash (sha256, git blob sha1), the record of what was
verified, and a file changed in place found by its stat."""

from __future__ import annotations

import hashlib
import subprocess
from pathlib import Path

from sparkctl.plan import hub_hashes


def run(script: str) -> str:
    return subprocess.run(["sh", "-c", script], capture_output=True, text=True, check=False).stdout


def test_blobs_are_hashed_by_their_etag_s_kind_recorded_and_read_again_only_when_changed(tmp_path: Path):
    repo = tmp_path / "models--org--m"
    (repo / "blobs").mkdir(parents=True)
    weight, config = b"w" * 100_000, b'{"a": 1}\n'
    lfs = hashlib.sha256(weight).hexdigest()
    git = hashlib.sha1(b"blob %d\0" % len(config) + config).hexdigest()
    (repo / "blobs" / lfs).write_bytes(weight)
    (repo / "blobs" / git).write_bytes(config)
    record = hub_hashes.record_path(str(tmp_path), str(repo))
    assert record == f"{tmp_path}/sparkctl-verified/models--org--m.tsv"
    paths = [f"blobs/{lfs}", f"blobs/{git}", "refs/main"]

    def unverified() -> list[str]:
        lines, stats = hub_hashes.parse_stats(run(hub_hashes.stat_script(str(repo), record)))
        return hub_hashes.unverified(paths, lines, stats)

    assert unverified() == paths[:2]
    good, bad = hub_hashes.judged(hub_hashes.parse_hashes(run(hub_hashes.hash_script(str(repo), paths[:2]))))
    assert len(good) == 2 and bad == []
    Path(record).parent.mkdir()
    Path(record).write_text("\n".join(good) + "\n")
    assert unverified() == []
    with open(repo / "blobs" / lfs, "r+b") as handle:  # the same size, one byte changed
        handle.seek(50_000)
        handle.write(b"x")
    assert unverified() == [f"blobs/{lfs}"]
    good, bad = hub_hashes.judged(hub_hashes.parse_hashes(run(hub_hashes.hash_script(str(repo), [f"blobs/{lfs}"]))))
    assert good == [] and bad == [f"blobs/{lfs}"]
    assert hub_hashes.etag_of("blobs/xyz") is None and hub_hashes.etag_of("snapshots/a/b") is None
