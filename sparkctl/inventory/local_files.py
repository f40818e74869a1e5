"""The files on this machine an inventory names (ssh keys, known_hosts), judged before anything connects: paramiko
reads them whole, so a device, a FIFO or a huge file would hang or exhaust memory (a MemoryError from /dev/zero)."""

from __future__ import annotations

import os

from sparkctl.inventory.checks import InventoryParts, Problem
from sparkctl.userfiles import file_problem

#: An OpenSSH private key is a few KiB (an RSA 16384-bit key in PEM is under 13 KiB).
KEY_FILE_LIMIT = 64 << 10
#: known_hosts grows a line per host; tens of thousands of hosts stay well under this.
KNOWN_HOSTS_LIMIT = 16 << 20


def local_file_problems(parts: InventoryParts) -> list[Problem]:
    named: list[tuple[tuple, str, int, str]] = []
    if parts.ssh is not None:
        if parts.ssh.identity_file:
            named.append((("ssh", "identity_file"), parts.ssh.identity_file, KEY_FILE_LIMIT, "a private key"))
        named.append((("ssh", "known_hosts"), parts.ssh.known_hosts, KNOWN_HOSTS_LIMIT, "a known_hosts file"))
    for index, node in enumerate(parts.nodes):
        if node is not None and node.identity_file:
            named.append((("nodes", index, "identity_file"), node.identity_file, KEY_FILE_LIMIT, "a private key"))
    out: list[Problem] = []
    for loc, path, limit, what in named:
        reason = file_problem(os.path.expanduser(path), limit)
        if reason:
            out.append((loc, f"{path} {reason} (name {what} here)"))
    return out
