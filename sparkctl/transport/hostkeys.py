"""Host key policy: verify against known_hosts, accept-new on first contact, refuse a changed key.

paramiko compares the server key with what the client loaded (hashed `|1|` entries included) and raises
BadHostKeyException on a mismatch of the same key type; our policy is asked only when it holds no key
of that type. We then refuse if the host is known under any other key type too (a key that changed
type is still a changed key) and otherwise record it, like OpenSSH's StrictHostKeyChecking=accept-new.
"""

from __future__ import annotations

import fcntl
import hashlib
import logging
import os
import threading

import paramiko

from sparkctl.transport.base import q

log = logging.getLogger(__name__)

# Nodes are connected in parallel threads: appends to one file must not interleave.
_append_lock = threading.Lock()


def host_key_name(host: str, port: int) -> str:
    """The known_hosts name for a host: `host` on port 22, `[host]:port` elsewhere (as OpenSSH writes it)."""
    return host if port == 22 else f"[{host}]:{port}"


def removal_command(known_hosts_path: str, host: str, port: int) -> str:
    """The exact line that forgets the old key of a host."""
    return f"ssh-keygen -f {q(known_hosts_path)} -R {q(host_key_name(host, port))}"


# known_hosts parsed once per content, not once per node: every line is a key to decode, and a cluster's file holds
# every node's, so parsing it for each connection grew with the square of the nodes. Keyed by the bytes read, so an
# edit is never missed (paramiko.HostKeys.load's own rules: blank, comment and unreadable lines skipped).
_parsed: dict[tuple[str, bytes], list[tuple[str, paramiko.PKey]]] = {}
_parsed_lock = threading.Lock()


def _known_host_keys(known_hosts_path: str) -> list[tuple[str, paramiko.PKey]]:
    with open(known_hosts_path, "rb") as handle:
        content = handle.read()
    state = (known_hosts_path, hashlib.sha256(content).digest())
    with _parsed_lock:
        if state not in _parsed:
            keys: list[tuple[str, paramiko.PKey]] = []
            # the lines a text-mode file yields (universal newlines), as paramiko reads them
            text = content.decode().replace("\r\n", "\n").replace("\r", "\n")
            for lineno, line in enumerate(text.split("\n"), 1):
                line = line.strip()
                if not line or line.startswith("#"):
                    continue
                try:
                    entry = paramiko.hostkeys.HostKeyEntry.from_line(line, lineno)
                except paramiko.SSHException:
                    continue
                if entry is not None:
                    keys += [(name, entry.key) for name in entry.hostnames]
            _parsed.clear()
            _parsed[state] = keys
        return _parsed[state]


def load_known_hosts(client: paramiko.SSHClient, known_hosts_path: str) -> None:
    """Give the client the keys of `known_hosts_path` so that paramiko detects a mismatching key. A host listed
    twice with one key type keeps its first key, as paramiko's own loading does (its lookup takes the first)."""
    if not os.path.isfile(known_hosts_path):
        return
    host_keys = client.get_host_keys()
    given: set[tuple[str, str]] = set()
    for name, key in _known_host_keys(known_hosts_path):
        if (name, key.get_name()) not in given:
            given.add((name, key.get_name()))
            host_keys.add(name, key.get_name(), key)


def append_known_host(known_hosts_path: str, name: str, key: paramiko.PKey) -> None:
    """Record one host key at the end of known_hosts (creating the file and its 0700 directory).

    Nodes connect in parallel (threads, maybe processes): under the lock, the file is read again so a
    key recorded meanwhile is not appended twice, and a different one recorded meanwhile is refused.
    """
    directory = os.path.dirname(known_hosts_path)
    if directory and not os.path.isdir(directory) and directory == os.path.expanduser("~/.ssh"):
        os.makedirs(directory, mode=0o700, exist_ok=True)  # as ssh does; any other folder was checked up front
    line = f"{name} {key.get_name()} {key.get_base64()}\n"
    with _append_lock, open(known_hosts_path, "a+b") as handle:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
        try:
            known = paramiko.HostKeys(known_hosts_path).lookup(name)
            if known:
                if key.get_name() in known and known[key.get_name()] == key:
                    return
                raise paramiko.BadHostKeyException(name, key, next(iter(known.values())))
            handle.seek(0, os.SEEK_END)
            if handle.tell() > 0:
                handle.seek(-1, os.SEEK_END)
                if handle.read(1) != b"\n":
                    handle.write(b"\n")
            handle.write(line.encode())
            handle.flush()
        finally:
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)


class AcceptNewPolicy(paramiko.MissingHostKeyPolicy):
    """First contact: accept the key for this connection; it is written to known_hosts only once the login
    worked (`commit`), so a host that refused us leaves nothing behind. A host known under another key: refuse."""

    def __init__(self, known_hosts_path: str):
        self.known_hosts_path = known_hosts_path
        self.pending: list[tuple[str, paramiko.PKey]] = []

    def missing_host_key(self, client: paramiko.SSHClient, hostname: str, key: paramiko.PKey) -> None:
        known = client.get_host_keys().lookup(hostname)
        if known is None:
            known = client._system_host_keys.lookup(hostname)  # noqa: SLF001 (paramiko has no getter)
        if known:
            expected = next(iter(known.values()))
            raise paramiko.BadHostKeyException(hostname, key, expected)
        client.get_host_keys().add(hostname, key.get_name(), key)
        self.pending.append((hostname, key))

    def commit(self) -> None:
        """The login worked: record the keys met on first contact."""
        for hostname, key in self.pending:
            append_known_host(self.known_hosts_path, hostname, key)
            log.info("recorded new host key for %s (%s) in %s", hostname, key.get_name(), self.known_hosts_path)
        self.pending.clear()


def secure_client(client: paramiko.SSHClient, known_hosts_path: str) -> AcceptNewPolicy:
    """Replace fabric's AutoAddPolicy: load known_hosts and accept new keys only (after a working login)."""
    load_known_hosts(client, known_hosts_path)
    policy = AcceptNewPolicy(known_hosts_path)
    client.set_missing_host_key_policy(policy)
    return policy
