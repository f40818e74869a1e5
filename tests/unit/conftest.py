"""Fixtures of the tests against a real sshd on loopback: throwaway users with and without a sudo password."""

from __future__ import annotations

import contextlib
import os
import pwd
import secrets
import shutil
import subprocess
import tempfile
from pathlib import Path
from textwrap import dedent

import pytest

from tests.unit.ssh_kit import NOPASSWD_USER, SUDO_USER, SUDOERS


@pytest.fixture(scope="module")
def users():
    """Two throwaway users (a real password each, so sshd does not see a locked account) and their
    sudoers rules; removed at teardown. Root's own ~/.bashrc may be slow: tests log in as them."""
    if os.geteuid() != 0 or not shutil.which("useradd") or not shutil.which("sudo"):
        pytest.skip("needs root, useradd and sudo to create the test users")
    password = "pw-" + secrets.token_hex(8)
    for name in (SUDO_USER, NOPASSWD_USER):
        with contextlib.suppress(KeyError):
            pwd.getpwnam(name)
            subprocess.run(["userdel", "-r", "-f", name], capture_output=True)
        subprocess.run(["useradd", "-m", "-s", "/bin/bash", name], check=True)
        subprocess.run(["chpasswd"], input=f"{name}:{password}\n", text=True, check=True)
    SUDOERS.write_text(f"{SUDO_USER} ALL=(ALL) ALL\n{NOPASSWD_USER} ALL=(ALL) NOPASSWD: ALL\n")
    SUDOERS.chmod(0o440)
    workdir = Path(tempfile.mkdtemp(prefix="sparkctl-ssh-"))
    shutil.chown(workdir, SUDO_USER)
    yield {"password": password, "workdir": workdir}
    shutil.rmtree(workdir, ignore_errors=True)
    SUDOERS.unlink(missing_ok=True)
    for name in (SUDO_USER, NOPASSWD_USER):
        subprocess.run(["userdel", "-r", "-f", name], capture_output=True)


@pytest.fixture
def known_hosts(tmp_path):
    return str(tmp_path / "known_hosts")


@pytest.fixture
def inv_file(tmp_path, monkeypatch):
    """Write text to ./inv.yaml (so messages start with `inv.yaml:`) and return its relative path."""
    monkeypatch.chdir(tmp_path)

    def write(text: str) -> str:
        Path("inv.yaml").write_text(dedent(text))
        return "inv.yaml"

    return write
