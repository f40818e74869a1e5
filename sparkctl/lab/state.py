"""The lab's record of what it created, written BEFORE each resource is created.

`lab down` walks this record, so a crash or a half-built lab is still torn down completely, and only
what is recorded (processes by PID plus start time) is ever removed or killed.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path

STATE_FILE = "state.json"
RESOURCE_KINDS = ("netns", "link", "cgroup", "process")


@dataclass
class Resource:
    kind: str  # one of RESOURCE_KINDS
    name: str  # netns name, link name, cgroup path relative to each hierarchy, or the PID as text
    netns: str | None = None  # for links living in a lab namespace
    starttime: int | None = None  # for processes: /proc/<pid>/stat field 22, guards against PID reuse
    node: str | None = None


@dataclass
class NodeRecord:
    name: str
    index: int
    mgmt_ip: str
    pid: int | None = None  # host PID of the node's PID 1
    init: str = "systemd"  # "systemd" or "shell" (the fallback)


@dataclass
class LabState:
    lab_id: str
    dir: str
    topology: str
    port: int
    sudo_password: bool = False
    #: a ring cabled in this order of node numbers instead of the inventory's (a miscabled lab)
    ring_order: list[int] | None = None
    #: what renders netplan on the nodes: "networkmanager" (DGX OS) or "networkd" (sparkctl/lab/renderer.py)
    renderer: str = "networkd"
    phase: str = "building"  # building | up | down
    nodes: list[NodeRecord] = field(default_factory=list)
    resources: list[Resource] = field(default_factory=list)

    @property
    def path(self) -> Path:
        return Path(self.dir) / STATE_FILE

    def save(self) -> None:
        """Atomic: a crash leaves the previous or the new record, never half of one."""
        tmp = self.path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(asdict(self), indent=1) + "\n")
        os.replace(tmp, self.path)

    def record(self, resource: Resource) -> Resource:
        self.resources.append(resource)
        self.save()
        return resource

    def node(self, name: str) -> NodeRecord:
        for node in self.nodes:
            if node.name == name:
                return node
        known = ", ".join(n.name for n in self.nodes) or "none"
        raise KeyError(f"no node {name!r} in this lab (nodes: {known})")

    def of_kind(self, kind: str) -> list[Resource]:
        return [r for r in self.resources if r.kind == kind]

    @classmethod
    def load(cls, directory: str | Path) -> LabState:
        raw = json.loads((Path(directory) / STATE_FILE).read_text())
        raw["nodes"] = [NodeRecord(**n) for n in raw.get("nodes", [])]
        raw["resources"] = [Resource(**r) for r in raw.get("resources", [])]
        return cls(**raw)

    @staticmethod
    def exists(directory: str | Path) -> bool:
        return (Path(directory) / STATE_FILE).is_file()


def process_starttime(pid: int) -> int | None:
    """Start time in clock ticks since boot, or None when the process is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    # comm (field 2) may contain spaces and parentheses: split after the last ')'
    fields = stat[stat.rindex(")") + 2 :].split()
    return int(fields[19])


def process_is_alive(pid: int, starttime: int | None) -> bool:
    """True when `pid` is still the process we recorded and not a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return False
    fields = stat[stat.rindex(")") + 2 :].split()
    if fields[0] in ("Z", "X"):
        return False
    return starttime is None or int(fields[19]) == starttime
