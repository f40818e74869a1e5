"""The transport contract: how a command, a file or a container exec reaches a node."""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from sparkctl.transport.held import HeldCommand


@dataclass(frozen=True)
class CommandResult:
    command: str
    exit_code: int
    stdout: str
    stderr: str
    duration: float = 0.0
    timed_out: bool = False

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and not self.timed_out


class Transport(Protocol):
    """One node, one connection, reused for the whole run.

    Every command has a timeout; the remote stdin is closed unless `input` is given (secrets travel
    that way or as 0600 files, never in argv); exit codes are returned, not raised.
    """

    node: str
    round_trips: int

    def run(self, cmd: str, *, sudo: bool = False, timeout: float = 60.0,
            input: str | None = None) -> CommandResult: ...

    def put(self, path: str, content: str | bytes, *, mode: int = 0o644, owner: str | None = None,
            sudo: bool = False) -> None: ...

    def read(self, path: str, *, sudo: bool = False) -> str | None: ...

    def exec_in(self, container: str, cmd: str, *, timeout: float = 60.0, input: str | None = None,
                env: dict[str, str] | None = None) -> CommandResult: ...

    def hold(self, script: str, *args: str, what: str = "held command") -> HeldCommand:
        """Start a bash script left running, its stdin open, until closed (transport.held)."""
        ...

    def close(self) -> None: ...

    def connection_dead(self) -> bool:
        """Whether the open connection to the node died under the run (its keepalives went unanswered). False
        when it lives, was never opened, or was closed on purpose."""

    def interrupt(self) -> None:
        """Ctrl-C: cut what runs now; every later call raises errors.Interrupted."""


def q(value: object) -> str:
    """Quote one value for a POSIX shell line."""
    return shlex.quote(str(value))


def text_of(word: str, final_newline: bool = False) -> str:
    """bash that prints the text file `word` (a shell word: quoted, or a "$HOME"/... path) as the shell itself reads
    it: `cat` would be a process of its own, and the processes a rerun starts on a node are most of what it costs
    there. Fails, printing nothing, when `word` is no readable file. `final_newline`: ends a last line that has
    none with one, as `awk 1` does. `read` stops at a NUL, and then says so: such a file is printed by `cat`
    (`awk 1`) after all."""
    ending = "; case $_c in ''|*$'\\n') ;; *) echo ;; esac" if final_newline else ""
    whole = f"awk 1 {word}" if final_newline else f"cat -- {word}"
    return (f"{{ [ -f {word} ] && [ -r {word} ] && {{ _c=; if IFS= read -r -d '' _c <{word}; then {whole}; "
            f"else printf '%s' \"$_c\"{ending}; fi; }}; }}")
