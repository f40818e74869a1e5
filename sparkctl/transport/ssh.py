"""The SSH transport: one fabric/paramiko connection per node, reused for the whole run."""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import logging
import math
import os
import posixpath
import secrets
import select
import socket
import threading
import time

import fabric
import paramiko
from paramiko.ssh_exception import NoValidConnectionsError

from sparkctl.errors import Interrupted, Unreachable
from sparkctl.secrets import register_secret
from sparkctl.transport.base import q
from sparkctl.transport.hostkeys import host_key_name, removal_command, secure_client
from sparkctl.transport.shell import KILL_AFTER, RawResult, RemoteFileError, ShellTransport

log = logging.getLogger(__name__)

_CHUNK = 65536
_LOST = (paramiko.SSHException, EOFError, OSError)
#: An SSH keepalive after this many idle seconds (ssh's ServerAliveInterval): a silent connection still carries
#: traffic, so a node whose link was cut has data left unacknowledged.
KEEPALIVE_S = 5
#: How often an idle connection's reader thread wakes (_detect_dead_peer).
READER_TICK_S = 1.0
#: Data unacknowledged this long means the node is gone (TCP_USER_TIMEOUT). With the keepalive, a node cut off
#: is noticed within KEEPALIVE_S + DEAD_AFTER_S, not after TCP's ~15 minutes of retransmissions. A node that is
#: merely slow still acknowledges (its kernel does), so slowness never trips it.
DEAD_AFTER_S = 10
#: How long a TCP connect to the node's sshd port may take to tell "the node is there" from "the node is gone".
PROBE_S = 2


@dataclasses.dataclass(frozen=True)
class _Target:
    """Where and how to log in, as given (ssh's own config may still fill in the rest)."""
    host: str
    user: str | None
    port: int | None
    identity_file: str | None
    use_ssh_config: bool
    ssh_config_path: str | None


class SSHTransport(ShellTransport):
    """A node reached over SSH. Opens lazily on first use, or explicitly with `connect()`.

    ssh_config is honoured when `use_ssh_config` (Host alias, HostName, User, Port, IdentityFile,
    ProxyJump); `ssh_config_path` replaces ~/.ssh/config + /etc/ssh/ssh_config when given. Explicit
    `user`/`port` win over ssh_config, as on the ssh command line.
    """

    def __init__(self, node: str, host: str, *, user: str | None, port: int | None = None,
                 identity_file: str | None = None, known_hosts_path: str, use_ssh_config: bool = True,
                 connect_timeout: float = 10, become_password: str | None = None,
                 ssh_config_path: str | None = None):
        super().__init__()
        self.node = node
        self.known_hosts_path = os.path.expanduser(known_hosts_path)
        self.become_password = become_password
        register_secret(become_password)
        self._spec = _Target(host, user, port, identity_file, use_ssh_config, ssh_config_path)
        self.connect_timeout = connect_timeout
        self._open_lock = threading.Lock()
        self._sftp_lock = threading.Lock()
        self._interrupted = False
        self._closed = False  # close() was called: an inactive transport is then not a dead connection
        self._conn = self._make_connection()
        self.user: str = self._conn.user
        self.host: str = self._conn.host
        self.port: int = self._conn.port

    def _make_connection(self) -> fabric.Connection:
        spec = self._spec
        use_config = spec.use_ssh_config
        config = fabric.Config(
            overrides={"load_ssh_configs": use_config},
            runtime_ssh_path=spec.ssh_config_path if use_config else None,
        )
        connect_kwargs: dict[str, object] = {
            "banner_timeout": self.connect_timeout,
            "auth_timeout": max(self.connect_timeout, 30),
        }
        if spec.identity_file:
            connect_kwargs["key_filename"] = [os.path.expanduser(spec.identity_file)]
        # fabric truncates connect_timeout to int seconds (0.5 would mean "no timeout"): round up.
        conn = fabric.Connection(spec.host, user=spec.user, port=spec.port, config=config,
                                 connect_timeout=max(1, math.ceil(self.connect_timeout)),
                                 connect_kwargs=connect_kwargs)
        # fabric installs AutoAddPolicy on every client, jump hosts included: replace it everywhere.
        self._policies = []
        hop: object = conn
        while isinstance(hop, fabric.Connection):
            self._policies.append(secure_client(hop.client, self.known_hosts_path))
            hop = hop.gateway
        return conn

    @property
    def where(self) -> str:
        return self.node if self.node == self.host else f"{self.node} ({self.host})"

    # --- connection ---------------------------------------------------------------------------
    def connect(self) -> None:
        """Open the connection now; raise Unreachable with a one-line reason if that fails."""
        with self._open_lock:
            if self._conn.is_connected:
                return
            started = time.monotonic()
            try:
                if not self._conn.gateway:
                    self._conn.connect_kwargs["sock"] = _open_socket(self._conn.host, self._conn.port,
                                                                     self._conn.connect_timeout)
                self._conn.open()
            except Exception as exc:  # noqa: BLE001 (every failure becomes one line)
                self._conn.close()
                sock = self._conn.connect_kwargs.get("sock")
                if sock is not None:
                    sock.close()  # paramiko closes it once it holds it; before that it is still ours
                raise self._unreachable(exc, time.monotonic() - started) from exc
            finally:
                self._conn.connect_kwargs.pop("sock", None)  # a reconnect opens a socket of its own
            for policy in self._policies:
                policy.commit()
            _detect_dead_peer(self._conn)
            self._closed = False
            log.debug("%s: connected as %s in %.2fs", self.where, self.user, time.monotonic() - started)

    def _unreachable(self, exc: BaseException, elapsed: float = 0.0) -> Unreachable:
        lost = self._describe_unreachable(exc, elapsed)
        lost.node = self.node
        return lost

    def _describe_unreachable(self, exc: BaseException, elapsed: float) -> Unreachable:
        """One line that names the cause: the network, the login, or the host key (Unreachable.kind)."""
        where, port, timeout = self.where, self.port, self.connect_timeout
        if isinstance(exc, paramiko.BadHostKeyException):
            return Unreachable(
                f"{where}: host key CHANGED for {host_key_name(self.host, port)} (known_hosts has "
                f"{_describe(exc.expected_key)}, the server offers {_describe(exc.key)}); refusing to connect",
                f"if the node was reinstalled, forget the old key: "
                f"{removal_command(self.known_hosts_path, self.host, port)}", kind="host_key")
        auth = _auth_failure(exc)
        if auth is not None:
            return Unreachable(f"{where}: authentication failed for user {self.user}: {auth}",
                               "set ssh.identity_file in the inventory to a key the node accepts (or load it into "
                               f"ssh-agent); test with: ssh -p {port} {self.user}@{self.host} true", kind="auth")
        if isinstance(exc, NoValidConnectionsError):
            codes = {getattr(e, "errno", None) for e in exc.errors.values()}
            if codes == {errno.ECONNREFUSED}:
                return Unreachable(f"{where}: connection refused on port {port}",
                                   "is sshd running on the node, on that port?")
            exc = next(iter(exc.errors.values()))
        if isinstance(exc, (socket.timeout, TimeoutError)):
            return Unreachable(f"{where}: no answer on port {port} within {timeout:g}s",
                               "is the node powered on and on this network?")
        if isinstance(exc, socket.gaierror):
            return Unreachable(f"{where}: cannot resolve {self.host}: {exc.strerror}")
        if isinstance(exc, ConnectionRefusedError):
            return Unreachable(f"{where}: connection refused on port {port}",
                               "is sshd running on the node, on that port?")
        if isinstance(exc, paramiko.SSHException) and "banner" in str(exc):
            cause = exc.__context__
            if isinstance(cause, (socket.timeout, TimeoutError)) or (cause is None and elapsed >= timeout * 0.9):
                return Unreachable(f"{where}: port {port} accepted the connection but sent no SSH banner within "
                                   f"{timeout:g}s", "is an SSH server listening there?")
            return Unreachable(f"port {port} on {where} accepted and closed the connection: is it an SSH server, "
                               "is the lab down?")
        if isinstance(exc, paramiko.SSHException) and "protocol version" in str(exc):
            return Unreachable(f"port {port} on {where} answers, but not as an SSH server ({exc})")
        if isinstance(exc, OSError) and exc.strerror:
            return Unreachable(f"{where}: {exc.strerror.lower()} (port {port})")
        return Unreachable(f"{where}: {str(exc) or type(exc).__name__}")

    def _session(self) -> paramiko.Channel:
        """A new channel on the node's connection. A node that does not answer at all is unreachable at once; one
        that answers slowly gets a second wait; a connection the node closed (sshd restarted) is reopened once."""
        self._check_interrupted()
        self.connect()
        try:
            return self._conn.transport.open_session(timeout=self.connect_timeout)
        except _LOST as exc:
            self._check_interrupted()
            if not self._answers():
                # a cut link, a node down: a reconnect would only wait as long again
                raise Unreachable(f"{self.where}: stopped answering ({exc})",
                                  "a link, the node's power or its network is down", node=self.node) from exc
            if self._conn.transport is not None and self._conn.transport.is_active():
                try:  # alive (its kernel answers) but slow to open a session: one more wait on this connection
                    return self._conn.transport.open_session(timeout=self.connect_timeout)
                except _LOST as again:
                    self._check_interrupted()
                    raise Unreachable(f"{self.where}: no session opened in {2 * self.connect_timeout:g}s ({again})",
                                      "the node answers on its port but sshd does not serve: is it overloaded?",
                                      node=self.node) from again
            log.debug("%s: connection lost (%s), reconnecting", self.where, exc)
        self.close()
        with self._open_lock:
            self._conn = self._make_connection()
        self.connect()
        try:
            return self._conn.transport.open_session(timeout=self.connect_timeout)
        except _LOST as exc:
            raise Unreachable(f"{self.where}: connection lost: {exc}", node=self.node) from exc

    def _answers(self) -> bool:
        """Whether the node's sshd port takes a TCP connection now (its kernel answers even when it is slow). A
        node reached through a jump host cannot be probed directly: assumed to answer (the reconnect then says)."""
        if self._conn.gateway is not None:
            return True
        try:
            with socket.create_connection((self.host, self.port), timeout=PROBE_S):
                return True
        except OSError:
            return False

    def close(self) -> None:
        with self._sftp_lock:
            self._closed = True
            self._conn.close()

    def connection_dead(self) -> bool:
        """The connection was opened and its transport ended without close(): the kernel gave up on unacknowledged
        data (the keepalive and TCP_USER_TIMEOUT, _detect_dead_peer) or the node closed it."""
        transport = self._conn.transport
        return transport is not None and not transport.is_active() and not self._closed

    def interrupt(self) -> None:
        """Ctrl-C: what runs now is cut (the connection closes under it) and nothing more starts. A command cut
        this way is done or not done on the node: every change sparkctl makes is one atomic step or guarded."""
        self._interrupted = True
        transport = self._conn.transport
        if transport is not None:
            with contextlib.suppress(Exception):
                transport.close()

    def _check_interrupted(self) -> None:
        if self._interrupted:
            raise Interrupted(self.node)

    # --- commands -----------------------------------------------------------------------------
    def _exec(self, line: str, *, timeout: float, stdin: bytes | None) -> RawResult:
        chan = self._session()
        self.round_trips += 1
        deadline = time.monotonic() + timeout + KILL_AFTER + 1
        out: list[bytes] = []
        err: list[bytes] = []
        try:
            chan.exec_command(line)
            writer = None
            if stdin:
                # A thread, so a command that answers while it reads cannot deadlock on full windows.
                writer = threading.Thread(target=_feed, args=(chan, stdin), daemon=True)
                writer.start()
            else:
                chan.shutdown_write()
            while True:
                while chan.recv_ready():
                    out.append(chan.recv(_CHUNK))
                while chan.recv_stderr_ready():
                    err.append(chan.recv_stderr(_CHUNK))
                if chan.eof_received or chan.closed:
                    break
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    chan.close()
                    return RawResult(-1, b"".join(out), b"".join(err), timed_out=True)
                select.select([chan], [], [], min(remaining, 1.0))
            while chan.recv_ready():
                out.append(chan.recv(_CHUNK))
            while chan.recv_stderr_ready():
                err.append(chan.recv_stderr(_CHUNK))
            if not chan.status_event.wait(max(deadline - time.monotonic(), 0.1)):
                chan.close()
                return RawResult(-1, b"".join(out), b"".join(err), timed_out=True)
            code = chan.recv_exit_status()
        except _LOST as exc:
            self._check_interrupted()
            raise self._lost_mid_command(exc) from exc
        finally:
            chan.close()
        if code == -1:
            self._check_interrupted()
            if not self._conn.transport or not self._conn.transport.is_active():
                raise self._lost_mid_command(self._conn.transport and self._conn.transport.get_exception())

            code = 255  # killed by a signal: sshd sent exit-signal, not exit-status
        return RawResult(code, b"".join(out), b"".join(err))

    def _lost_mid_command(self, exc: BaseException | None) -> Unreachable:
        silent = not self._answers()  # what ended the connection (EOF, a reset) does not tell a cut from a restart
        why = f" ({_what_ended(exc)})"
        what = "stopped answering" if silent else "closed the connection"
        return Unreachable(f"{self.where}: {what} while a command ran{why}",
                           "the node stopped answering (link, power, sshd); the command may or may not have "
                           "finished there: the next run checks", node=self.node, closed=not silent,
                           kind="lost")

    def _open_stream(self, line: str) -> ChannelStream:
        chan = self._session()
        try:
            chan.exec_command(line)
        except _LOST as exc:
            chan.close()
            raise Unreachable(f"{self.where}: connection lost while starting a command: {exc}", node=self.node,
                              kind="lost") from exc
        return ChannelStream(chan)

    # --- files --------------------------------------------------------------------------------
    def _sftp(self) -> paramiko.SFTPClient:
        self.connect()
        with self._open_lock:  # fabric's sftp() opens the connection itself if it is not: never beside connect()
            return self._conn.sftp()

    def _put_plain(self, path: str, data: bytes, mode: int, owner: str | None) -> None:
        directory, name = posixpath.split(path)
        tmp = posixpath.join(directory or ".", f".{name}.sparkctl-{secrets.token_hex(4)}")
        self._check_interrupted()
        try:
            with self._sftp_lock:
                sftp = self._sftp()
                # open (exclusive), fchmod before any content arrives, write, close
                self.round_trips += 4
                with sftp.open(tmp, "wbx") as handle:
                    handle.chmod(mode)
                    handle.set_pipelined(True)
                    handle.write(data)
                # A pipelined write's failure (a full disk) is only an answer paramiko reads at close and drops:
                # the file must hold every byte sent before it may take the target's name.
                self.round_trips += 1
                written = sftp.stat(tmp).st_size
                if written != len(data):
                    raise OSError(errno.EIO, f"the node kept {written} of {len(data)} bytes")
        except (OSError, paramiko.SSHException, EOFError) as exc:
            self._check_interrupted()
            created = not (isinstance(exc, OSError) and exc.errno in (errno.ENOENT, errno.EACCES, errno.EEXIST))
            if created:  # a write cut short (disk full, lost connection) must not leave its temp file behind
                self._remove_quietly(tmp)
            if not isinstance(exc, OSError):
                raise self._lost_mid_command(exc) from exc
            raise self._file_error(path, directory, exc) from exc
        try:
            if owner:
                result = self.run(f"chown {q(owner)} {q(tmp)}", timeout=30)
                if not result.ok:
                    raise RemoteFileError(f"{self.node}: cannot chown {path} to {owner}: "
                                          f"{result.stderr.strip()}")
            with self._sftp_lock:
                self.round_trips += 1
                self._sftp().posix_rename(tmp, path)
        except BaseException:
            self._remove_quietly(tmp)
            raise

    def _remove_quietly(self, tmp: str) -> None:
        if self._interrupted:
            return  # the connection is closed; the temp name (.NAME.sparkctl-XXXX) is never read as the file
        with self._sftp_lock, contextlib.suppress(OSError, paramiko.SSHException, EOFError, Unreachable):
            self.round_trips += 1
            self._sftp().remove(tmp)

    def _read_plain(self, path: str) -> str | None:
        """SFTP: no process on the node, several times faster than `cat` in a new session."""
        self._check_interrupted()
        try:
            with self._sftp_lock:
                sftp = self._sftp()
                self.round_trips += 3  # open, read, close
                with sftp.open(path, "rb") as handle:
                    data = handle.read()
        except (paramiko.SSHException, EOFError) as exc:
            self._check_interrupted()
            raise self._lost_mid_command(exc) from exc
        except OSError as exc:
            self._check_interrupted()
            if exc.errno == errno.ENOENT:
                return None
            hint = "read it with sudo=True" if exc.errno == errno.EACCES else None
            raise RemoteFileError(f"{self.node}: cannot read {path}: {exc.strerror or exc}", hint) from exc
        log.debug("%s: read %s (%d bytes)", self.where, path, len(data))
        return data.decode(errors="replace")

    def _file_error(self, path: str, directory: str, exc: OSError) -> RemoteFileError:
        if exc.errno == errno.ENOENT:
            return RemoteFileError(
                f"{self.node}: cannot write {path}: parent directory {directory} does not exist")
        if exc.errno == errno.EACCES:
            return RemoteFileError(f"{self.node}: cannot write {path}: permission denied",
                                   "write it with sudo=True")
        free = self._free_space(directory)
        if free is not None and free < FULL_BELOW:
            # SFTP says only "Failure" for a full disk (its protocol has no code for ENOSPC): ask df
            return RemoteFileError(f"{self.node}: cannot write {path}: no space left on the device "
                                   f"({free} bytes free in {directory})",
                                   f"free space on {self.node} (df -h {directory}), then run again")
        return RemoteFileError(f"{self.node}: cannot write {path}: {exc.strerror or exc}")

    def _free_space(self, directory: str) -> int | None:
        try:
            result = self.run(f"df -P -B1 {q(directory or '.')} | awk 'NR==2 {{print $4}}'", timeout=15)
        except Unreachable:
            return None
        text = result.stdout.strip()
        return int(text) if result.ok and text.isdigit() else None


#: Fewer free bytes than this in the target's file system, after a write failed: the disk is full.
FULL_BELOW = 1 << 20


def _detect_dead_peer(conn: fabric.Connection) -> None:
    """SSH keepalives and a TCP user timeout on every hop's socket: a node cut off is noticed in seconds."""
    hop: object = conn
    while isinstance(hop, fabric.Connection):
        transport = hop.transport
        if transport is not None:
            transport.set_keepalive(KEEPALIVE_S)
            sock = transport.sock
            if isinstance(sock, socket.socket):
                _set_tcp_options(sock)
            # paramiko's reader thread wakes at every timeout of its socket (0.1 s) to look at its keepalive and
            # closed flags: ~1 ms of the controller's CPU per connection per second, which a 16-node doctor,
            # connected for half a minute, paid 0.4 s of. Data wakes it at once whatever the tick; the keepalive
            # (seconds) and a close (a flag the closer does not wait on) need no finer one. A hop behind a jump
            # host reads from a channel of the hop before it: the same tick there.
            if isinstance(sock, (socket.socket, paramiko.Channel)):
                sock.settimeout(READER_TICK_S)
        hop = hop.gateway


def _open_socket(host: str, port: int, timeout: float | None) -> socket.socket:
    """The TCP connection paramiko's SSHClient.connect would open (every address of the name in turn, one that
    refuses or is unreachable passed over, NoValidConnectionsError when none is left), with TCP_NODELAY set
    before the key exchange (see _set_tcp_options)."""
    errors: dict[tuple, OSError] = {}
    infos = socket.getaddrinfo(host, port, socket.AF_UNSPEC, socket.SOCK_STREAM)
    for family, _type, _proto, _name, address in infos:
        sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            sock.settimeout(timeout)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            sock.connect(address)
            return sock
        except OSError as exc:
            sock.close()
            if exc.errno not in (errno.ECONNREFUSED, errno.EHOSTUNREACH):
                raise
            errors[address] = exc
    raise NoValidConnectionsError(errors)


def _set_tcp_options(sock: socket.socket) -> None:
    # TCP_NODELAY: every exchange here is a small request answered by a small reply; with Nagle on, each one
    # waited out the peer's delayed ACK (40 ms on Linux): measured in the lab, a command's round trip went from
    # about 45 ms to 5 ms, and the connection from about 70 ms to 30 ms.
    options = [(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1), (socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)]
    for name, value in (("TCP_USER_TIMEOUT", DEAD_AFTER_S * 1000), ("TCP_KEEPIDLE", KEEPALIVE_S),
                        ("TCP_KEEPINTVL", 2), ("TCP_KEEPCNT", 3)):
        if hasattr(socket, name):  # Linux; elsewhere the SSH keepalive alone keeps the connection honest
            options.append((socket.IPPROTO_TCP, getattr(socket, name), value))
    for level, option, value in options:
        with contextlib.suppress(OSError):
            sock.setsockopt(level, option, value)


class ChannelStream:
    """A held command's channel (transport.held)."""

    def __init__(self, chan: paramiko.Channel):
        self._chan = chan

    def recv(self, timeout: float) -> bytes | None:
        deadline = time.monotonic() + timeout
        while True:
            if self._chan.recv_ready():
                return self._chan.recv(_CHUNK)
            # stderr is not what a held command answers with, but it wakes the channel's select too (a full disk's
            # "write error" once made the lock read as "no answer"): drained, and the wait goes on
            while self._chan.recv_stderr_ready():
                self._chan.recv_stderr(_CHUNK)
            if self._chan.eof_received or self._chan.closed:
                return b"" if not self._chan.recv_ready() else self._chan.recv(_CHUNK)
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return None
            started = time.monotonic()
            select.select([self._chan], [], [], remaining)
            if not self._chan.recv_ready() and time.monotonic() - started < 0.01:
                time.sleep(min(0.05, max(0.0, deadline - time.monotonic())))

    def send(self, data: bytes) -> None:
        if self._chan.closed or not self._chan.get_transport() or not self._chan.get_transport().is_active():
            raise EOFError("channel closed")
        self._chan.sendall(data)

    def close(self) -> None:
        with contextlib.suppress(*_LOST):
            self._chan.shutdown_write()
        self._chan.close()


def _what_ended(exc: BaseException | None) -> str:
    """What the controller saw of a connection's end, in words (paramiko's EOFError has none of its own)."""
    if exc is None:
        return "it ended before the command's exit status came"
    if str(exc):
        return str(exc)
    if isinstance(exc, EOFError):
        return "the node's side closed it"
    return type(exc).__name__


def _feed(chan: paramiko.Channel, data: bytes) -> None:
    try:
        chan.sendall(data)
        chan.shutdown_write()
    except _LOST:
        pass  # the command exited or the channel was closed on timeout: its result says so


def _auth_failure(exc: BaseException) -> str | None:
    """Why the login was refused, when that is what happened (paramiko says it several ways)."""
    if isinstance(exc, paramiko.PasswordRequiredException):
        return "the private key is encrypted (load it into ssh-agent, or use a key without a passphrase)"
    if isinstance(exc, paramiko.BadAuthenticationType):
        return f"the node accepts only {', '.join(exc.allowed_types) or 'other methods'}"
    if isinstance(exc, paramiko.AuthenticationException):
        return "the node refused every key offered"
    if isinstance(exc, paramiko.SSHException) and "No authentication methods available" in str(exc):
        return "no key to offer (no ssh.identity_file, no ssh-agent, no ~/.ssh/id_* key)"
    return None


def _describe(key: paramiko.PKey) -> str:
    return f"{key.get_name()} {key.fingerprint}"
