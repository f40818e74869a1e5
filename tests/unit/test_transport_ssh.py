"""SSHTransport against a REAL OpenSSH server on 127.0.0.1 (tests/sshd_server.py)."""

from __future__ import annotations

import errno
import logging
import os
import pwd
import shutil
import socket
import stat
import threading
import time
from pathlib import Path

import fabric
import paramiko
import pytest

from sparkctl.errors import Unreachable
from sparkctl.transport.connect import NodeAddress, connect_all
from sparkctl.transport.hostkeys import AcceptNewPolicy
from sparkctl.transport.shell import RemoteFileError
from sparkctl.transport.ssh import SSHTransport
from sparkctl.transport.sudo import SudoMode, sudo_mode
from tests.sshd_server import free_port, make_key
from tests.unit.ssh_kit import NOPASSWD_USER, SUDO_USER, make_transport

pytestmark = pytest.mark.sshd


@pytest.fixture(autouse=True)
def _no_agent(monkeypatch):
    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)

@pytest.fixture
def ssh(sshd, users, known_hosts):
    transport = make_transport(sshd, known_hosts)
    yield transport
    transport.close()


# --- commands ---------------------------------------------------------------------------------------
def test_run_returns_output_and_exit_code(ssh):
    result = ssh.run("echo out; echo err >&2; whoami >&2; exit 3")
    assert (result.exit_code, result.stdout, result.stderr) == (3, "out\n", f"err\n{SUDO_USER}\n")
    assert ssh.round_trips == 1
    assert ssh.run("printf '%s|' \"it's\" '$(id)'").stdout == "it's|$(id)|"
    assert ssh.round_trips == 2


def test_the_socket_sends_small_packets_at_once_from_the_first_one():
    """TCP_NODELAY is set before the key exchange: the socket is opened the way paramiko would open it."""
    from paramiko.ssh_exception import NoValidConnectionsError

    from sparkctl.transport.ssh import _open_socket

    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        sock = _open_socket("localhost", listener.getsockname()[1], 5)
        with sock:
            assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) == 1
            assert sock.getpeername() == listener.getsockname()
            assert sock.gettimeout() == 5
    with pytest.raises(NoValidConnectionsError) as refused:
        _open_socket("127.0.0.1", free_port(), 5)
    assert [e.errno for e in refused.value.errors.values()] == [errno.ECONNREFUSED]
    with pytest.raises(socket.gaierror):
        _open_socket("no-such-host.invalid", 22, 5)


def test_the_connection_sends_small_packets_at_once(ssh, monkeypatch):
    """TCP_NODELAY from the first packet: a request/reply exchange must not wait out the peer's delayed ACK."""
    monkeypatch.setattr("sparkctl.transport.ssh._set_tcp_options", lambda sock: None)  # not set after the fact
    ssh.connect()
    sock = ssh._conn.transport.sock
    assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) == 1
    ssh.close()
    ssh.connect()  # a connection opened again has a socket of its own, set the same way
    assert ssh._conn.transport.sock is not sock
    assert ssh._conn.transport.sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) == 1
    assert ssh.run("echo again").stdout == "again\n"


def test_an_idle_connection_s_reader_wakes_once_a_second_and_still_answers_at_once(ssh):
    """paramiko's reader thread wakes at each timeout of its socket (0.1 s by default, ~1 ms of CPU per connection
    per second held): once connected, the tick is READER_TICK_S; data still wakes it at once, a close still
    ends the connection."""
    from sparkctl.transport.ssh import READER_TICK_S

    ssh.connect()
    transport = ssh._conn.transport
    assert READER_TICK_S >= 1 and transport.sock.gettimeout() == READER_TICK_S
    time.sleep(0.3)  # idle first: the reader is in its socket's wait when the command comes
    assert ssh.run("echo awake").stdout == "awake\n"
    ssh.close()
    assert not transport.is_active()


def test_stdin_is_closed_and_input_is_passed(ssh):
    ssh.connect()  # the bound is for the command, not the login
    started = time.monotonic()
    assert ssh.run("cat", timeout=10).stdout == ""
    assert time.monotonic() - started < 3
    assert ssh.run("cat; echo", input="line1\nline2").stdout == "line1\nline2\n"
    big = "x" * 3_000_000  # more than the SSH windows: stdin is fed while output is read
    assert ssh.run("cat", input=big).stdout == big


def test_timeout_is_enforced_on_the_node(ssh):
    ssh.connect()
    started = time.monotonic()
    result = ssh.run("sleep 31.25", timeout=0.5)
    assert result.timed_out and result.exit_code == 124
    assert time.monotonic() - started < 4
    assert ssh.run("pgrep -u \"$(id -u)\" -f '^sleep 31[.]25'").exit_code == 1


def test_put_is_atomic_with_mode_and_no_leftovers(ssh, users):
    directory = users["workdir"] / "put"
    directory.mkdir()
    shutil.chown(directory, SUDO_USER)
    target = directory / "config.yaml"
    target.write_text("old\n")
    ssh.put(str(target), "new: true\n", mode=0o640)
    assert target.read_text() == "new: true\n"
    info = target.stat()
    assert stat.S_IMODE(info.st_mode) == 0o640 and info.st_uid == pwd.getpwnam(SUDO_USER).pw_uid
    ssh.put(str(target), b"\x00\xffbin", mode=0o600)
    assert target.read_bytes() == b"\x00\xffbin" and stat.S_IMODE(target.stat().st_mode) == 0o600
    assert os.listdir(directory) == ["config.yaml"]
    with pytest.raises(RemoteFileError, match="parent directory .*/nope does not exist"):
        ssh.put(str(directory / "nope" / "f"), "x")
    with pytest.raises(RemoteFileError, match="permission denied"):
        ssh.put("/etc/sparkctl-test-denied", "x")
    assert os.listdir(directory) == ["config.yaml"]


def test_read(ssh, users):
    path = users["workdir"] / "readme"
    path.write_text("hello ü\n")
    assert ssh.read(str(path)) == "hello ü\n"
    assert ssh.read(str(users["workdir"] / "absent")) is None
    with pytest.raises(RemoteFileError, match="cannot read /etc/shadow"):
        ssh.read("/etc/shadow")


def test_exec_in_over_ssh_keeps_env_values_out_of_argv(ssh, users):
    cli = users["workdir"] / "fake-docker"
    cli.write_text('#!/bin/sh\necho "argv=$*"; echo "token=$HF_TOKEN"; ps -eo args | grep -c hf_s3cr3t\n')
    cli.chmod(0o755)
    ssh.container_cli = str(cli)
    result = ssh.exec_in("c1", "true", env={"HF_TOKEN": "hf_s3cr3t"})
    assert result.stdout.splitlines() == ["argv=exec -e HF_TOKEN c1 sh -c true", "token=hf_s3cr3t", "1"]


def test_a_lost_connection_is_reopened_once(ssh):
    assert ssh.run("true").ok
    ssh._conn.transport.close()  # as if the node rebooted between two tasks
    assert ssh.run("echo again").stdout == "again\n"
    ssh.close()
    assert ssh.run("echo reopened").stdout == "reopened\n"


# --- sudo -------------------------------------------------------------------------------------------
def test_sudo_without_password_is_refused_with_a_clear_message(ssh):
    assert sudo_mode(ssh) is SudoMode.NONE
    result = ssh.run("id -u", sudo=True)
    assert result.exit_code == 1 and result.stdout == ""
    assert result.stderr == ("sudo: a password is required on spark1 (run with --ask-become-pass, "
                             f"or allow passwordless sudo for {SUDO_USER})")


def test_sudo_with_password_feeds_it_on_stdin_only(sshd, users, known_hosts, caplog):
    password = users["password"]
    caplog.set_level(logging.DEBUG)
    transport = make_transport(sshd, known_hosts, become_password=password)
    try:
        assert transport.sudo_mode() is SudoMode.PASSWORD
        assert transport.run("id -u", sudo=True).stdout == "0\n"
        # The command's stdin holds the input only; no process shows the password in its argv.
        assert transport.run("cat", sudo=True, input="data").stdout == "data"
        assert password not in transport.run("ps -eo args; cat /proc/$$/environ", sudo=True).stdout
        target = users["workdir"] / "root-owned"
        transport.put(str(target), "via sudo\n", mode=0o600, owner="root:root", sudo=True)
        assert target.stat().st_uid == 0 and target.read_text() == "via sudo\n"
        assert transport.read(str(target), sudo=True) == "via sudo\n"
        assert not [n for n in os.listdir(users["workdir"]) if "sparkctl-" in n]
    finally:
        transport.close()
    assert "spark1: sudo id -u -> 0" in caplog.text
    assert password not in caplog.text


def test_wrong_sudo_password_is_refused(sshd, users, known_hosts):
    transport = make_transport(sshd, known_hosts, become_password="not-the-password")
    assert transport.sudo_mode() is SudoMode.WRONG_PASSWORD
    assert "become password was refused" in transport.run("true", sudo=True).stderr


def test_passwordless_sudo(sshd, users, known_hosts):
    transport = make_transport(sshd, known_hosts, user=NOPASSWD_USER, become_password="unused")
    assert transport.sudo_mode() is SudoMode.NOPASSWD
    assert transport.run("cat; id -u", sudo=True, input="in\n").stdout == "in\n0\n"


# --- host keys --------------------------------------------------------------------------------------
def test_first_contact_records_the_host_key_then_verifies_it(sshd, users, known_hosts):
    make_transport(sshd, known_hosts).connect()
    line = f"[127.0.0.1]:{sshd.port} {sshd.host_public_key()}\n"
    assert Path(known_hosts).read_text() == line
    make_transport(sshd, known_hosts).connect()
    assert Path(known_hosts).read_text() == line


def test_changed_host_key_is_refused_with_the_removal_line(fresh_sshd, users, known_hosts):
    make_transport(fresh_sshd, known_hosts).connect()
    recorded = Path(known_hosts).read_text()
    fresh_sshd.stop()
    fresh_sshd.new_host_key()
    fresh_sshd.start()
    with pytest.raises(Unreachable) as refused:
        make_transport(fresh_sshd, known_hosts, node="spark2").connect()
    assert refused.value.message.startswith("spark2 (127.0.0.1): host key CHANGED for [127.0.0.1]:")
    assert refused.value.hint.endswith(f"ssh-keygen -f {known_hosts} -R '[127.0.0.1]:{fresh_sshd.port}'")
    assert Path(known_hosts).read_text() == recorded


def test_hashed_known_hosts_entries_are_honoured(sshd, users, known_hosts, tmp_path):
    name = f"[127.0.0.1]:{sshd.port}"
    Path(known_hosts).write_text(f"{paramiko.HostKeys.hash_host(name)} {sshd.host_public_key()}\n")
    before = Path(known_hosts).read_text()
    make_transport(sshd, known_hosts).run("true")
    assert Path(known_hosts).read_text() == before  # matched: nothing appended
    other = make_key(tmp_path / "other")
    other_key = " ".join(Path(f"{other}.pub").read_text().split()[:2])
    Path(known_hosts).write_text(f"{paramiko.HostKeys.hash_host(name)} {other_key}\n")
    with pytest.raises(Unreachable, match="host key CHANGED"):
        make_transport(sshd, known_hosts).connect()


def test_a_known_host_with_a_key_of_another_type_is_refused(sshd, users, known_hosts, tmp_path):
    ecdsa = make_key(tmp_path / "ecdsa", kind="ecdsa")
    other_type = " ".join(Path(f"{ecdsa}.pub").read_text().split()[:2])
    Path(known_hosts).write_text(f"[127.0.0.1]:{sshd.port} {other_type}\n")
    with pytest.raises(Unreachable, match="host key CHANGED"):
        make_transport(sshd, known_hosts).connect()


# --- unreachable ------------------------------------------------------------------------------------
def test_refused_port():
    port = free_port()
    with pytest.raises(Unreachable) as refused:
        SSHTransport("spark2", "127.0.0.1", user="nvidia", port=port, known_hosts_path="/nonexistent/kh",
                     use_ssh_config=False).connect()
    assert refused.value.message == f"spark2 (127.0.0.1): connection refused on port {port}"
    assert refused.value.kind == "network"


def test_bad_authentication_leaves_no_host_key_behind(sshd, users, tmp_path):
    stranger = make_key(tmp_path / "stranger")
    known_hosts = tmp_path / "known_hosts"
    with pytest.raises(Unreachable) as refused:
        make_transport(sshd, str(known_hosts), identity_file=str(stranger), node="spark2").connect()
    assert refused.value.message == (f"spark2 (127.0.0.1): authentication failed for user {SUDO_USER}: the node "
                                     "refused every key offered")
    assert refused.value.kind == "auth" and "ssh.identity_file" in refused.value.hint
    assert not known_hosts.exists() or known_hosts.read_text() == ""  # first contact recorded only after a login
    make_transport(sshd, str(known_hosts)).connect()
    assert len(known_hosts.read_text().splitlines()) == 1


def test_no_key_to_offer_is_an_authentication_failure(sshd, users, known_hosts, tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.ssh/id_* either
    with pytest.raises(Unreachable) as refused:
        SSHTransport("spark2", "127.0.0.1", user=SUDO_USER, port=sshd.port, known_hosts_path=known_hosts,
                     use_ssh_config=False).connect()
    assert refused.value.kind == "auth" and "no key to offer" in refused.value.message


def test_silent_port_says_no_banner(known_hosts):
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        started = time.monotonic()
        with pytest.raises(Unreachable, match=r"spark3 \(127.0.0.1\): port \d+ accepted the connection but sent "
                                              r"no SSH banner within 0.5s"):
            SSHTransport("spark3", "127.0.0.1", user="nvidia", port=silent.getsockname()[1],
                         known_hosts_path=known_hosts, use_ssh_config=False, connect_timeout=0.5).connect()
        assert time.monotonic() - started < 4


def closing_server() -> tuple[socket.socket, threading.Thread]:
    """A port that accepts a connection and closes it at once (a lab that is down behind a gateway)."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()

    def serve():
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            conn.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    return server, thread


def test_a_port_that_closes_the_connection_is_named_not_timed_out(known_hosts):
    server, _ = closing_server()
    port = server.getsockname()[1]
    with server, pytest.raises(Unreachable) as closed:
        SSHTransport("spark3", "127.0.0.1", user="nvidia", port=port, known_hosts_path=known_hosts,
                     use_ssh_config=False, connect_timeout=10).connect()
    assert closed.value.message == (f"port {port} on spark3 (127.0.0.1) accepted and closed the connection: is "
                                    "it an SSH server, is the lab down?")
    assert closed.value.kind == "network"


# --- ssh_config and connect_all ---------------------------------------------------------------------
def test_ssh_config_alias_user_port_identity_and_proxyjump(sshd, users, known_hosts, tmp_path):
    config = tmp_path / "ssh_config"
    config.write_text(
        f"Host jump\n  HostName 127.0.0.1\n  Port {sshd.port}\n  User {NOPASSWD_USER}\n"
        f"  IdentityFile {sshd.client_key}\n"
        f"Host spark-alias\n  HostName 127.0.0.1\n  Port {sshd.port}\n  User {SUDO_USER}\n"
        f"  IdentityFile {sshd.client_key}\n  ProxyJump jump\n")
    transport = SSHTransport("spark1", "spark-alias", user=None, known_hosts_path=known_hosts,
                             ssh_config_path=str(config))
    assert (transport.host, transport.port, transport.user) == ("127.0.0.1", sshd.port, SUDO_USER)
    gateway = transport._conn.gateway
    assert isinstance(gateway, fabric.Connection) and gateway.user == NOPASSWD_USER
    assert isinstance(gateway.client._policy, AcceptNewPolicy)
    assert transport.run("whoami").stdout == f"{SUDO_USER}\n"
    assert gateway.is_connected
    transport.close()


def test_connect_all_in_parallel(sshd, users, known_hosts):
    specs = [NodeAddress(f"spark{i}", "127.0.0.1", SUDO_USER, sshd.port, str(sshd.client_key)) for i in range(4)]
    specs.append(NodeAddress("spark9", "127.0.0.1", SUDO_USER, free_port()))
    connected, unreachable = connect_all(specs, forks=5, known_hosts_path=known_hosts, use_ssh_config=False)
    assert sorted(connected) == ["spark0", "spark1", "spark2", "spark3"]
    assert list(unreachable) == ["spark9"] and "connection refused" in str(unreachable["spark9"])
    assert len(Path(known_hosts).read_text().splitlines()) == 1
    for transport in connected.values():
        assert transport.run("true").ok
        transport.close()


# --- a held command (the cluster lock's channel) ------------------------------------------------------------
def test_a_held_command_talks_both_ways_and_ends_when_closed(sshd, users, known_hosts):
    transport = make_transport(sshd, known_hosts)
    held = transport.hold('echo "ready $1"; while IFS= read -r line; do echo "got $line"; done; echo bye',
                          "x y", what="test")
    assert held.readline(10) == "ready x y"
    assert held.send("ping") and held.readline(10) == "got ping"
    assert held.readline(0.2) is None and not held.ended  # nothing more yet: still running
    held.close()
    assert transport.run("true").ok  # the connection itself goes on
    transport.close()
    assert not held.send("late")
