"""PURE serve planning every engine shares: the endpoint, the repos each serving node needs, a launch's
fingerprint. Each engine's own launch: plan/launch.py."""

from __future__ import annotations

import hashlib

from sparkctl.inventory import Inventory
from sparkctl.knowledge.serve_client import endpoint_url
from sparkctl.plan.paths import draft_dir


def endpoint(inventory: Inventory) -> str:
    """The endpoint as clients see it: http://<head's inventory host>:<port> (shown, and tried from here)."""
    return endpoint_url(str(inventory.head.host), inventory.serve_spec().port)


def wanted_repos(inventory: Inventory) -> list[tuple[str, str | None]]:
    """(repo, local dir in the container or None for the hub cache): the model, then the draft."""
    spec = inventory.serve_spec()
    out: list[tuple[str, str | None]] = [(spec.model, None)]
    if spec.draft and spec.decoding != "none":
        out.append((spec.draft, draft_dir(spec.draft)))
    return out


def launch_fingerprint(config_text: str, command: str) -> str:
    """What identifies a running server's setup: the config it read and the line that started it."""
    return hashlib.sha256(f"{config_text}\0{command}".encode()).hexdigest()[:16]
