"""The shipped templates compiled once, kept in the controller's cache dir (Jinja's bytecode cache)."""

from __future__ import annotations

import contextlib
import hashlib
import os
import stat
import sys

import jinja2

from sparkctl.userfiles import controller_cache_dir


class CompiledTemplates(jinja2.FileSystemBytecodeCache):
    """Jinja's cache of compiled templates (its bytecode cache: a template's code, kept with its text's checksum, is
    compiled again when the text changes), in the controller's cache dir. A no-op compiled about fifteen templates
    in 70-80 ms of every run. Kept apart per Jinja release, Python release and syntax settings, which the code
    also depends on. A cache that cannot be read or written is no cache: the template is compiled."""

    def load_bytecode(self, bucket: jinja2.bccache.Bucket) -> None:
        try:
            super().load_bytecode(bucket)
        except Exception:  # noqa: BLE001 - a damaged entry (Jinja unpickles the checksum): compiled again
            bucket.reset()

    def dump_bytecode(self, bucket: jinja2.bccache.Bucket) -> None:
        with contextlib.suppress(OSError):
            super().dump_bytecode(bucket)


def compiled_templates(env: jinja2.Environment) -> CompiledTemplates | None:
    """The cache for the templates of `env`, as it reads them (its syntax settings, and the text it keeps)."""
    syntax = (env.block_start_string, env.block_end_string, env.variable_start_string, env.variable_end_string,
              env.comment_start_string, env.comment_end_string, env.line_statement_prefix, env.line_comment_prefix,
              env.trim_blocks, env.lstrip_blocks, env.newline_sequence, env.keep_trailing_newline, env.autoescape,
              env.optimized)
    key = hashlib.sha256(repr((jinja2.__version__, sys.version, syntax)).encode()).hexdigest()
    parent = controller_cache_dir()
    directory = os.path.join(parent, f"templates-{key[:16]}")
    try:
        os.makedirs(directory, mode=0o700, exist_ok=True)
    except OSError:
        return None
    return CompiledTemplates(directory) if _own(parent) and _own(directory) else None


def _own(path: str) -> bool:
    """A folder of this user's that no one else may write: what is loaded from it is run as code (and Jinja
    unpickles each entry's checksum), as Jinja's own default cache dir is checked."""
    try:
        info = os.lstat(path)
    except OSError:
        return False
    return stat.S_ISDIR(info.st_mode) and info.st_uid == os.geteuid() and not info.st_mode & 0o022
