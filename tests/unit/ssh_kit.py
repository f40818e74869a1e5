"""Users and transports for the tests against a real sshd on loopback (tests/sshd_server.py)."""

from __future__ import annotations

import os
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
