"""A real OpenSSH server on 127.0.0.1 for tests: own host key, own authorized_keys, stopped on teardown."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

SSHD = "/usr/sbin/sshd"
SSH_KEYGEN = shutil.which("ssh-keygen") or "/usr/bin/ssh-keygen"


def sshd_available() -> bool:
    return os.path.exists(SSHD) and os.path.exists(SSH_KEYGEN)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def make_key(path: Path, kind: str = "ed25519") -> Path:
    """A passphrase-less key pair at `path` / `path`.pub."""
    if path.exists():
        path.unlink()
    subprocess.run([SSH_KEYGEN, "-q", "-t", kind, "-N", "", "-C", "sparkctl-test", "-f", str(path)],
                   check=True, capture_output=True)
    return path


class SshdServer:
    """`/usr/sbin/sshd -D -e -f <config>` listening on 127.0.0.1:`port`.

    `client_key` is authorized for every user (one AuthorizedKeysFile for all); `new_host_key()` swaps the
    host key (restart to take effect) to simulate a reinstalled node or a man in the middle.
    """

    def __init__(self, workdir: Path | None = None, port: int | None = None):
        # sshd reads AuthorizedKeysFile as the logging-in user: by default a world-traversable dir of its
        # own, removed by `cleanup()`, so non-root test users can log in too.
        self._own_dir = workdir is None
        if workdir is None:
            workdir = Path(tempfile.mkdtemp(prefix="sparkctl-sshd-"))
            workdir.chmod(0o755)
        self.workdir = Path(workdir).absolute()
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.port = port or free_port()
        self.host_key = self.workdir / "ssh_host_ed25519_key"
        self.client_key = self.workdir / "client_key"
        self.authorized_keys = self.workdir / "authorized_keys"
        self.config = self.workdir / "sshd_config"
        self.log = self.workdir / "sshd.log"
        self.proc: subprocess.Popen[bytes] | None = None
        make_key(self.host_key)
        make_key(self.client_key)
        self.authorized_keys.write_text(Path(f"{self.client_key}.pub").read_text())
        self.config.write_text(
            f"Port {self.port}\n"
            "ListenAddress 127.0.0.1\n"
            f"HostKey {self.host_key}\n"
            f"AuthorizedKeysFile {self.authorized_keys}\n"
            f"PidFile {self.workdir / 'sshd.pid'}\n"
            "UsePAM no\n"
            "StrictModes no\n"
            "PermitRootLogin yes\n"
            "PubkeyAuthentication yes\n"
            "PasswordAuthentication no\n"
            "KbdInteractiveAuthentication no\n"
            "MaxSessions 50\n"
            "MaxStartups 50\n"
            "Subsystem sftp internal-sftp\n"
            "LogLevel VERBOSE\n"
        )

    def host_public_key(self) -> str:
        """`<type> <base64>` of the current host key."""
        return " ".join(Path(f"{self.host_key}.pub").read_text().split()[:2])

    def new_host_key(self) -> None:
        make_key(self.host_key)

    def start(self, timeout: float = 10.0) -> SshdServer:
        os.makedirs("/run/sshd", mode=0o755, exist_ok=True)  # privilege separation directory
        log = open(self.log, "ab")  # noqa: SIM115 (lives as long as the server)
        self.proc = subprocess.Popen([SSHD, "-D", "-e", "-f", str(self.config)], stdout=log, stderr=log,
                                     stdin=subprocess.DEVNULL)
        log.close()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"sshd exited with {self.proc.returncode}: {self.log.read_text()[-2000:]}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
                    return self
            except OSError:
                time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"sshd did not listen on 127.0.0.1:{self.port} within {timeout}s")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        self.proc = None

    def restart(self) -> None:
        self.stop()
        self.start()

    def __enter__(self) -> SshdServer:
        return self.start()

    def cleanup(self) -> None:
        self.stop()
        if self._own_dir:
            shutil.rmtree(self.workdir, ignore_errors=True)

    def __exit__(self, *exc: object) -> None:
        self.cleanup()
