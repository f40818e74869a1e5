"""A lab node's reboot, as a Spark goes through one: its power goes (a clean shutdown through its systemd, or
`hard`: every process killed at once, a power cut), what lives in memory is lost (`/run`, `/tmp`, every address
and route its interfaces had, the links down), what lives on disk is kept (`/etc`, `/home`, `/root`, `/var/lib`,
the container storage), and it boots again through its real systemd: netplan rendered at boot by its real
renderer, docker.service (whose daemon starts the containers their restart policy brings back), sshd.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path
from typing import Protocol

from sparkctl.errors import SparkctlError
from sparkctl.lab import network, node
from sparkctl.lab.naming import LabNames
from sparkctl.lab.state import LabState, process_is_alive


class Lab(Protocol):
    """What a reboot uses of sparkctl.lab.lab.Lab (which imports this module)."""

    state: LabState
    names: LabNames
    cgroup_mounts: list[node.CgroupMount]

    def node_cgroup(self, name: str) -> str: ...

    def paths(self, name: str) -> node.NodePaths: ...

    def exec(self, name: str, argv: list[str] | str, check: bool = False, input: str | None = None,
             timeout: float | None = 120) -> subprocess.CompletedProcess: ...

#: How long a clean shutdown may take before the power is cut anyway (systemd's own default stop timeout is 90 s)
SHUTDOWN_TIMEOUT_S = 60.0
KILL_TIMEOUT_S = 15.0


def node_pids(lab: Lab, name: str) -> set[int]:
    """Every process of the node: its cgroup subtree holds its PID 1, its daemons and its containers."""
    pids: set[int] = set()
    for mount in lab.cgroup_mounts:
        top = node.CGROUP_ROOT / mount.mountpoint / lab.node_cgroup(name)
        for dirpath, _dirs, _files in os.walk(top):
            with contextlib.suppress(OSError, ValueError):
                pids.update(int(p) for p in Path(dirpath, "cgroup.procs").read_text().split())
    return {pid for pid in pids if process_is_alive(pid, None)}


def power_off(lab: Lab, name: str, hard: bool) -> None:
    """A clean shutdown (systemd stops its units, then the node's PID 1 exits), or a power cut; either way no
    process of the node is left."""
    record = lab.state.node(name)
    if not hard and record.init == "systemd" and record.pid and process_is_alive(record.pid, None):
        # what dockerd does as the system goes down: its containers stopped with their stop timeout (10 s);
        # the lab's containers run beside docker.service, not under it, so systemd would wait out its own 90 s
        lab.exec(name, ["podman", "stop", "--all", "--time", "10"], timeout=60)
        lab.exec(name, ["systemctl", "poweroff", "--no-block"], timeout=30)
        deadline = time.monotonic() + SHUTDOWN_TIMEOUT_S
        while process_is_alive(record.pid, None) and time.monotonic() < deadline:
            time.sleep(0.1)
    deadline = time.monotonic() + KILL_TIMEOUT_S
    while pids := node_pids(lab, name) | ({record.pid} if record.pid and process_is_alive(record.pid, None)
                                          else set()):
        if time.monotonic() > deadline:
            raise SparkctlError(f"{name}: processes {sorted(pids)} outlived the power cut")
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.05)


def forget_memory(lab: Lab, name: str) -> None:
    """What a power cycle loses: /run and /tmp emptied, every interface down with no address and no route."""
    paths = lab.paths(name)
    for volatile in (paths.run, paths.tmp):
        for entry in volatile.iterdir():
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry)
            else:
                entry.unlink()
    (paths.run / "lab").mkdir()
    (paths.run / "lab").chmod(0o1777)
    paths.tmp.chmod(0o1777)
    netns = lab.names.node_netns(name)
    links = [line.split(":")[1].strip().split("@")[0]
             for line in network.ip("-o", "link", "show", netns=netns).stdout.splitlines()]
    lines = []
    for link in links:
        if link != "lo":  # the loopback keeps 127.0.0.1 (systemd sets it up at boot, as the kernel left it)
            lines += [f"address flush dev {link}", f"link set {link} down"]
    network.ip_batch(lines, netns=netns)
    # the main table only: the local table holds the loopback's own routes (127.0.0.0/8), which nothing re-adds
    network.ip("route", "flush", "table", "main", netns=netns, check=False)
