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
    exit_status = ExitStatus.UNREACHABLE


class ClusterBusy(SparkctlError):
    """Another run holds the cluster lock: nothing was done (one line naming the holder)."""

    exit_status = ExitStatus.BUSY
