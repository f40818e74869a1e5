"""The endpoint's API key, on the controller: the variable serve.api_key_env names (or the file <NAME>_FILE
names), else the key sparkctl made for the cluster at its first serving run, kept 0600 in
`$XDG_STATE_HOME/sparkctl/keys/<cluster>.key`. Every key read or made is registered as a secret (one redaction
for every printed or written surface); it reaches the head only as the gateway's 0600 config, never in argv."""

from __future__ import annotations

import os
import secrets
import tempfile
from pathlib import Path

from sparkctl.inventory import Inventory
from sparkctl.plan.render import BEARER_RE
from sparkctl.secrets import SecretUnreadable, register_secret, secret_from_env
from sparkctl.taskgraph.task import TaskFailed
from sparkctl.userfiles import UnreadableFile, controller_state_dir, read_limited

#: 32 random bytes (256 bits), as URL-safe base64: 43 characters a header and a config string carry unquoted
KEY_BYTES = 32
KEY_RE = BEARER_RE


def key_path(cluster: str) -> Path:
    return Path(controller_state_dir()) / "keys" / f"{cluster}.key"


def key_source(inventory: Inventory) -> str | None:
    """Where a key given from outside comes from, in words (never the key); None: the key sparkctl keeps."""
    name = inventory.serve.api_key_env
    if os.environ.get(name, "").strip():
        return f"${name}"
    if os.environ.get(f"{name}_FILE"):
        return f"the file ${name}_FILE names"
    return None


def api_key(inventory: Inventory, create: bool = False) -> str | None:
    """The cluster's key (None with serve.auth: none, or when there is none yet and `create` is False)."""
    if inventory.serve.auth == "none":
        return None
    name = inventory.serve.api_key_env
    try:
        given = secret_from_env(name)
    except SecretUnreadable as exc:
        raise TaskFailed(str(exc)) from exc
    if given is not None:
        if not KEY_RE.match(given):
            raise TaskFailed(f"the API key in ${name} is not a bearer token: 16 to 512 of A-Z a-z 0-9 . _ ~ + / -",
                             hint=f"unset {name} to let sparkctl make one, or put such a key there")
        return given
    stored = _read_stored(inventory.cluster.name)
    if stored is not None or not create:
        return stored
    return new_key(inventory.cluster.name)


def new_key(cluster: str) -> str:
    """A new random key for the cluster, replacing the stored one (written whole, 0600, in a 0700 folder)."""
    key = secrets.token_urlsafe(KEY_BYTES)
    register_secret(key)
    path = key_path(cluster)
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    os.chmod(path.parent, 0o700)
    fd, temp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w") as handle:  # mkstemp makes it 0600
            handle.write(key + "\n")
        os.replace(temp, path)
    except BaseException:
        Path(temp).unlink(missing_ok=True)
        raise
    return key


def _read_stored(cluster: str) -> str | None:
    path = key_path(cluster)
    if not path.exists():
        return None
    try:
        key = read_limited(path, 4096).decode().strip()
    except (UnreadableFile, UnicodeDecodeError) as exc:
        raise TaskFailed(f"cannot read the API key in {path}: {getattr(exc, 'reason', 'not UTF-8 text')}",
                         hint=f"remove {path} to let sparkctl make a new one") from None
    if path.stat().st_mode & 0o077:
        os.chmod(path, 0o600)  # readable by its owner only, whatever umask or copy made it
    if not KEY_RE.match(key):
        raise TaskFailed(f"the API key in {path} is not a bearer token",
                         hint=f"remove {path} to let sparkctl make a new one")
    register_secret(key)
    return key
