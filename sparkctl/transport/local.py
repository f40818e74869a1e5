"""The transport for `local: true` nodes: the same contract through subprocess on this machine."""

from __future__ import annotations

import contextlib
import getpass
import logging
import os
import select
import shutil
import signal
import subprocess
import tempfile
import threading

from sparkctl.errors import Interrupted
from sparkctl.secrets import register_secret
from sparkctl.transport.shell import KILL_AFTER, RawResult, RemoteFileError, ShellTransport

log = logging.getLogger(__name__)


class LocalTransport(ShellTransport):
    """Runs on this machine. The command string only ever reaches `bash -c` as one argument."""

    def __init__(self, node: str, *, become_password: str | None = None):
        super().__init__()
        self.node = node
        self.user = getpass.getuser()
        self.become_password = become_password
        register_secret(become_password)
        self._interrupted = False
        self._running: set[subprocess.Popen] = set()
        self._running_lock = threading.Lock()

    def connect(self) -> None:
        """Nothing to open; here so every transport can be connected the same way."""

    def interrupt(self) -> None:
        """Ctrl-C: the commands running now are stopped (their process groups get SIGTERM), nothing more starts."""
        self._interrupted = True
        with self._running_lock:
            running = list(self._running)
        for proc in running:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGTERM)

    def _exec(self, line: str, *, timeout: float, stdin: bytes | None) -> RawResult:
        if self._interrupted:
            raise Interrupted(self.node)
        self.round_trips += 1
        # A session of its own, so a timeout kills the whole process group, not just the shell.
        proc = subprocess.Popen(
            ["/bin/sh", "-c", line],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            start_new_session=True,
        )
        with self._running_lock:
            self._running.add(proc)
        try:
            out, err = proc.communicate(input=stdin or b"", timeout=timeout + KILL_AFTER + 1)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            out, err = proc.communicate()
            return RawResult(proc.returncode, out, err, timed_out=True)
        finally:
            with self._running_lock:
                self._running.discard(proc)
        if self._interrupted:
            raise Interrupted(self.node)
        return RawResult(proc.returncode, out, err)

    def _open_stream(self, line: str) -> ProcessStream:
        proc = subprocess.Popen(["/bin/sh", "-c", line], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=subprocess.DEVNULL, start_new_session=True)
        return ProcessStream(proc)

    def _put_plain(self, path: str, data: bytes, mode: int, owner: str | None) -> None:
        directory, name = os.path.split(os.path.abspath(path))
        if not os.path.isdir(directory):
            raise RemoteFileError(
                f"{self.node}: cannot write {path}: parent directory {directory} does not exist")
        try:
            fd, tmp = tempfile.mkstemp(prefix=f".{name}.sparkctl-", dir=directory)
        except OSError as exc:
            raise RemoteFileError(f"{self.node}: cannot write {path}: {exc.strerror}") from exc
        self.round_trips += 1
        try:
            with os.fdopen(fd, "wb") as handle:
                os.fchmod(handle.fileno(), mode)
                handle.write(data)
            if owner:
                _chown(tmp, owner)
            os.replace(tmp, path)
        except (OSError, LookupError) as exc:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise RemoteFileError(f"{self.node}: cannot write {path}: {exc}") from exc

    def _read_plain(self, path: str) -> str | None:
        try:
            with open(path, "rb") as handle:
                return handle.read().decode(errors="replace")
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise RemoteFileError(f"{self.node}: cannot read {path}: {exc.strerror}",
                                  "read it with sudo=True" if isinstance(exc, PermissionError) else None) from exc


def _chown(path: str, owner: str) -> None:
    """chown to "user", "user:group" or ":group" (chown(1)'s spelling)."""
    user, _, group = owner.partition(":")
    if user and group:
        shutil.chown(path, user=user, group=group)
    elif user:
        shutil.chown(path, user=user)
    elif group:
        shutil.chown(path, group=group)


class ProcessStream:
    """A held command run on this machine (transport.held)."""

    def __init__(self, proc: subprocess.Popen):
        self._proc = proc

    def recv(self, timeout: float) -> bytes | None:
        assert self._proc.stdout is not None
        ready, _, _ = select.select([self._proc.stdout], [], [], max(0.0, timeout))
        if not ready:
            return None
        return os.read(self._proc.stdout.fileno(), 65536)

    def send(self, data: bytes) -> None:
        assert self._proc.stdin is not None
        self._proc.stdin.write(data)
        self._proc.stdin.flush()

    def close(self) -> None:
        with contextlib.suppress(OSError):
            if self._proc.stdin is not None:
                self._proc.stdin.close()
        try:
            self._proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self._proc.pid, signal.SIGKILL)
            self._proc.wait()
        if self._proc.stdout is not None:
            self._proc.stdout.close()
