"""PURE verdicts of `fabric bench`: a link's measured bandwidth, or an NCCL all-reduce's bus bandwidth, against
the Spark's figures (knowledge/spark.py), with the likely causes of a shortfall — each one offered only where the
evidence read from the nodes supports it.

Causes come in the issue's order (link speed, MTU, a twin missing from NCCL_IB_HCA, PCIe width, RoCE not in use);
a cause whose own ceiling explains the figure (a link negotiated at 10G measuring 9, a shaper at 500 Mbit/s
measuring 0.49) goes first, because it is the one binding.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from sparkctl.knowledge import spark
from sparkctl.knowledge.nccl import NcclReport

#: A ceiling "explains" a figure within this margin.
_BINDING = 1.25
_RATE = re.compile(r"\b(?:rate|bandwidth) (?P<n>[\d.]+)(?P<unit>[KMGT]?)(?:bit|bps)\b")
_UNIT = {"": 1e-9, "K": 1e-6, "M": 1e-3, "G": 1.0, "T": 1e3}


def parse_shaper(qdisc_text: str) -> tuple[str, float] | None:
    """The first rate-limiting qdisc in `tc qdisc show dev X` (tbf/cake/...): (its line, its rate in Gb/s)."""
    for line in qdisc_text.splitlines():
        if m := _RATE.search(line):
            return line.strip(), float(m["n"]) * _UNIT[m["unit"]]
    return None


@dataclass
class TwinEnd:
    """One end of a fabric link as its node reports it right before the measurement."""

    node: str
    interface: str
    speed_mbps: int | None = None
    mtu: int | None = None
    pcie_width: int | None = None
    pcie_max_width: int | None = None
    shaper: str | None = None
    shaper_gbps: float | None = None

    @property
    def where(self) -> str:
        return f"{self.node} {self.interface}"


@dataclass
class Cause:
    key: str  # "speed" | "mtu" | "hca" | "pcie" | "roce" | "shaper"
    text: str
    evidence: str
    ceiling: float | None = None  # what this cause alone would allow, in the figure's unit

    def to_dict(self) -> dict:
        return {"cause": self.key, "text": self.text, "evidence": self.evidence}


@dataclass
class Verdict:
    ok: bool
    value: float | None
    expected: float
    unit: str
    basis: str
    causes: list[Cause] = field(default_factory=list)

    @property
    def percent(self) -> float | None:
        """Whole percents; one decimal below 10% (a shaped link gives 0.2%, not 0%)."""
        if self.value is None:
            return None
        share = 100 * self.value / self.expected
        return round(share) if share >= 10 else round(share, 1)

    def summary(self, subject: str = "this link") -> str:
        if self.value is None:
            return f"{subject} was not measured"
        if self.ok:
            return f"pass ({self.percent}% of {self.basis})"
        head = f"{subject} gives {self.percent}% of {self.basis}"
        if not self.causes:
            return head + ": no cause shows in what the nodes report (a busy node, the peer, or the cable)"
        return head + ": " + "; ".join(c.text for c in self.causes)

    def to_dict(self) -> dict:
        return {"ok": self.ok, "value": self.value, "expected": self.expected, "unit": self.unit,
                "percent": self.percent, "basis": self.basis, "causes": [c.to_dict() for c in self.causes]}


_ORDER = ("speed", "mtu", "hca", "pcie", "roce", "shaper")


def _ordered(causes: list[Cause], value: float) -> list[Cause]:
    def key(c: Cause):
        binding = c.ceiling is not None and value <= c.ceiling * _BINDING
        return (0 if binding else 1, c.ceiling if binding else 0, _ORDER.index(c.key))
    return sorted(causes, key=key)


def _speed_causes(ends: list[TwinEnd], to_unit: float, full: float) -> list[Cause]:
    """A twin below the port's 200G: the ceiling is what it negotiated."""
    out = []
    for end in ends:
        if end.speed_mbps and end.speed_mbps < spark.PORT_SPEED_MBPS:
            ceiling = min(full, end.speed_mbps / 1000 * to_unit)
            out.append(Cause("speed", f"link negotiated {end.speed_mbps // 1000}G on {end.where} (a Spark's QSFP port "
                                      "runs at 200G: reseat or replace the cable, check the switch port's speed)",
                             f"{end.where}: Speed {end.speed_mbps}Mb/s", ceiling))
    return out[:1] if len({c.ceiling for c in out}) == 1 else out


def _mtu_causes(ends: list[TwinEnd], rdma_mtu: int | None = None) -> list[Cause]:
    out = [Cause("mtu", f"MTU {end.mtu} on {end.where} (the fabric runs {spark.FABRIC_MTU}: rerun bootstrap, "
                        "network.netplan sets it)", f"{end.where}: mtu {end.mtu}")
           for end in ends if end.mtu and end.mtu < spark.FABRIC_MTU]
    if not out and rdma_mtu is not None and rdma_mtu < 4096:
        out.append(Cause("mtu", f"RoCE ran with {rdma_mtu}-byte frames (4096 needs a netdev MTU above 4200)",
                         f"perftest Mtu: {rdma_mtu}[B]"))
    return out


def _pcie_causes(ends: list[TwinEnd], to_unit: float) -> list[Cause]:
    out = []
    for end in ends:
        if end.pcie_width and end.pcie_width < (end.pcie_max_width or spark.TWIN_PCIE_WIDTH):
            ceiling = spark.TWIN_LINE_RATE_GBPS * end.pcie_width / spark.TWIN_PCIE_WIDTH * to_unit
            out.append(Cause("pcie", f"PCIe x{end.pcie_width} on {end.where} (a twin is x{spark.TWIN_PCIE_WIDTH}: "
                                     "update the BIOS/firmware with fwupdmgr; early BIOSes wired it x2)",
                             f"{end.where}: current_link_width {end.pcie_width} of {end.pcie_max_width or '?'}",
                             ceiling))
    return out


def _shaper_causes(ends: list[TwinEnd], to_unit: float, value: float) -> list[Cause]:
    """A rate-limiting qdisc, offered only when the figure sits at or under its rate (it is evidently applying)."""
    return [Cause("shaper", f"a traffic shaper limits {end.where} to {end.shaper_gbps:g} Gb/s "
                            f"(remove it: sudo tc qdisc del dev {end.interface} root)",
                  f"{end.where}: {end.shaper}", end.shaper_gbps * to_unit)
            for end in ends if end.shaper_gbps is not None and value <= end.shaper_gbps * to_unit * _BINDING]


def judge_link(gbps: float | None, method: str, ends: list[TwinEnd], *, rdma_mtu: int | None = None,
               tcp_reason: str | None = None) -> Verdict:
    """One twin's link measured with perftest (method "rdma") or iperf3 ("tcp"), against the twin's line rate."""
    expected = spark.TWIN_LINE_RATE_GBPS
    verdict = Verdict(False, gbps, expected, "Gb/s", "line rate (100 Gb/s per twin)")
    if gbps is None:
        return verdict
    verdict.ok = gbps >= expected * spark.LINK_PASS_FRACTION
    if verdict.ok:
        return verdict
    causes = _speed_causes(ends, 1.0, expected) + _mtu_causes(ends, rdma_mtu) + _pcie_causes(ends, 1.0)
    if method != "rdma":
        causes.append(Cause("roce", f"RoCE not in use: measured over TCP ({tcp_reason or 'no RDMA device'})",
                            tcp_reason or "no RoCE device for this twin"))
    causes += _shaper_causes(ends, 1.0, gbps)
    verdict.causes = _ordered(causes, gbps)
    return verdict


def _hca_causes(node: str, report: NcclReport, cabled: list[str]) -> list[Cause]:
    used = report.ib_device_names
    missing = [dev for dev in cabled if dev not in used]
    if report.uses_ib and used and missing:
        listed = report.env.get("NCCL_IB_HCA", "(unset)")
        return [Cause("hca", f"{', '.join(missing)} missing from NCCL_IB_HCA on {node} (NCCL used {', '.join(used)}: "
                             "one twin is half the port; rerun bootstrap, container.run sets both)",
                      f"{node}: NCCL_IB_HCA={listed}; NET/IB : Using {' '.join(used)}")]
    return []


def _roce_causes(node: str, report: NcclReport) -> list[Cause]:
    if report.network == "Socket" or (report.transports and not report.uses_ib):
        seen = "NET/IB : No device found; Using network Socket" if report.ib_no_device else \
            f"Using network {report.network or 'Socket'}"
        return [Cause("roce", f"RoCE not in use on {node}: NCCL ran over TCP sockets (check NCCL_IB_HCA against "
                              "ibdev2netdev, /dev/infiniband in the container, NCCL_IB_DISABLE)", f"{node}: {seen}")]
    return []


def judge_allreduce(busbw: float | None, topology: str, nodes: int, reports: dict[str, NcclReport],
                    ends: dict[str, list[TwinEnd]], cabled_hcas: dict[str, list[str]]) -> Verdict:
    """An NCCL all-reduce's bus bandwidth (GB/s) against NVIDIA's published figure for Sparks."""
    expected, source = spark.expected_busbw(topology, nodes)
    verdict = Verdict(False, busbw, expected, "GB/s", source)
    if busbw is None:
        return verdict
    verdict.ok = busbw >= expected
    if verdict.ok:
        return verdict
    all_ends = [e for node_ends in ends.values() for e in node_ends]
    full = spark.PORT_SPEED_MBPS / 1000 / 8 * 0.95  # GB/s both twins can carry
    causes = _speed_causes(all_ends, 1 / 8 * 2, full) + _mtu_causes(all_ends) + _pcie_causes(all_ends, 2 / 8)
    for node, report in reports.items():
        causes += _hca_causes(node, report, cabled_hcas.get(node, []))
    for node, report in reports.items():
        causes += _roce_causes(node, report)
    causes += _shaper_causes(all_ends, 2 / 8, busbw)
    verdict.causes = _ordered(causes, busbw)
    return verdict
