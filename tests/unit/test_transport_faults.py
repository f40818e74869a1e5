"""SSHTransport when the node goes away, the person presses Ctrl-C, or the node's disk is full: against a REAL
OpenSSH server on 127.0.0.1 (tests/sshd_server.py), through a relay that can go silent like a cut cable."""

from __future__ import annotations

import contextlib
import os
import select
import socket
import subprocess
import threading
import time

import pytest

from sparkctl.errors import Interrupted, Unreachable
from sparkctl.transport.shell import RemoteFileError
from sparkctl.transport.ssh import DEAD_AFTER_S, KEEPALIVE_S, SSHTransport
from tests.unit.ssh_kit import NOPASSWD_USER, SUDO_USER, make_transport

pytestmark = pytest.mark.sshd


@pytest.fixture
def known_hosts(tmp_path):
    return str(tmp_path / "known_hosts")


class Relay:
    """127.0.0.1:<port> -> sshd, byte for byte, until `silence()`: then it stops answering (it reads nothing and
    sends nothing, the sockets stay open) and, as a node behind a pulled cable, takes no new connection; with
    `hang()` it still takes them (a node whose kernel answers while sshd is stuck)."""

    def __init__(self, target_port: int):
        self.server = socket.create_server(("127.0.0.1", 0))
        self.port = self.server.getsockname()[1]
        self.target_port = target_port
        self.silent = threading.Event()
        self.stopped = threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self.stopped.is_set():
            try:
                client, _ = self.server.accept()
            except OSError:
                return
            upstream = socket.create_connection(("127.0.0.1", self.target_port))
            threading.Thread(target=self._pump, args=(client, upstream), daemon=True).start()

    def _pump(self, a: socket.socket, b: socket.socket) -> None:
        while not self.stopped.is_set():
            if self.silent.is_set():
                time.sleep(0.05)
                continue
            ready, _, _ = select.select([a, b], [], [], 0.05)
            for sock in ready:
                try:
                    data = sock.recv(65536)
                    if data:
                        (b if sock is a else a).sendall(data)
                except OSError:  # an end reset the connection (the client gave up on a silent node): done
                    data = b""
                if not data:
                    return

    def silence(self) -> None:
        self.silent.set()
        with contextlib.suppress(OSError):
            self.server.shutdown(socket.SHUT_RDWR)  # stops listening (close alone would not, under accept)
        self.server.close()

    def hang(self) -> None:
        self.silent.set()

    def close(self) -> None:
        self.stopped.set()
        self.server.close()


def relayed(sshd, known_hosts, relay, **options) -> SSHTransport:
    options.setdefault("identity_file", str(sshd.client_key))
    return SSHTransport("spark2", "127.0.0.1", user=SUDO_USER, port=relay.port, known_hosts_path=known_hosts,
                        use_ssh_config=False, **options)


def test_every_connection_is_watched_for_a_dead_peer(sshd, users, known_hosts):  # noqa: F811
    ssh = make_transport(sshd, known_hosts)
    try:
        assert ssh.run("true").ok
        sock = ssh._conn.transport.sock
        # unacknowledged data for DEAD_AFTER_S ends the connection (the kernel's retransmissions would take ~15 min)
        assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT) == DEAD_AFTER_S * 1000
        assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE) == 1
        assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE) == KEEPALIVE_S
        # and an SSH keepalive after KEEPALIVE_S idle seconds, so a silent connection still has data in flight
        assert ssh._conn.transport.packetizer._Packetizer__keepalive_interval == KEEPALIVE_S
        assert KEEPALIVE_S + DEAD_AFTER_S < 30  # a cut node is noticed well inside the 30 s
    finally:
        ssh.close()


def test_a_node_that_stops_answering_is_unreachable_after_one_wait_not_two(sshd, users, known_hosts):  # noqa: F811
    relay = Relay(sshd.port)
    ssh = relayed(sshd, known_hosts, relay)
    try:
        assert ssh.run("true").ok  # logged in with the default's room for a loaded sshd
        ssh.connect_timeout = 2  # the wait measured below
        relay.silence()
        started = time.monotonic()
        with pytest.raises(Unreachable) as lost:
            ssh.run("true")
        waited = time.monotonic() - started
        assert lost.value.node == "spark2" and not lost.value.closed
        assert "spark2 (127.0.0.1): stopped answering" in lost.value.message
        # the channel never opened: one connect_timeout (2 s), and no reconnect that would wait as long again
        assert waited < 2 * ssh.connect_timeout, waited
    finally:
        ssh.close()
        relay.close()


@pytest.mark.slow
def test_a_node_that_answers_but_opens_no_session_gets_a_second_wait(sshd, users, known_hosts):  # noqa: F811
    relay = Relay(sshd.port)
    ssh = relayed(sshd, known_hosts, relay)
    try:
        assert ssh.run("true").ok  # logged in with the default's room for a loaded sshd
        ssh.connect_timeout = 2  # the wait measured below
        relay.hang()  # slow or stuck, not gone: its port still takes connections
        started = time.monotonic()
        with pytest.raises(Unreachable) as stuck:
            ssh.run("true")
        assert time.monotonic() - started >= 2 * ssh.connect_timeout
        assert stuck.value.message == "spark2 (127.0.0.1): no session opened in 4s (Timeout opening channel.)"
    finally:
        ssh.close()
        relay.close()


def test_a_connection_closed_by_the_node_is_marked_closed(fresh_sshd, users, known_hosts):  # noqa: F811
    sshd = fresh_sshd
    ssh = make_transport(sshd, known_hosts)
    try:
        assert ssh.run("true").ok
        holder = {}

        def run():
            try:
                ssh.run("sleep 20", timeout=30)
            except Unreachable as exc:
                holder["lost"] = exc

        worker = threading.Thread(target=run)
        worker.start()
        deadline = time.monotonic() + 15  # until the command runs on the node (a loaded machine is slow to start it)
        while True:
            pids = subprocess.run(["pgrep", "-u", SUDO_USER, "-f", "^sleep 20$"], capture_output=True, text=True)
            if pids.returncode == 0 or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        # the node's side of our session goes away (sshd restarted with its sessions, the session killed)
        # this test's own sshd: its per-connection processes (monitor and session), found from its pid down
        sessions, parents = [], [str(sshd.proc.pid)]
        while parents:
            children = subprocess.run(["pgrep", "-P", ",".join(parents)], capture_output=True, text=True)
            parents = [p for p in children.stdout.split() if p]
            sessions += parents
        assert sessions
        for pid in sessions:
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(pid), 9)
        worker.join(10)
        assert not worker.is_alive()
        lost = holder["lost"]
        assert lost.node == "spark1" and lost.closed and "closed the connection while a command ran" in lost.message
        assert lost.message.endswith("(the node's side closed it)")  # what was seen of the end, in words
        assert pids.returncode == 0  # it did run
        assert ssh.run("echo back").stdout == "back\n"  # the next command opens a new connection
    finally:
        ssh.close()


def test_ctrl_c_cuts_the_running_command_and_every_later_one(sshd, users, known_hosts):  # noqa: F811
    ssh = make_transport(sshd, known_hosts)
    try:
        assert ssh.run("true").ok
        holder = {}

        def run():
            started = time.monotonic()
            try:
                ssh.run("sleep 25", timeout=30)
            except Interrupted as exc:
                holder["cut"] = (exc, time.monotonic() - started)

        worker = threading.Thread(target=run)
        worker.start()
        time.sleep(0.5)
        ssh.interrupt()
        worker.join(10)
        assert "cut" in holder, "the command was not cut"
        assert holder["cut"][1] < 5  # cut at once, not when the command ends (25 s)
        with pytest.raises(Interrupted):
            ssh.run("true")
        with pytest.raises(Interrupted):
            ssh.put("/tmp/never", "x")
    finally:
        ssh.close()


def test_a_full_disk_is_named_and_the_temp_file_does_not_stay(sshd, users, known_hosts, tmp_path):  # noqa: F811
    full = users["workdir"] / "full"
    full.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size=64k,uid={SUDO_USER},mode=755", "tmpfs", str(full)],
                   check=True)
    try:
        (full / "entrypoint.sh").write_text("old\n")
        subprocess.run(["dd", "if=/dev/zero", f"of={full}/filler", "bs=4k"], capture_output=True)
        ssh = make_transport(sshd, known_hosts)
        try:
            with pytest.raises(RemoteFileError) as err:
                ssh.put(str(full / "entrypoint.sh"), "x" * 200_000)
            assert "no space left on the device" in err.value.message
            assert err.value.hint.startswith("free space on spark1 (df -h")
        finally:
            ssh.close()
        root = make_transport(sshd, known_hosts, user=NOPASSWD_USER)
        try:
            with pytest.raises(RemoteFileError) as err:
                root.put(str(full / "entrypoint.sh"), "x" * 200_000, sudo=True)  # the sudo path: mktemp, cat, mv
            assert "No space left on device" in err.value.message
            assert err.value.hint.startswith("free space on spark1 (df -h")
        finally:
            root.close()
        assert sorted(os.listdir(full)) == ["entrypoint.sh", "filler"]  # nothing half-written left behind
        assert (full / "entrypoint.sh").read_text() == "old\n"
    finally:
        subprocess.run(["umount", str(full)], check=True)


def test_a_connection_that_died_under_the_run_is_told_from_one_closed_on_purpose(sshd, users, known_hosts):  # noqa: F811
    relay = Relay(sshd.port)
    ssh = relayed(sshd, known_hosts, relay)
    try:
        assert not ssh.connection_dead()  # never opened
        assert ssh.run("true").ok
        assert not ssh.connection_dead()
        ssh._conn.transport.sock.shutdown(socket.SHUT_RDWR)  # what the kernel does once TCP_USER_TIMEOUT passes
        deadline = time.monotonic() + 10
        while not ssh.connection_dead() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert ssh.connection_dead()
        ssh.close()
        assert not ssh.connection_dead()  # closed on purpose
        assert ssh.run("true").ok and not ssh.connection_dead()  # reopened
    finally:
        ssh.close()
        relay.close()
