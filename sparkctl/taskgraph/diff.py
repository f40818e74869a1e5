"""The unified diff a Change carries: what a file is now against what it will be, secrets masked."""

from __future__ import annotations

import difflib

from sparkctl.secrets import mask_config_lines


def unified_diff(path: str, before: str | None, after: str | None) -> str:
    """`diff -u` of two versions of a file (None: absent), every secret-keyed line masked (a netplan file may
    hold Wi-Fi keys, and a diff reaches the console, JSON lines and the journal)."""
    before, after = mask_config_lines(before), mask_config_lines(after)
    return "".join(difflib.unified_diff(
        (before or "").splitlines(keepends=True), (after or "").splitlines(keepends=True),
        fromfile=f"{path} (now)" if before is not None else "/dev/null",
        tofile=f"{path} (planned)" if after is not None else "/dev/null",
    ))
