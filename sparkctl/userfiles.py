"""Reading a file the user names (an inventory, a password file, a token file): a regular file only, and never more
than it can reasonably hold, so `/dev/zero`, a FIFO or a 50 MB file is refused at once instead of hanging or
filling memory. Imports nothing of sparkctl."""

from __future__ import annotations

import errno
import os
import stat


class UnreadableFile(OSError):
    """The file cannot be used; `reason` says why in words (no path: the caller names the file)."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


_KINDS = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))


def read_limited(path: str | os.PathLike, limit: int) -> bytes:
    """The whole content of a regular file of at most `limit` bytes; raises UnreadableFile."""
    try:
        # O_NONBLOCK: opening a FIFO must not wait for a writer (it is refused right after)
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        raise UnreadableFile("file not found") from None
    except IsADirectoryError:
        raise UnreadableFile("is a directory") from None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise UnreadableFile("a symbolic link loop") from None
        raise UnreadableFile(exc.strerror or type(exc).__name__) from None
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            kind = next((name for test, name in _KINDS if test(mode)), "not a regular file")
            raise UnreadableFile(f"is {kind}, not a regular file")
        data = b""
        while len(data) <= limit:
            chunk = os.read(fd, min(1 << 16, limit + 1 - len(data)))
            if not chunk:
                break
            data += chunk
        if len(data) > limit:
            raise UnreadableFile(f"is larger than {_size(limit)}")
        return data
    except OSError as exc:
        if isinstance(exc, UnreadableFile):
            raise
        raise UnreadableFile(exc.strerror or type(exc).__name__) from None
    finally:
        os.close(fd)


def file_problem(path: str | os.PathLike, limit: int) -> str | None:
    """Why a file another library will read (paramiko: a key, known_hosts) cannot be used, without opening it:
    not a regular file, or larger than `limit`. None when it is fine or does not exist (the reader says that)."""
    try:
        info = os.stat(path)
    except FileNotFoundError:
        return None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            return "a symbolic link loop"
        return exc.strerror or type(exc).__name__
    if not stat.S_ISREG(info.st_mode):
        kind = next((name for test, name in _KINDS if test(info.st_mode)), "not a regular file")
        return f"is {kind}, not a regular file"
    if info.st_size > limit:
        return f"is larger than {_size(limit)}"
    return None


def _size(count: int) -> str:
    return f"{count // (1 << 20)} MiB" if count >= 1 << 20 else f"{count // 1024} KiB" if count >= 1024 else \
        f"{count} bytes"


def controller_state_dir() -> str:
    """`$XDG_STATE_HOME/sparkctl` (default `~/.local/state/sparkctl`): what sparkctl keeps on this machine (run
    journals, proofs, bench records, API keys)."""
    state = os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
    return os.path.join(state, "sparkctl")


def controller_cache_dir() -> str:
    """`$XDG_CACHE_HOME/sparkctl` (default `~/.cache/sparkctl`): what sparkctl can make again (compiled templates)."""
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(cache, "sparkctl")
