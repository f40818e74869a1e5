"""PURE: where sparkctl's things live, on a node and inside its container.

Everything sparkctl keeps on a node lives under the login user's state dir (the container mounts parts of it)
or, for what must survive the user's home and needs root, under /var/lib/sparkctl.
"""

from __future__ import annotations

import posixpath

from sparkctl.facts import Facts
from sparkctl.inventory import Inventory, Node

HOSTFILE_PATH = "/etc/openmpi-hostfile"
CONTAINER_HF_HOME = "/root/.cache/huggingface"
CONTAINER_STATE = "/sparkctl"
ENTRYPOINT_PATH = "/opt/sparkctl/entrypoint.sh"
#: Root-owned record of what sparkctl changed in the network (for `cluster down --network`) and the revert guard.
NETWORK_STATE_ROOT = "/var/lib/sparkctl"


def node_home(inventory: Inventory, node: Node, facts: Facts | None) -> str:
    """The login user's $HOME on the node: from its facts, else guessed from the user's name."""
    home = facts.home if facts is not None else None
    if not home and facts is not None:
        home = _home_from_hf_cache(inventory.container.hf_cache, facts.hf_cache or "")
    return home or f"/home/{node.user or inventory.user}"


def _home_from_hf_cache(configured: str, expanded: str) -> str | None:
    # The gather script expands `~` in the HF cache path on the node: that is the only $HOME facts carry.
    if not configured.startswith("~") or not expanded.startswith("/"):
        return None
    rest = configured[1:]
    if rest and not expanded.endswith(rest):
        return None
    home = expanded[: len(expanded) - len(rest)] if rest else expanded
    return home.rstrip("/") or None


def expand_home(path: str, home: str) -> str:
    if path == "~" or path.startswith("~/"):
        return posixpath.join(home, path[2:]) if len(path) > 1 else home
    return path


def state_dir(inventory: Inventory, home: str) -> str:
    """sparkctl's state on a node: container keys, entrypoint, serve config and logs (mounted into the container)."""
    return posixpath.join(home, ".local/state/sparkctl", inventory.cluster.name)


def network_state_dir(cluster: str) -> str:
    return posixpath.join(NETWORK_STATE_ROOT, cluster, "network")


#: The container's keys in the state dir's container-ssh/ (mounted read-only at /tmp/.ssh in the container).
CONTAINER_CLIENT_KEY = "id_ed25519"
CONTAINER_HOST_KEY = "ssh_host_ed25519_key"


def sysctl_path(cluster: str) -> str:
    """The sysctl.d file sparkctl keeps a node's kernel settings in (a relaying ring node's forwarding)."""
    return f"/etc/sysctl.d/60-sparkctl-{cluster}.conf"


def cluster_key_name(cluster: str) -> str:
    """The node's own ssh key for this cluster, in ~/.ssh."""
    return f"sparkctl-{cluster}_ed25519"


def draft_dir(repo: str) -> str:
    """Where the draft lives inside the container: in the mounted HF cache, never /opt (lost with the container)."""
    return f"{CONTAINER_HF_HOME}/sparkctl-models/{repo.replace('/', '--')}"
