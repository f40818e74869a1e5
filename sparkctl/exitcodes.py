"""The one list of exit codes (docs/architecture.md; the README lists them for users)."""

from enum import IntEnum


class ExitStatus(IntEnum):
    SUCCESS = 0
    TASK_FAILED = 1
    BAD_INPUT = 2
    UNREACHABLE = 3
    CHANGES_PENDING = 4
    #: another run holds the cluster's lock: nothing was done, try again when it ends
    BUSY = 5
    #: stopped by Ctrl-C (128 + SIGINT, what a shell reports for a process SIGINT ended)
    INTERRUPTED = 130
    #: the reader of stdout went away (`sparkctl ... | head -1`): 128 + SIGPIPE, what a shell reports for it
    BROKEN_PIPE = 141
