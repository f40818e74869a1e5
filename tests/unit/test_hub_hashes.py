"""plan/hub_hashes.py on real files: the etag's kind of hash (sha256, git blob sha1), the record of what was
verified, and a file changed in place found by its stat."""

from __future__ import annotations

import hashlib
import subprocess
from pathlib import Path

from sparkctl.plan import hub_hashes


def run(script: str) -> str:
    """As a node runs what sparkctl sends it (transport/shell.py: `bash -c`)."""
    return subprocess.run(["bash", "-c", script], capture_output=True, text=True, check=False).stdout


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


def test_a_local_dir_is_verified_by_its_download_metadata(tmp_path: Path):
    """A --local-dir download as huggingface_hub writes it (the lab's `hf` stand-in): each file's etag is the second
    line of its .cache/huggingface/download/<file>.metadata; a file changed in place, same size, does not verify."""
    from tests.unit.hf_kit import hf, hf_env

    local = tmp_path / "sparkctl-models" / "nvidia--Qwen3-235B-A22B-Eagle3"
    downloaded = hf(hf_env(tmp_path / "home"), "download", "nvidia/Qwen3-235B-A22B-Eagle3", "--local-dir", str(local))
    assert downloaded.returncode == 0, downloaded.stderr
    record = hub_hashes.record_path(str(tmp_path), str(local))
    listing = run(hub_hashes.local_etags_script(str(local)) + "\n" + hub_hashes.stat_script(str(local), record, False))
    etags = hub_hashes.parse_etags(listing)
    files = sorted(p.name for p in local.iterdir() if p.is_file())
    assert sorted(etags) == files and len(etags["model.safetensors"]) == 64 and len(etags["config.json"]) == 40
    lines, stats = hub_hashes.parse_stats(listing)
    assert sorted(stats) == files  # the metadata's own files are not the repo's
    todo = hub_hashes.unverified(sorted(etags), lines, stats, etags=etags)
    assert todo == files
    good, bad = hub_hashes.judged(hub_hashes.parse_hashes(run(hub_hashes.hash_script(str(local), todo, etags))), etags)
    assert bad == [] and len(good) == len(files)
    Path(record).parent.mkdir(parents=True, exist_ok=True)
    Path(record).write_text("\n".join(good) + "\n")
    lines, stats = hub_hashes.parse_stats(run(hub_hashes.stat_script(str(local), record, False)))
    assert hub_hashes.unverified(sorted(etags), lines, stats, etags=etags) == []
    assert run(hub_hashes.changed_local_since_verified_script(str(local), record)) == ""  # doctor's read
    weight = local / "model.safetensors"
    data = bytearray(weight.read_bytes())
    data[100] ^= 1
    weight.write_bytes(bytes(data))
    lines, stats = hub_hashes.parse_stats(run(hub_hashes.stat_script(str(local), record, False)))
    assert hub_hashes.unverified(sorted(etags), lines, stats, etags=etags) == ["model.safetensors"]
    assert run(hub_hashes.changed_local_since_verified_script(str(local), record)) == "U\n"
    _good, bad = hub_hashes.judged(
        hub_hashes.parse_hashes(run(hub_hashes.hash_script(str(local), ["model.safetensors"], etags))), etags)
    assert bad == ["model.safetensors"]


def test_a_repo_never_verified_here_is_no_change_to_report(tmp_path: Path):
    """doctor's `changed since verified`: a blob whose stat is not the recorded one is a `U`; a repo this node keeps
    no record of (never verified here: a copy of serve.distribute) prints nothing at all."""
    repo = tmp_path / "models--org--m"
    (repo / "blobs").mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("c" * 40)
    snapshot = repo / "snapshots" / ("c" * 40)
    snapshot.mkdir(parents=True)
    etag = hashlib.sha256(b"w").hexdigest()
    (repo / "blobs" / etag).write_bytes(b"w")
    (snapshot / "model.safetensors").symlink_to(f"../../blobs/{etag}")
    record = hub_hashes.record_path(str(tmp_path), str(repo))
    assert run(hub_hashes.changed_since_verified_script(str(repo), record)) == ""
    Path(record).parent.mkdir()
    Path(record).write_text(f"{etag}\t0\t0\t0\n")  # another stat than the blob's
    assert run(hub_hashes.changed_since_verified_script(str(repo), record)) == "U\n"
