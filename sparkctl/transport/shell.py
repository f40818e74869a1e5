"""What SSH and local transports share: command lines, sudo, timeouts, atomic writes, container exec.

A concrete transport only supplies `_exec(line, timeout, stdin)`: run one shell line on the node (one
round trip) and `_put_plain` (an atomic write without sudo). Everything else is built here, so both
transports quote, time out and become root the same way.
"""

from __future__ import annotations

import logging
import posixpath
import re
import threading
import time
from dataclasses import dataclass

from sparkctl.errors import SparkctlError
from sparkctl.secrets import redact_known
from sparkctl.transport.base import CommandResult, q
from sparkctl.transport.held import HeldCommand, Stream
from sparkctl.transport.sudo import (
    PROBE_SCRIPT,
    VERIFY_PASSWORD_SCRIPT,
    SudoMode,
    parse_probe,
    refusal_message,
    sudo_prefix,
    sudo_stdin,
)

log = logging.getLogger(__name__)
#: what each command printed (stdout, then stderr): -vv and --debug show it
output_log = logging.getLogger(f"{__name__}.output")
#: -v shows a command by the first characters of its first line (the record's `brief`)
BRIEF_CHARS = 200

#: Commands never depend on the login environment of the node.
SAFE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
TIMED_OUT_EXIT = 124
#: After `timeout` sends TERM, how long before KILL; the client waits this much longer than the timeout.
KILL_AFTER = 5
#: Exit code of the read script when the file does not exist (cat never exits with it).
MISSING_EXIT = 100
SUDO_FAILED_EXIT = 1
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


class RemoteFileError(SparkctlError):
    """A put or read failed on the node (missing parent directory, permission, ...)."""


@dataclass
class RawResult:
    exit_code: int
    stdout: bytes
    stderr: bytes
    timed_out: bool = False


def command_line(cmd: str, timeout: float, prefix: str = "") -> str:
    """The line sent to the node: predictable PATH and locale, non-interactive bash, enforced timeout."""
    return (f"{prefix}env PATH={SAFE_PATH} LC_ALL=C "
            f"timeout -k {KILL_AFTER} {timeout:g} bash -c {q(cmd)}")


def temp_name_template(path: str) -> tuple[str, str]:
    """(directory, mktemp template) for the temp file that is renamed onto `path`."""
    directory, name = posixpath.split(path)
    return directory or ".", f".{name}.sparkctl-XXXXXX"


class ShellTransport:
    """Base for transports that can run a shell line on a node. Not for direct use."""

    node: str
    user: str
    become_password: str | None
    round_trips: int
    #: The container CLI exec_in calls (podman-docker answers to `docker` as well).
    container_cli: str = "docker"

    def __init__(self) -> None:
        self.round_trips = 0
        self._sudo_mode: SudoMode | None = None
        self._sudo_lock = threading.Lock()

    # --- to implement -------------------------------------------------------------------------
    def _exec(self, line: str, *, timeout: float, stdin: bytes | None) -> RawResult:
        raise NotImplementedError

    def _put_plain(self, path: str, data: bytes, mode: int, owner: str | None) -> None:
        raise NotImplementedError

    def _open_stream(self, line: str) -> Stream:
        raise NotImplementedError

    def close(self) -> None:
        pass

    def hold(self, script: str, *args: str, what: str = "held command") -> HeldCommand:
        """Start `script` (bash, `$1`... = args) and leave it running with its stdin open: no timeout of its
        own, it ends when its stdin closes (sparkctl ends, is killed, or loses the connection)."""
        line = f"env PATH={SAFE_PATH} LC_ALL=C bash -c {q(script)} sparkctl " + " ".join(q(a) for a in args)
        self.round_trips += 1
        return HeldCommand(self._open_stream(line), what)

    def connection_dead(self) -> bool:
        return False

    def interrupt(self) -> None:
        """Ctrl-C: cut what runs now, start nothing more (each later call raises errors.Interrupted)."""

    # --- the contract -------------------------------------------------------------------------
    def run(self, cmd: str, *, sudo: bool = False, timeout: float = 60.0,
            input: str | None = None) -> CommandResult:
        data = input.encode() if input is not None else None
        return self._run(cmd, sudo=sudo, timeout=timeout, data=data)

    def put(self, path: str, content: str | bytes, *, mode: int = 0o644, owner: str | None = None,
            sudo: bool = False) -> None:
        data = content.encode() if isinstance(content, str) else content
        if not sudo:
            self._put_plain(path, data, mode, owner)
            return
        directory, template = temp_name_template(path)
        chown = f'chown {q(owner)} "$tmp"; ' if owner else ""
        # The content streams on stdin: it never appears in argv, and the temp file is created 0600
        # by mktemp and chmod'ed before the content arrives.
        script = (
            f"set -e; [ -d {q(directory)} ] || {{ echo {q('parent directory ' + directory + ' does not exist')} >&2;"
            f" exit 3; }}; tmp=$(mktemp -p {q(directory)} {q(template)}); trap 'rm -f \"$tmp\"' EXIT; "
            f'chmod {mode:o} "$tmp"; cat > "$tmp"; {chown}mv -f "$tmp" {q(path)}; trap - EXIT'
        )
        result = self._run(script, sudo=True, timeout=120.0, data=data, shown=f"put {path}")
        if not result.ok:
            why = _first_line(result)
            hint = (f"free space on {self.node} (df -h {directory}), then run again"
                    if "No space left" in why else None)
            raise RemoteFileError(f"{self.node}: cannot write {path}: {why}", hint)

    def read(self, path: str, *, sudo: bool = False) -> str | None:
        return self._read_plain(path) if not sudo else self._read_with_cat(path, sudo=True)

    def _read_plain(self, path: str) -> str | None:
        return self._read_with_cat(path, sudo=False)

    def _read_with_cat(self, path: str, *, sudo: bool) -> str | None:
        script = f"[ -e {q(path)} ] || exit {MISSING_EXIT}; exec cat -- {q(path)}"
        result = self._run(script, sudo=sudo, timeout=60.0, data=None, shown=f"read {path}")
        if result.exit_code == MISSING_EXIT:
            return None
        if not result.ok:
            hint = None if sudo else "read it with sudo=True if it is root-only"
            raise RemoteFileError(f"{self.node}: cannot read {path}: {_first_line(result)}", hint)
        return result.stdout

    def exec_in(self, container: str, cmd: str, *, timeout: float = 60.0, input: str | None = None,
                env: dict[str, str] | None = None) -> CommandResult:
        """`docker exec [-i] [-e NAME ...] <container> sh -c <cmd>` with env values kept out of argv.

        The values travel on stdin, NUL-terminated, ahead of `input`: a bash wrapper reads them into
        its own environment (`read -d ''` reads byte by byte, leaving the rest of stdin to docker) and
        execs `docker exec -e NAME`, which copies NAME's value from the docker client's environment.
        Nothing is written to disk and `ps` only ever shows the names.
        """
        env = env or {}
        for name, value in env.items():
            if not _ENV_NAME.match(name):
                raise ValueError(f"not an environment variable name: {name!r}")
            if "\0" in value:
                raise ValueError(f"environment value for {name} contains a NUL byte")
        names = sorted(env)
        # Resolve the CLI before reading the values: one of them may be PATH.
        parts = [f"cli=$(command -v {q(self.container_cli)}) || exit 127"]
        parts += [f"IFS= read -r -d '' {name} && export {name}" for name in names]
        argv = ['"$cli" exec']
        if input is not None:
            argv.append("-i")
        argv += [f"-e {name}" for name in names]
        argv += [q(container), "sh -c", q(cmd)]
        parts.append("exec " + " ".join(argv))
        stdin = b"".join(env[name].encode() + b"\0" for name in names)
        if input is not None:
            stdin += input.encode()
        return self._run("; ".join(parts), sudo=False, timeout=timeout, data=stdin or None,
                         shown=f"exec_in {container}: {cmd}", result_command=cmd)

    # --- sudo ---------------------------------------------------------------------------------
    def sudo_mode(self) -> SudoMode:
        """What sudo allows on this node, probed once (one round trip, two with a password)."""
        with self._sudo_lock:
            if self._sudo_mode is None:
                probe = self._exec(command_line(PROBE_SCRIPT, 30), timeout=30, stdin=None)
                mode = parse_probe(probe.stdout.decode(errors="replace"))
                if mode is SudoMode.NONE and self.become_password is not None:
                    verify = self._exec(VERIFY_PASSWORD_SCRIPT, timeout=30,
                                        stdin=self.become_password.encode() + b"\n")
                    mode = SudoMode.PASSWORD if verify.exit_code == 0 else SudoMode.WRONG_PASSWORD
                log.debug("%s: sudo mode %s", self.node, mode.value)
                self._sudo_mode = mode
            return self._sudo_mode

    def _run(self, cmd: str, *, sudo: bool, timeout: float, data: bytes | None,
             shown: str | None = None, result_command: str | None = None) -> CommandResult:
        shown = redact_known(shown if shown is not None else cmd)
        started = time.monotonic()
        prefix = ""
        if sudo:
            mode = self.sudo_mode()
            if not mode.usable:
                message = refusal_message(mode, self.node, self.user)
                log.debug("%s: refused (sudo %s): %s", self.node, mode.value, shown)
                return CommandResult(result_command or cmd, SUDO_FAILED_EXIT, "", message)
            prefix = sudo_prefix(mode)
            data = sudo_stdin(mode, self.become_password, data)
        raw = self._exec(command_line(cmd, timeout, prefix), timeout=timeout, stdin=data)
        duration = time.monotonic() - started
        timed_out = raw.timed_out or (raw.exit_code in (TIMED_OUT_EXIT, 137) and duration >= timeout)
        exit_code = TIMED_OUT_EXIT if raw.timed_out else raw.exit_code
        ended = f"-> {exit_code}{' timed out' if timed_out else ''} ({duration:.2f}s)"
        first = shown.splitlines()[0] if shown else ""
        brief = f"{self.node}: {'sudo ' if sudo else ''}{first[:BRIEF_CHARS]}{' ...' if first != shown else ''} {ended}"
        log.debug("%s: %s%s %s", self.node, "sudo " if sudo else "", shown, ended, extra={"brief": brief})
        stderr = raw.stderr.decode(errors="replace")
        if output_log.isEnabledFor(logging.DEBUG) and (raw.stdout or stderr):
            text = (raw.stdout.decode(errors="replace") + stderr).rstrip("\n")
            output_log.debug("%s", "\n".join(f"{self.node}: | {line}" for line in text.splitlines()))
        if timed_out:
            separator = "" if not stderr or stderr.endswith("\n") else "\n"
            stderr += f"{separator}timed out after {timeout:g}s"
        return CommandResult(
            command=result_command or cmd,
            exit_code=exit_code,
            stdout=raw.stdout.decode(errors="replace"),
            stderr=stderr,
            duration=duration,
            timed_out=timed_out,
        )


def _first_line(result: CommandResult) -> str:
    text = (result.stderr or result.stdout).strip()
    return text.splitlines()[-1] if text else f"exit code {result.exit_code}"
