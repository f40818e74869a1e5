"""Shared fixtures. The sshd ones start a real OpenSSH server on loopback (tests/sshd_server.py)."""

from __future__ import annotations

import pytest

from tests.sshd_server import SshdServer, sshd_available


@pytest.fixture(scope="module")
def sshd():
    """A running sshd on 127.0.0.1 that accepts `sshd.client_key` for any user; stopped at teardown."""
    if not sshd_available():
        pytest.skip("/usr/sbin/sshd or ssh-keygen not installed")
    with SshdServer() as server:
        yield server


@pytest.fixture
def fresh_sshd():
    """An sshd of the test's own, for tests that restart it or change its host key."""
    if not sshd_available():
        pytest.skip("/usr/sbin/sshd or ssh-keygen not installed")
    with SshdServer() as server:
        yield server
