"""Podman configuration of a node, behind the `docker` stand-in.

Measured on the lab machine (docs/architecture.md, the lab): crun rejects the hybrid cgroup layout, so runc;
no systemd-managed cgroups inside a node, so cgroupfs; no journald needed, so file events. Images come
from ONE shared read-only store; containers live in the node's own graphroot so names never clash.
"""

from __future__ import annotations

from pathlib import Path

CONTAINERS_CONF = """\
[engine]
cgroup_manager = "cgroupfs"
events_logger = "file"
runtime = "runc"
"""

STORAGE_CONF = """\
[storage]
driver = "overlay"
runroot = "/run/containers/storage"
graphroot = "/var/lib/containers/storage"

[storage.options]
additionalimagestores = ["{image_store}"]
"""

# nvidia may use the docker stand-in, which runs podman through sudo without a password.
DOCKER_SUDOERS = "%docker ALL=(root) NOPASSWD: /usr/bin/podman\n"


def write_podman_config(etc_upper: Path, image_store: str) -> None:
    conf_dir = etc_upper / "containers"
    conf_dir.mkdir(parents=True, exist_ok=True)
    (conf_dir / "containers.conf").write_text(CONTAINERS_CONF)
    (conf_dir / "storage.conf").write_text(STORAGE_CONF.format(image_store=image_store))
    # podman-docker prints a notice on every call unless this file exists
    (conf_dir / "nodocker").touch()


def has_containers(graphroot: Path) -> bool:
    """Whether a node ever created a container (teardown then removes them with podman first)."""
    containers_dir = graphroot / "storage" / "overlay-containers"
    return containers_dir.is_dir() and any(p.is_dir() for p in containers_dir.iterdir())
