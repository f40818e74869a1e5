"""PURE: a world's figures collector on the world's head, for an engine whose own /metrics a read empties
(trtllm-serve's iteration stats): the one reader of it. Its own container (`sparkctl-collector`, plus the world's
suffix for a world other than the first), from the cluster's engine image (which has python3 and prometheus_client),
host network, `--restart unless-stopped`, running templates/serve-collector.py from the node's state dir (mounted
read-only). It answers where its world's engine does (Launch.host: the head's loopback, or the world head's fabric
address for a world off the cluster's head) at the world's collector port: the gateway's /metrics of the first world,
and what the world's watchdog, top and serve status read. docs/top.md says what it keeps.
"""

from __future__ import annotations

import hashlib
import json
import posixpath
from dataclasses import dataclass

from sparkctl.inventory import Inventory
from sparkctl.plan.container import RESTART_POLICY, SPEC_LABEL, cluster_label
from sparkctl.plan.gateway import ENGINE_HOST
from sparkctl.plan.serve import collector_port
from sparkctl.plan.world import WorldNames, world_names
from sparkctl.shipped import shipped_text

COLLECTOR_CONTAINER = "sparkctl-collector"
SCRIPT_NAME = "serve-collector.py"
DIR_IN_CONTAINER = "/opt/sparkctl-collector"
#: seconds between two drains of the engine's queue (every scrape drains it too)
INTERVAL_S = 1.0


def collector_script() -> str:
    return shipped_text(SCRIPT_NAME)


def collector_name(names: WorldNames) -> str:
    """The container of the world `names` names."""
    return COLLECTOR_CONTAINER + names.suffix


def collectors_on(inventory: Inventory, node: str) -> list[str]:
    """The containers of the collectors of the worlds headed on `node` (what serve.collector runs there)."""
    views = [inventory.for_world(world) for world in inventory.worlds()]
    return [collector_name(world_names(view)) for view in views
            if view.serving_nodes()[0] == node and collector_port(view) is not None]


def is_collector(container: str) -> bool:
    """Is this a figures collector's container, any world's?"""
    return container == COLLECTOR_CONTAINER or container.startswith(COLLECTOR_CONTAINER + "--")


@dataclass(frozen=True)
class CollectorSpec:
    cluster: str
    image: str
    port: int
    engine_port: int
    script_dir: str          # on the world's head
    #: the container's name (collector_name)
    container: str = COLLECTOR_CONTAINER
    #: where the world's engine answers, and the collector beside it (Launch.host)
    host: str = ENGINE_HOST

    @property
    def script_path(self) -> str:
        return posixpath.join(self.script_dir, SCRIPT_NAME)

    def command(self) -> list[str]:
        return [f"{DIR_IN_CONTAINER}/{SCRIPT_NAME}", "--engine", f"http://{self.host}:{self.engine_port}/metrics",
                "--listen", f"{self.host}:{self.port}", "--interval", f"{INTERVAL_S:g}"]

    def spec_hash(self) -> str:
        """What a running collector must have been made from: image, argv, the script's content, restart policy."""
        body = json.dumps({"image": self.image, "dir": self.script_dir, "argv": self.command(),
                           "script": hashlib.sha256(collector_script().encode()).hexdigest(),
                           "restart": RESTART_POLICY}, sort_keys=True)
        return hashlib.sha256(body.encode()).hexdigest()[:16]

    def run_argv(self) -> list[str]:
        # the image's own entrypoint (NGC's banner script, the cluster's) is not the collector's
        return ["docker", "run", "-d", "--name", self.container, "--restart", RESTART_POLICY,
                "--network", "host", "-v", f"{self.script_dir}:{DIR_IN_CONTAINER}:ro", "--entrypoint", "python3",
                "--label", cluster_label(self.cluster), "--label", f"{SPEC_LABEL}={self.spec_hash()}",
                self.image, *self.command()]


def collector_spec(inventory: Inventory, state_dir: str, host: str = ENGINE_HOST) -> CollectorSpec | None:
    """The collector of the world `inventory` is a view of (the first world's for the whole inventory), on its head
    whose state dir is `state_dir`, beside its engine at `host` (Launch.host); None when the engine's own /metrics
    can be read by many (it keeps its counters)."""
    port = collector_port(inventory)
    if port is None:
        return None
    return CollectorSpec(cluster=inventory.cluster.name, image=inventory.container.image, port=port,
                         engine_port=inventory.serve_spec().engine_port,
                         script_dir=posixpath.join(state_dir, "collector"),
                         container=collector_name(world_names(inventory)), host=host)
