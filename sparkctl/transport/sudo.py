"""How sparkctl becomes root on a node: detect what sudo allows once, then wrap commands accordingly.

The password (if any) always travels on stdin (`sudo -S -p ''`), never in argv or the environment.
`-S` is only used when the probe showed sudo really asks for a password (and the password was verified
once, alone on stdin): with a NOPASSWD rule sudo would not read stdin and the password would flow into
the command instead.
"""

from __future__ import annotations

from enum import Enum
from typing import Protocol


class SudoMode(str, Enum):
    ROOT = "root"  # already root: no sudo needed (sudo may not even be installed)
    NOPASSWD = "nopasswd"  # `sudo -n` works
    PASSWORD = "password"  # sudo needs a password and the one we were given works
    NONE = "none"  # sudo needs a password and none was given
    WRONG_PASSWORD = "wrong-password"  # sudo needs a password and the one given was refused
    MISSING = "missing"  # not root and no sudo on the node

    @property
    def usable(self) -> bool:
        return self in (SudoMode.ROOT, SudoMode.NOPASSWD, SudoMode.PASSWORD)


class _ProbesSudo(Protocol):
    def sudo_mode(self) -> SudoMode: ...


def sudo_mode(transport: _ProbesSudo) -> SudoMode:
    """What sudo allows on the transport's node (probed once per transport, then cached)."""
    return transport.sudo_mode()


#: One round trip: who are we, and does sudo work without a password?
PROBE_SCRIPT = (
    'if [ "$(id -u)" = 0 ]; then echo root; '
    "elif ! command -v sudo >/dev/null 2>&1; then echo missing; "
    "elif sudo -n true >/dev/null 2>&1; then echo nopasswd; "
    "else echo password; fi"
)

#: Run with the password alone on stdin; `-k` ignores cached credentials so sudo really reads it.
VERIFY_PASSWORD_SCRIPT = "sudo -k -S -p '' true"


def parse_probe(output: str) -> SudoMode:
    word = output.strip().splitlines()[-1] if output.strip() else ""
    return {
        "root": SudoMode.ROOT,
        "missing": SudoMode.MISSING,
        "nopasswd": SudoMode.NOPASSWD,
    }.get(word, SudoMode.NONE)


def sudo_prefix(mode: SudoMode) -> str:
    """What goes in front of a command line to run it as root in this mode."""
    if mode is SudoMode.ROOT:
        return ""
    if mode is SudoMode.NOPASSWD:
        return "sudo -n -- "
    if mode is SudoMode.PASSWORD:
        return "sudo -k -S -p '' -- "
    raise ValueError(f"sudo is not usable in mode {mode.value}")


def sudo_stdin(mode: SudoMode, password: str | None, data: bytes | None) -> bytes | None:
    """The stdin for a sudo'ed command: the password line first (password mode only), then the data."""
    if mode is SudoMode.PASSWORD and password is not None:
        return password.encode() + b"\n" + (data or b"")
    return data


def refusal_message(mode: SudoMode, node: str, user: str) -> str:
    """The stderr-like line for a sudo that cannot work, with what to do about it."""
    if mode is SudoMode.NONE:
        return (f"sudo: a password is required on {node} "
                f"(run with --ask-become-pass, or allow passwordless sudo for {user})")
    if mode is SudoMode.WRONG_PASSWORD:
        return f"sudo: the become password was refused on {node} for {user} (check --ask-become-pass)"
    if mode is SudoMode.MISSING:
        return f"sudo: not installed on {node} and {user} is not root (install sudo or connect as root)"
    return f"sudo: not usable on {node} ({mode.value})"
