"""The lab's `hf` stand-in run for real in a temporary HF home, and a fixture repo whose main moved on the "Hub"."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
from pathlib import Path

from sparkctl.lab.standins import fixture_repos_dir, standin_path


def hf_env(home: Path, fixtures: Path | None = None) -> dict[str, str]:
    """The stand-in's environment: an HF home, the fixture repos (the "Hub"), a token, nothing else set."""
    return {"HF_HOME": str(home), "SPARKCTL_LAB_FIXTURE_REPOS": str(fixtures or fixture_repos_dir()),
            "HF_TOKEN": "hf_x", "HF_TOKEN_PATH": "", "HF_HUB_CACHE": "", "SPARKCTL_LAB_HF_FAIL_AFTER_BYTES": ""}


def hf(env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(standin_path("hf")), *args], env={**os.environ, **env}, capture_output=True,
                          text=True, timeout=30)


def hf_commit(repo_dir: Path) -> str:
    """The commit the stand-in names a fixture tree by (hf: commit_of)."""
    files = sorted(str(p.relative_to(repo_dir)) for p in repo_dir.rglob("*") if p.is_file() and p.name != "repo.json")
    digest = hashlib.sha1()
    for name in files:
        digest.update(name.encode() + b"\0" + hashlib.sha256((repo_dir / name).read_bytes()).hexdigest().encode())
    return digest.hexdigest()


def moved_main(tmp_path: Path, repo: str = "openai--gpt-oss-120b") -> tuple[Path, str]:
    """A copy of the fixture repos where `repo`'s main moved on: its old tree kept in history, a file changed.
    Returns the copy and the old commit."""
    fixtures = tmp_path / "fixtures"
    shutil.copytree(fixture_repos_dir(), fixtures, symlinks=True)
    old = hf_commit(fixtures / repo)
    shutil.copytree(fixtures / repo, fixtures / f"{repo}.history" / old)
    config = fixtures / repo / "config.json"
    config.write_text(config.read_text().rstrip().rstrip("}") + ', "moved": true}\n')
    return fixtures, old
