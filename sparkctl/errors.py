"""Expected errors: one line and a hint, never a traceback unless asked for."""

from __future__ import annotations

from sparkctl.exitcodes import ExitStatus


class SparkctlError(Exception):
    """An expected failure with a one-line message and an optional hint (what to do)."""

    exit_status: ExitStatus = ExitStatus.TASK_FAILED

    def __init__(self, message: str, hint: str | None = None):
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        return self.message if not self.hint else f"{self.message} ({self.hint})"


class BadInput(SparkctlError):
    """Usage or inventory problem: exit 2, nothing changed."""

    exit_status = ExitStatus.BAD_INPUT


class InventoryError(BadInput):
    """Every problem found in an inventory, each already formatted as `file:line: field: what (fix)`."""

    def __init__(self, problems: list[str]):
        self.problems = problems
        super().__init__("\n".join(problems))

    def __str__(self) -> str:
        return self.message


class Unreachable(SparkctlError):
    """A node cannot be reached (or stopped answering). `node` names the node it came from, so a task that
    reached a peer never carries the peer's loss as its own."""

    exit_status = ExitStatus.UNREACHABLE

    def __init__(self, message: str, hint: str | None = None, *, node: str | None = None, closed: bool = False):
        super().__init__(message, hint)
        self.node = node
        #: the connection was closed by the other end (sshd restarted, the session killed), not left silent: a
        #: read-only step may simply be tried again on a new connection
        self.closed = closed


class Interrupted(BaseException):
    """The person running sparkctl asked it to stop (Ctrl-C): raised by a transport instead of running or
    waiting for a command. A BaseException, like KeyboardInterrupt, so no `except Exception` in a task turns
    it into a failure."""
