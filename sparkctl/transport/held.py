"""A command left running on a node, its stdin kept open: what a lease needs (the cluster lock).

The remote side lives exactly as long as the channel: when sparkctl ends, is killed or loses the connection, the
node sees its stdin close. Lines go both ways; nothing here knows what they mean.
"""

from __future__ import annotations

import threading
import time
from typing import Protocol


class Stream(Protocol):
    """What a transport hands over: bytes out of the command, bytes into it."""

    def recv(self, timeout: float) -> bytes | None:
        """Some bytes; b"" once the command's output ended; None when nothing came within `timeout`."""

    def send(self, data: bytes) -> None:
        """Raises OSError (or the transport's own error) when the command is gone."""

    def close(self) -> None: ...


class HeldCommand:
    def __init__(self, stream: Stream, what: str):
        self._stream = stream
        self.what = what
        self._buffer = b""
        self._ended = False
        self._send_lock = threading.Lock()

    @property
    def ended(self) -> bool:
        """The command's output ended (it exited, or the connection is gone)."""
        return self._ended

    def readline(self, timeout: float) -> str | None:
        """The next line without its newline; None when the output ended or no line came within `timeout`."""
        deadline = time.monotonic() + timeout
        while b"\n" not in self._buffer:
            if self._ended:
                return None
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return None
            chunk = self._stream.recv(remaining)
            if chunk is None:
                return None
            if chunk == b"":
                self._ended = True
                continue
            self._buffer += chunk
        line, _, self._buffer = self._buffer.partition(b"\n")
        return line.decode(errors="replace")

    def send(self, line: str) -> bool:
        """One line to the command's stdin; False when it cannot be delivered (the command or channel is gone)."""
        with self._send_lock:
            try:
                self._stream.send(line.encode() + b"\n")
            except Exception:  # noqa: BLE001 - a closed channel fails in several ways; all mean "gone"
                return False
            return True

    def close(self) -> None:
        with self._send_lock:
            self._stream.close()
