"""Secrets (HF token, sudo password) never reach a log, an event or a journal: redact them on the way out."""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable

MASK = "********"

_known: set[str] = set()
_lock = threading.Lock()


def redact(text: str, secrets: Iterable[str]) -> str:
    """Replace every occurrence of each secret in `text` with a mask."""
    # Longest first, so a secret that contains another is masked whole.
    for secret in sorted({s for s in secrets if s}, key=len, reverse=True):
        text = text.replace(secret, MASK)
    return text


def register_secret(value: str | None) -> None:
    """Remember a secret for the whole process: every later `redact_known` masks it."""
    if value:
        with _lock:
            _known.add(value)
            # A trailing newline often follows a secret read from a file: mask the bare value too.
            stripped = value.strip()
            if stripped:
                _known.add(stripped)


def redact_known(text: str) -> str:
    with _lock:
        known = tuple(_known)
    return redact(text, known) if known else text


def forget_secrets() -> None:
    """For tests: drop every registered secret."""
    with _lock:
        _known.clear()


class RedactingFilter(logging.Filter):
    """A logging filter that masks every registered secret in the formatted message."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        redacted = redact_known(message)
        if redacted != message:
            record.msg, record.args = redacted, None
        return True
