"""Typed facts about one node, as read by the one-round-trip gather script."""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass, field

from sparkctl.knowledge.spark import spark_port_of

# docker's own words for a user outside the docker group: "permission denied while trying to connect to the Docker
# daemon socket at unix:///var/run/docker.sock" (and "Got permission denied ..." from older clients)
_DOCKER_DENIED = re.compile(r"permission denied.*(daemon socket|docker\.sock)|docker\.sock.*permission denied", re.I)


@dataclass
class Address:
    ip: str
    prefixlen: int
    family: str  # "inet" | "inet6"
    scope: str  # "global" | "link" | "host"

    @property
    def interface(self) -> ipaddress.IPv4Interface | ipaddress.IPv6Interface:
        return ipaddress.ip_interface(f"{self.ip}/{self.prefixlen}")

    @property
    def network(self) -> ipaddress.IPv4Network | ipaddress.IPv6Network:
        return self.interface.network

    @property
    def is_link_local(self) -> bool:
        return self.interface.ip.is_link_local

    def __str__(self) -> str:
        return f"{self.ip}/{self.prefixlen}"


@dataclass
class Interface:
    name: str
    mtu: int
    operstate: str  # "UP", "DOWN", "UNKNOWN", "LOWERLAYERDOWN", ...
    carrier: bool | None = None
    mac: str | None = None
    addresses: list[Address] = field(default_factory=list)
    speed_mbps: int | None = None
    flags: list[str] = field(default_factory=list)

    @property
    def up(self) -> bool:
        return self.operstate == "UP" or (self.operstate == "UNKNOWN" and bool(self.carrier))

    def ipv4(self) -> list[Address]:
        return [a for a in self.addresses if a.family == "inet"]


@dataclass
class RoceDevice:
    device: str  # "rocep1s0f1"
    port: int
    netdev: str  # "enp1s0f1np1"
    up: bool


@dataclass(frozen=True)
class Route:
    destination: str       # "192.168.3.0/24", "default"
    via: str | None
    device: str | None

    def __str__(self) -> str:
        return " ".join([self.destination] + ([f"via {self.via}"] if self.via else [])
                        + ([f"dev {self.device}"] if self.device else []))


@dataclass
class NetplanFile:
    path: str
    content: str | None  # None: exists but could not be read (not even with sudo -n)
    mode: int | None


@dataclass
class ContainerInfo:
    name: str
    exists: bool
    running: bool = False
    status: str = "absent"  # docker's State.Status, "absent", or "unknown" when docker is not usable
    image: str | None = None
    image_id: str | None = None
    labels: dict[str, str] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)
    mounts: list[dict] = field(default_factory=list)
    restart_count: int = 0
    started_at: str | None = None
    id: str | None = None
    #: why the state is "unknown": what docker said, or that it did not answer in time
    error: str | None = None


@dataclass
class Facts:
    node: str
    hostname: str = ""
    os_id: str = ""
    os_version: str = ""
    arch: str = ""
    dgx_name: str | None = None
    is_dgx_spark: bool = False
    user: str = ""
    uid: int = -1
    home: str | None = None  # the login user's $HOME on the node (where ~ in paths goes)
    groups: list[str] = field(default_factory=list)
    sudo_nopasswd: bool = False
    interfaces: dict[str, Interface] = field(default_factory=dict)
    roce: list[RoceDevice] = field(default_factory=list)
    session_ip: str | None = None
    routes: list[Route] = field(default_factory=list)
    #: /proc/sys/net/ipv4: "ip_forward", "<iface>.forwarding", "<iface>.rp_filter" ("all" and "default" too)
    ipv4_conf: dict[str, str] = field(default_factory=dict)
    #: sparkctl's files in /etc/sysctl.d: path -> content
    sysctl_files: dict[str, str] = field(default_factory=dict)
    management_interfaces: list[str] = field(default_factory=list)
    netplan_files: list[NetplanFile] = field(default_factory=list)
    docker_cli: bool = False
    docker_access: bool = False
    docker_error: str | None = None
    containers: dict[str, ContainerInfo] = field(default_factory=dict)
    images: dict[str, str | None] = field(default_factory=dict)
    listening_tcp: dict[int, str | None] = field(default_factory=dict)
    mem_total_kb: int = 0
    mem_available_kb: int = 0
    page_cache_kb: int = 0
    hf_cache: str = ""
    hf_cache_free_bytes: int | None = None
    time: float = 0.0
    firewall: str | None = None
    raw_errors: list[str] = field(default_factory=list)
    #: what a caller read on the same connection right after the facts (e.g. `cluster status`)
    extra: object = None

    @property
    def docker_denied(self) -> bool:
        """docker failed because the user may not use its socket (the docker group fixes that), not for another
        reason (a broken daemon, its storage, the runtime)."""
        return bool(self.docker_error and _DOCKER_DENIED.search(self.docker_error))

    def fabric_interfaces(self) -> list[str]:
        """The netdevs that have a RoCE device, in the order the node listed them."""
        seen: list[str] = []
        for dev in self.roce:
            if dev.netdev not in seen:
                seen.append(dev.netdev)
        return seen

    def roce_for(self, netdev: str) -> RoceDevice | None:
        return next((d for d in self.roce if d.netdev == netdev), None)

    def addresses_of(self, ifname: str) -> list[Address]:
        iface = self.interfaces.get(ifname)
        return list(iface.addresses) if iface else []

    def interface_up(self, ifname: str) -> bool:
        iface = self.interfaces.get(ifname)
        if iface is not None:
            return iface.up
        dev = self.roce_for(ifname)
        return bool(dev and dev.up)

    def ports(self) -> dict[int, list[str]]:
        """Physical port -> its twin netdevs, twin 1 (PCIe domain 0) first.

        Built from the RoCE map when the node has one, else from interface names alone (a node whose RDMA
        stack is missing still shows its netdevs)."""
        candidates = self.fabric_interfaces() or list(self.interfaces)
        by_port: dict[int, list[tuple[int, str]]] = {}
        for name in candidates:
            where = spark_port_of(name)
            if where is not None:
                by_port.setdefault(where[0], []).append((where[1], name))
        return {port: [name for _, name in sorted(twins)] for port, twins in sorted(by_port.items())}

    def up_ports(self) -> dict[int, list[str]]:
        """The ports whose twins are all Up (one cable brings both twins of its port Up)."""
        return {port: twins for port, twins in self.ports().items()
                if twins and all(self.interface_up(t) for t in twins)}

    def routes_on(self, interfaces: list[str] | tuple[str, ...]) -> list[Route]:
        return [r for r in self.routes if r.device in interfaces]

    def interfaces_holding(self, ip: str) -> list[str]:
        return [name for name, iface in self.interfaces.items() if any(a.ip == ip for a in iface.addresses)]
