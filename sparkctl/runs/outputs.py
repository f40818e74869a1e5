"""Files a command writes for the user (a support bundle, bench results, playbooks.md): refused up front."""

from __future__ import annotations

import os
from pathlib import Path

from sparkctl.errors import BadInput


def unwritable_reason(path: str | Path) -> str | None:
    """Why a file cannot be written at `path`, or None."""
    target = Path(path).absolute()
    if target.is_dir():
        return "is a directory"
    if target.exists():
        return None if os.access(target, os.W_OK) else "permission denied"
    parent = target.parent
    if not parent.exists():
        # Creating folders the user did not ask for hides a typo in the path.
        return f"the folder {parent} does not exist (create it first, or write elsewhere)"
    if not parent.is_dir():
        return f"{parent} is not a directory"
    if not os.access(parent, os.W_OK | os.X_OK):
        return f"cannot create files in {parent}: permission denied"
    return None


def check_writable(path: str | Path, option: str) -> None:
    """Refuse an output path that cannot be written, BEFORE the work that produces it (exit 2, one line)."""
    reason = unwritable_reason(path)
    if reason:
        raise BadInput(f"{option} {path}: {reason}")
