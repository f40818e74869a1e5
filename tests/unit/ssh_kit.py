"""Users and transports for the tests against a real sshd on loopback (tests/sshd_server.py)."""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

from sparkctl.transport.ssh import SSHTransport

# Names of this process's own: other test runs in the same machine may create and remove theirs meanwhile.
SUDO_USER = f"sparkctl-t{os.getpid()}"  # sudo asks for a password
NOPASSWD_USER = f"sparkctl-n{os.getpid()}"  # sudo without a password
SUDOERS = Path(f"/etc/sudoers.d/sparkctl-tests-{os.getpid()}")


def make_transport(server, known_hosts, *, user=SUDO_USER, node="spark1", **options) -> SSHTransport:
    options.setdefault("identity_file", str(server.client_key))
    return SSHTransport(node, "127.0.0.1", user=user, port=server.port, known_hosts_path=known_hosts,
                        use_ssh_config=False, connect_timeout=5, **options)


@contextlib.contextmanager
def counting_sudo() -> Iterator[tuple[str, Callable[[], list[str]]]]:
    """A PATH whose `sudo` notes its first two words, then runs the real one; and the reader of those notes.
    In a directory of its own that any user may enter (pytest's tmp_path is root's only)."""
    bin_dir = Path(tempfile.mkdtemp(prefix="sparkctl-sudo-"))
    try:
        bin_dir.chmod(0o755)
        calls = bin_dir / "calls"
        calls.touch()
        calls.chmod(0o666)
        (bin_dir / "sudo").write_text(f'#!/bin/sh\necho "$1 $2" >> {calls}\nexec {shutil.which("sudo")} "$@"\n')
        (bin_dir / "sudo").chmod(0o755)
        yield (f"{bin_dir}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
               lambda: calls.read_text().splitlines())
    finally:
        shutil.rmtree(bin_dir, ignore_errors=True)
