"""Expected errors: one line and a hint, never a traceback unless asked for."""

from __future__ import annotations

from sparkctl.exitcodes import ExitStatus


class SparkctlError(Exception):
    """An expected failure with a one-line message, an optional hint (what to do), and optional detail lines
    (one per thing that failed, e.g. per host)."""

    exit_status: ExitStatus = ExitStatus.TASK_FAILED

    def __init__(self, message: str, hint: str | None = None, details: list[str] | None = None):
        super().__init__(message)
        self.message = message
        self.hint = hint
        self.details = list(details or [])

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
    """A node cannot be reached, logged in to, or stopped answering. `kind` tells the causes apart, for the fix:
    `network` (no route, timed out, refused, closed, not SSH), `auth` (the login was refused), `host_key` (the
    node's key changed), `lost` (a connection that worked went away). `node` names the node it came from, so a
    task that reached a peer never carries the peer's loss as its own."""

    exit_status = ExitStatus.UNREACHABLE
    KINDS = ("network", "auth", "host_key", "lost")

    def __init__(self, message: str, hint: str | None = None, kind: str = "network",
                 details: list[str] | None = None, *, node: str | None = None, closed: bool = False):
        super().__init__(message, hint, details)
        self.kind = kind if kind in self.KINDS else "network"
        self.node = node
        #: the connection was closed by the other end (sshd restarted, the session killed), not left silent: a
        #: read-only step may simply be tried again on a new connection
        self.closed = closed


class ClusterBusy(SparkctlError):
    """Another run holds the cluster lock: nothing was done (one line naming the holder)."""

    exit_status = ExitStatus.BUSY


class Interrupted(BaseException):
    """The person running sparkctl asked it to stop (Ctrl-C): raised by a transport instead of running or
    waiting for a command. A BaseException, like KeyboardInterrupt, so no `except Exception` in a task turns
    it into a failure."""
