"""Shared fixtures. The sshd ones start a real OpenSSH server on loopback (tests/sshd_server.py)."""

from __future__ import annotations

import os

import pytest

from tests.sshd_server import SshdServer, sshd_available

#: The README's "Try it" lines: they start from no lab image and remove the one every lab test uses.
README_MODULE = "tests/lab/test_0_readme_try_it.py"


def pytest_configure(config):
    """A worker of pytest-xdist (the test command runs the suite in two) is given COLUMNS=80 and LINES=24 by its
    launcher: a test would then see an 80-column terminal where one run alone sees a pipe. Tests that want a
    width set it themselves."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        for name in ("COLUMNS", "LINES"):
            os.environ.pop(name, None)


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


def pytest_collection_modifyitems(session, config, items):
    """The README's lines first (nothing has built the lab image before them on a fresh machine), then the unit
    tests, then the lab's: with the suite split over workers, one runs the README's while the other runs the unit
    tests, and no lab starts until the README's are done (tests/lab/conftest.py, after_the_readme)."""
    def rank(item) -> int:
        path = item.nodeid.split("::", 1)[0]
        return 0 if path == README_MODULE else 2 if path.startswith("tests/lab/") else 1

    items.sort(key=rank)
