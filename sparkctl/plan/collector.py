"""PURE: the figures collector on the head, for an engine whose own /metrics a read empties (trtllm-serve's
iteration stats): the one reader of it. Its own container, from the cluster's engine image (which has python3 and
prometheus_client), host network, `--restart unless-stopped`, running templates/serve-collector.py from the head's
state dir (mounted read-only); it answers on the head's loopback at serve's collector port, and the gateway's
/metrics is it (with the key). docs/top.md says what it keeps.
"""

from __future__ import annotations

import hashlib
import json
import posixpath
from dataclasses import dataclass

from sparkctl.inventory import Inventory
from sparkctl.plan.container import CLUSTER_LABEL, RESTART_POLICY, SPEC_LABEL
from sparkctl.plan.gateway import ENGINE_HOST
from sparkctl.plan.serve import collector_port
from sparkctl.shipped import shipped_text

COLLECTOR_CONTAINER = "sparkctl-collector"
SCRIPT_NAME = "serve-collector.py"
DIR_IN_CONTAINER = "/opt/sparkctl-collector"
#: seconds between two drains of the engine's queue (every scrape drains it too)
INTERVAL_S = 1.0


def collector_script() -> str:
    return shipped_text(SCRIPT_NAME)


@dataclass(frozen=True)
class CollectorSpec:
    cluster: str
    image: str
    port: int
    engine_port: int
    script_dir: str          # on the head

    @property
    def script_path(self) -> str:
        return posixpath.join(self.script_dir, SCRIPT_NAME)

    def command(self) -> list[str]:
        return [f"{DIR_IN_CONTAINER}/{SCRIPT_NAME}", "--engine", f"http://{ENGINE_HOST}:{self.engine_port}/metrics",
                "--listen", f"{ENGINE_HOST}:{self.port}", "--interval", f"{INTERVAL_S:g}"]

    def spec_hash(self) -> str:
        """What a running collector must have been made from: image, argv, the script's content, restart policy."""
        body = json.dumps({"image": self.image, "dir": self.script_dir, "argv": self.command(),
                           "script": hashlib.sha256(collector_script().encode()).hexdigest(),
                           "restart": RESTART_POLICY}, sort_keys=True)
        return hashlib.sha256(body.encode()).hexdigest()[:16]

    def run_argv(self) -> list[str]:
        # the image's own entrypoint (NGC's banner script, the cluster's) is not the collector's
        return ["docker", "run", "-d", "--name", COLLECTOR_CONTAINER, "--restart", RESTART_POLICY,
                "--network", "host", "-v", f"{self.script_dir}:{DIR_IN_CONTAINER}:ro", "--entrypoint", "python3",
                "--label", f"{CLUSTER_LABEL}={self.cluster}", "--label", f"{SPEC_LABEL}={self.spec_hash()}",
                self.image, *self.command()]


def collector_spec(inventory: Inventory, state_dir: str) -> CollectorSpec | None:
    """The head's collector, or None when the engine's own /metrics can be read by many (it keeps its counters)."""
    port = collector_port(inventory)
    if port is None:
        return None
    return CollectorSpec(cluster=inventory.cluster.name, image=inventory.container.image, port=port,
                         engine_port=inventory.serve_spec().engine_port,
                         script_dir=posixpath.join(state_dir, "collector"))
