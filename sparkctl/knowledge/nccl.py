"""What NCCL really used, read from its NCCL_DEBUG=INFO output; and NCCL's interface-list semantics."""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field

_VERSION = re.compile(r"NCCL INFO NCCL version (?P<v>\S+)")
_ENV = re.compile(r"NCCL INFO (?P<key>NCCL_[A-Z0-9_]+) set (?P<how>by environment to|to) (?P<value>.*?)\s*$")
_SOCKET_USING = re.compile(r"NET/Socket : Using (?P<list>.*)$")
_IB_USING = re.compile(r"NET/IB : Using (?P<list>.*)$")
_IFACE_ADDR = re.compile(r"\[\d+\](?P<name>[^:\s\[\]]+):(?P<addr>\S+?)<\d+>")
_IB_DEV = re.compile(r"\[\d+\](?P<dev>[^:\s\[\]]+):(?P<port>\d+)/(?P<link>\w+)")
_OOB = re.compile(r"OOB (?P<name>[^:\s]+):(?P<addr>\S+?)<\d+>")
_NETWORK = re.compile(r"NCCL INFO Using network (?P<net>\w+)")
_CHANNEL = re.compile(r"NCCL INFO Channel \d+/\d+ : .* via (?P<via>\S+)")
_WARN = re.compile(r"NCCL WARN (?P<msg>.*?)\s*$")
_BUSBW = re.compile(r"busbw_GBps=(?P<bw>[\d.]+)|#\s*Avg bus bandwidth\s*:\s*(?P<avg>[\d.]+)")



def log_lines_script(log: str, lines: int) -> str:
    """Shell printing the last `lines` of NCCL's own lines in the log `log` (a shell word, quoted), those
    parse_nccl_log reads; nothing, and no process started, where there is no such log (a node that runs no rank)."""
    return f"if [ -f {log} ]; then grep -E 'NCCL|NET/' {log} 2>/dev/null | tail -n {lines}; fi"

@dataclass
class IbDevice:
    device: str  # "rocep1s0f1"
    port: int
    link: str  # "RoCE" | "IB"


@dataclass
class NcclReport:
    nccl_version: str | None = None
    env: dict[str, str] = field(default_factory=dict)
    socket_interfaces: list[tuple[str, str]] = field(default_factory=list)  # (ifname, address)
    ib_devices: list[IbDevice] = field(default_factory=list)
    ib_oob: tuple[str, str] | None = None  # (ifname, address) NET/IB uses out of band
    ib_no_device: bool = False
    #: what each rank's "Using network" line said, in the log's order ("IB" | "Socket")
    networks: list[str] = field(default_factory=list)
    transports: dict[str, int] = field(default_factory=dict)  # "NET/IB/0" -> channel lines seen
    warnings: list[str] = field(default_factory=list)
    bootstrap_error: str | None = None  # e.g. "Bootstrap : no socket interface found"
    busbw_gbps: float | None = None

    @property
    def network(self) -> str | None:
        """The network the world ran on, judged by its worst rank: one rank on sockets holds every all-reduce to
        that rank's speed, whatever the others chose."""
        if "Socket" in self.networks:
            return "Socket"
        return self.networks[0] if self.networks else None

    @property
    def socket_ranks(self) -> int:
        return self.networks.count("Socket")

    @property
    def ib_hca_requested(self) -> bool:
        return bool(self.env.get("NCCL_IB_HCA")) and self.env.get("NCCL_IB_DISABLE", "0") != "1"

    @property
    def silent_tcp_fallback(self) -> bool:
        """RDMA devices were asked for, none was found, and NCCL quietly ran over TCP sockets."""
        return self.ib_hca_requested and self.ib_no_device and self.network == "Socket"

    @property
    def uses_ib(self) -> bool:
        return self.network == "IB" or any(t.startswith("NET/IB") for t in self.transports)

    @property
    def ib_device_names(self) -> list[str]:
        return [d.device for d in self.ib_devices]


def _append_unique(items: list, item) -> None:
    if item not in items:
        items.append(item)


def parse_nccl_log(text: str) -> NcclReport:
    """Every rank prints the same init lines: they are merged, first seen first; the network each rank chose is
    kept per rank (`networks`), and judged by the worst."""
    report = NcclReport()
    for line in text.splitlines():
        if "NCCL" not in line and "NET/" not in line and "busbw" not in line and "bus bandwidth" not in line:
            continue
        if m := _VERSION.search(line):
            report.nccl_version = report.nccl_version or m["v"]
        elif m := _ENV.search(line):
            value = m["value"].removesuffix(".")  # NCCL ends numeric settings with a full stop
            if m["how"].startswith("by environment") or m["key"] not in report.env:
                report.env[m["key"]] = value
        elif m := _SOCKET_USING.search(line):
            for iface in _IFACE_ADDR.finditer(m["list"]):
                _append_unique(report.socket_interfaces, (iface["name"], iface["addr"]))
        elif "NET/IB : No device found" in line:
            report.ib_no_device = True
        elif m := _IB_USING.search(line):
            listed, _, oob = m["list"].partition(";")
            for dev in _IB_DEV.finditer(listed):
                _append_unique(report.ib_devices, IbDevice(dev["dev"], int(dev["port"]), dev["link"]))
            if o := _OOB.search(oob):
                report.ib_oob = report.ib_oob or (o["name"], o["addr"])
        elif m := _NETWORK.search(line):
            report.networks.append(m["net"])
        elif m := _CHANNEL.search(line):
            report.transports[m["via"]] = report.transports.get(m["via"], 0) + 1
        elif m := _WARN.search(line):
            _append_unique(report.warnings, m["msg"])
            if m["msg"].startswith("Bootstrap :"):
                report.bootstrap_error = report.bootstrap_error or m["msg"]
        elif m := _BUSBW.search(line):
            report.busbw_gbps = float(m["bw"] or m["avg"])
    return report


@dataclass
class NcclList:
    """An NCCL interface/device list: comma-separated entries (each `name` or `name:port`), where a leading
    `^` excludes and then a leading `=` asks for exact names instead of prefixes, for the whole list."""

    entries: list[tuple[str, int | None]]
    exclude: bool = False
    exact: bool = False

    def matches(self, name: str, port: int | None = None) -> bool:
        if not self.entries:  # an empty list selects everything, as in NCCL
            hit = True
        else:
            hit = any((name == prefix if self.exact else name.startswith(prefix))
                      and (p is None or port is None or p == port) for prefix, p in self.entries)
        return hit != self.exclude


def parse_nccl_list(spec: str) -> NcclList:
    spec = spec.strip()
    exclude = spec.startswith("^")
    spec = spec[1:] if exclude else spec
    exact = spec.startswith("=")
    spec = spec[1:] if exact else spec
    entries: list[tuple[str, int | None]] = []
    for raw in spec.split(","):
        name, sep, port = raw.strip().partition(":")
        if not name:
            continue  # NCCL skips empty entries (a trailing comma selects nothing extra)
        entries.append((name, int(port) if sep and port.strip().isdigit() else None))
    return NcclList(entries, exclude, exact)


def match_ifname(spec: str, names: Iterable[str]) -> list[str]:
    """The interfaces NCCL_SOCKET_IFNAME=spec selects among `names`, in their order."""
    selector = parse_nccl_list(spec)
    return [n for n in names if selector.matches(n)]


def parse_ib_hca(spec: str) -> list[tuple[str, int | None]]:
    """NCCL_IB_HCA entries as (device, port or None); the ^/= flags are in `parse_nccl_list(spec)`."""
    return parse_nccl_list(spec).entries


def match_ib_hca(spec: str, devices: Iterable[tuple[str, int]]) -> list[tuple[str, int]]:
    """The (device, port) pairs NCCL_IB_HCA=spec selects among the node's RDMA devices."""
    selector = parse_nccl_list(spec)
    return [(dev, port) for dev, port in devices if selector.matches(dev, port)]
