"""Tear a lab down from its recorded state, also after a crash or a half-built bring-up.

Order (docs/architecture.md, the lab): containers first (podman keeps state in the node's graphroot), then the
recorded processes and whatever else sits in the lab's own cgroup, then machine-side links (a deleted
netns can outlive `ip netns del` and keep names), then namespaces, then the empty cgroups.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Protocol

from sparkctl.lab import network, node, podman
from sparkctl.lab.naming import LabNames
from sparkctl.lab.state import LabState, process_is_alive


class Lab(Protocol):
    """What teardown needs of a lab (sparkctl/lab/lab.py's Lab)."""

    state: LabState
    names: LabNames
    cgroup_mounts: list

    def paths(self, node_name_: str) -> node.NodePaths: ...

    def exec(self, name: str, argv: list[str] | str, check: bool = False, input: str | None = None,
             timeout: float | None = 120) -> subprocess.CompletedProcess: ...


def teardown(lab: Lab, log) -> list[str]:
    state = lab.state
    _remove_containers(lab, log)
    _kill_lab_processes(lab)
    leftovers: list[str] = []
    existing = network.existing_links()
    for resource in reversed(state.of_kind("link")):
        if resource.netns is None and resource.name in existing:
            result = network.ip("link", "del", resource.name, check=False)
            if result.returncode != 0:
                leftovers.append(f"link {resource.name}: {result.stderr.strip()}")
    namespaces = network.existing_netns()
    for resource in reversed(state.of_kind("netns")):
        if resource.name in namespaces:
            result = network.ip("netns", "del", resource.name, check=False)
            if result.returncode != 0:
                leftovers.append(f"netns {resource.name}: {result.stderr.strip()}")
    for resource in state.of_kind("cgroup"):
        left = _remove_cgroup_patiently(resource.name, lab)
        leftovers += [f"cgroup {path}" for path in left]
    _remove_empty_parent("sparkctl-lab", lab)
    for record in state.nodes:
        record.pid = None
    return leftovers


def _remove_containers(lab: Lab, log) -> None:
    def remove(record) -> None:
        if record.pid is None or not process_is_alive(record.pid, None):
            return
        if not podman.has_containers(lab.paths(record.name).containers):
            return
        log(f"{record.name}: removing containers")
        try:
            lab.exec(record.name, ["podman", "rm", "-f", "-a", "-t", "0"], timeout=30)
        except subprocess.TimeoutExpired:
            log(f"{record.name}: podman rm timed out; killing the node anyway")

    with ThreadPoolExecutor(max_workers=8) as pool:
        list(pool.map(remove, lab.state.nodes))


def _cgroup_pids(lab: Lab) -> set[int]:
    """Every process in the lab's own cgroup subtree: they are the lab's by construction."""
    pids: set[int] = set()
    for mount in lab.cgroup_mounts:
        top = node.CGROUP_ROOT / mount.mountpoint / lab.names.cgroup
        if not top.is_dir():
            continue
        for dirpath, _dirs, _files in os.walk(top):
            try:
                pids.update(int(p) for p in Path(dirpath, "cgroup.procs").read_text().split())
            except OSError:
                continue
    return pids


def _kill_lab_processes(lab: Lab) -> None:
    node_pids = {r.pid for r in lab.state.nodes}
    # node PID 1s first: each launcher then reaps its node instead of leaving a zombie behind
    recorded = sorted(((int(r.name), r.starttime) for r in lab.state.of_kind("process")),
                      key=lambda p: p[0] not in node_pids)
    deadline = time.monotonic() + 10
    while True:
        # PID 1 of a node first: the kernel then kills everything in its PID namespace
        targets = [pid for pid, start in recorded if start is not None and process_is_alive(pid, start)]
        targets += [pid for pid in _cgroup_pids(lab) if process_is_alive(pid, None)]
        if not targets or time.monotonic() > deadline:
            return
        for pid in targets:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.05)


def _remove_cgroup_patiently(relative: str, lab: Lab) -> list[str]:
    deadline = time.monotonic() + 5
    while True:
        left = node.remove_cgroup(relative, lab.cgroup_mounts)
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.1)


def _remove_empty_parent(relative: str, lab: Lab) -> None:
    for mount in lab.cgroup_mounts:
        # fails when another lab still uses it, or it was never made
        with contextlib.suppress(OSError):
            (node.CGROUP_ROOT / mount.mountpoint / relative).rmdir()
