"""PURE: the names of one serving world on its nodes: its systemd unit, its run/serve dir (and where the container
sees it), its log and PID files, and the marker its processes carry.

The first world of a cluster (a plain `serve:`, or the first world of serve.models[0]) has the names a cluster of one
model always had: `sparkctl-serve-<cluster>.service`, `run/serve`. Every other world adds `--<key>` (its model's
name as a word: inventory/placement.py, world_key), so several worlds on a node never share a file, a unit or a
process, and adding a model renames nothing that already runs.
"""

from __future__ import annotations

import posixpath
import re
from dataclasses import dataclass

from sparkctl.inventory import Inventory
from sparkctl.plan.container import hostfile_addresses
from sparkctl.plan.fabric import FabricPlan
from sparkctl.plan.gateway import ENGINE_HOST
from sparkctl.plan.paths import CONTAINER_STATE

UNIT_DIR = "/etc/systemd/system"
SERVE_DIR = "serve"
#: In a world's dir: the server's log and the PID of what the unit runs.
LOG_FILE = "serve.log"
PID_FILE = "serve.pid"
#: A world's own dir under run/ (and under CONTAINER_STATE), as `grep -E` and re.search read it: any world's.
ANY_SERVE_DIR = r"serve(--[a-z0-9-]+)?"


@dataclass(frozen=True)
class WorldNames:
    cluster: str
    key: str = ""

    @property
    def suffix(self) -> str:
        return f"--{self.key}" if self.key else ""

    @property
    def dir_name(self) -> str:
        """Its dir under the state dir's run/ (mounted in the container at CONTAINER_STATE)."""
        return f"{SERVE_DIR}{self.suffix}"

    def node_dir(self, state_dir: str) -> str:
        """Its dir on the node: the engine's config, the unit's scripts, the launch and deployment records."""
        return posixpath.join(state_dir, "run", self.dir_name)

    @property
    def container_dir(self) -> str:
        return f"{CONTAINER_STATE}/{self.dir_name}"

    def in_container(self, name: str) -> str:
        """A file of its dir as the container sees it."""
        return f"{self.container_dir}/{name}"

    @property
    def log(self) -> str:
        """serve.log as the node sees it, relative to the state dir."""
        return f"run/{self.dir_name}/{LOG_FILE}"

    @property
    def unit_name(self) -> str:
        return f"sparkctl-serve-{self.cluster}{self.suffix}.service"

    @property
    def unit_path(self) -> str:
        return posixpath.join(UNIT_DIR, self.unit_name)

    @property
    def marker(self) -> str:
        """What its processes carry in SPARKCTL_WORLD (serve_unit.WORLD_VARIABLE)."""
        return f"{self.cluster}{self.suffix}"


def literal(text: str) -> str:
    """`text` matched as itself by POSIX extended regexes and Python's alike (re.escape also escapes `-`, and GNU
    grep warns of a stray backslash before it)."""
    return re.sub(r"([.\[\]()*+?{}|^$\\])", r"\\\1", text)


def config_pattern(names: WorldNames | None, file: str) -> str:
    """A world's config file as it appears in a server's command line, as a regex (`grep -E`, re.search); with
    names None, any world's."""
    folder = literal(names.container_dir) if names is not None else f"{literal(CONTAINER_STATE)}/{ANY_SERVE_DIR}"
    return f"{folder}/{literal(file)}"


def world_names(inventory: Inventory) -> WorldNames:
    """The names of the world `inventory` serves (Inventory.for_world; the first world otherwise)."""
    return WorldNames(inventory.cluster.name, inventory.world_key)


def engine_host(inventory: Inventory, fabric: FabricPlan) -> str:
    """Where the world's API server answers: on the head, its loopback (the gateway beside it); elsewhere its node's
    fabric address the head reaches (the gateway on the head passes requests to it over the fabric, which the node's
    firewall keeps open; never the management network)."""
    head = inventory.serving_nodes()[0]
    if head == inventory.head.name:
        return ENGINE_HOST
    addresses = dict(zip((n.name for n in inventory.nodes), hostfile_addresses(inventory, fabric), strict=True))
    return addresses[head]
