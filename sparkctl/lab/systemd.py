"""systemd inside a node: which of the machine's units to mask, what to enable, how to tell it booted.

A node boots the machine's own systemd over an overlay of the machine's /etc, so every unit the machine
enables (databases, timers, podman's API, gettys on the machine's ttys) would start once per node.
The mask list is computed from the machine's enablement symlinks, never hard-coded.
"""

from __future__ import annotations

import os
from pathlib import Path

from sparkctl.lab.renderer import DEFAULT_RENDERER, Renderer, renderer_spec

SYSTEMD_BINARY = "/lib/systemd/systemd"
# What a lab node needs running, whatever renders its netplan (the renderer adds its daemon); everything
# else the machine enables is masked. lldpd: a Spark can run it (Debian/Ubuntu package lldpd), and sparkctl reads
# the cabling from it.
KEEP_PREFIXES = ("ssh.", "sshd.", "dbus", "lldpd")
# Not enabled by the machine but started by systemd in a container; they would attach to the
# machine's own consoles.
ALWAYS_MASKED = ("console-getty.service", "getty.target")
#: Enabled in every node whether or not the machine enables it (apt enables it, a machine may have disabled it).
LLDPD_UNIT = "lldpd.service"
#: The docker daemon's stand-in (lab/standins/node-bin/dockerd): `systemctl stop docker` works as on a Spark, and
#: it is restarted as Docker's own unit restarts dockerd (moby, contrib/init/systemd/docker.service: Restart=always,
#: RestartSec=2, StartLimitBurst=3 in 60 s).
DOCKER_UNIT = """[Unit]
Description=Docker daemon (sparkctl lab stand-in: its socket; podman runs the containers)
StartLimitBurst=3
StartLimitIntervalSec=60s

[Service]
ExecStart=/usr/local/bin/dockerd
Restart=always
RestartSec=2

[Install]
WantedBy=multi-user.target
"""


def enabled_units(etc_systemd: Path = Path("/etc/systemd/system")) -> set[str]:
    """Units the machine enables: the targets of its `*.wants`/`*.requires` symlinks."""
    units: set[str] = set()
    if not etc_systemd.is_dir():
        return units
    for wants in etc_systemd.iterdir():
        if wants.is_dir() and wants.name.endswith((".wants", ".requires")):
            units.update(entry.name for entry in wants.iterdir())
    return units


def template_of(unit: str) -> str:
    """`getty@tty1.service` is enabled as an instance; masking the template covers every instance."""
    if "@" in unit:
        prefix, suffix = unit.split("@", 1)
        return f"{prefix}@.{suffix.rsplit('.', 1)[1]}"
    return unit


def units_to_mask(enabled: set[str], renderer: Renderer | None = None) -> list[str]:
    renderer = renderer or renderer_spec(DEFAULT_RENDERER)
    keep = KEEP_PREFIXES + renderer.keep_prefixes
    masked = {template_of(u) for u in enabled if not u.startswith(keep)}
    masked.update(ALWAYS_MASKED)
    masked.update(renderer.masked)
    return sorted(masked)


def write_unit_config(etc_upper: Path, masked: list[str], renderer: Renderer | None = None) -> None:
    """Masks and enablement as symlinks in the node's /etc overlay upper dir."""
    renderer = renderer or renderer_spec(DEFAULT_RENDERER)
    unit_dir = etc_upper / "systemd" / "system"
    unit_dir.mkdir(parents=True, exist_ok=True)
    for unit in masked:
        _symlink("/dev/null", unit_dir / unit)
    enable = list(renderer.enable)
    if Path("/lib/systemd/system", LLDPD_UNIT).is_file():
        enable.append(("multi-user.target.wants", LLDPD_UNIT))
    for wants, unit in enable:
        (unit_dir / wants).mkdir(exist_ok=True)
        _symlink(f"/lib/systemd/system/{unit}", unit_dir / wants / unit)
    docker = unit_dir / "docker.service"
    if docker.is_symlink():
        docker.unlink()  # the machine's docker.service was in the mask list
    docker.write_text(DOCKER_UNIT)
    _symlink("/etc/systemd/system/docker.service", unit_dir / "multi-user.target.wants" / "docker.service")


def _symlink(target: str, link: Path) -> None:
    if link.is_symlink() or link.exists():
        link.unlink()
    os.symlink(target, link)


def booted(state_text: str) -> bool:
    """`systemctl is-system-running` output of a node that finished booting."""
    return state_text.strip() in ("running", "degraded")
