"""nccl-tests' output (`all_reduce_perf` and friends), read: the ranks and devices, the result rows, the average
bus bandwidth, out-of-bounds values.

The layout is nccl-tests' own (NVIDIA/nccl-tests src/util.cu: writeDeviceReport, writeResultHeader,
writeBenchmarkLine*, writeResultFooter); the fixtures in tests/fixtures/nccl-tests/ are real runs, two of them
between two DGX Sparks.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

_VERSION = re.compile(r"^# nccl-tests version (?P<v>\S+)")
_STARTING = re.compile(r"^# Collective test starting: (?P<name>\S+)")
_RANK = re.compile(r"^#\s+Rank\s+(?P<rank>\d+) Group\s+\d+ Pid\s+\d+ on\s+(?P<host>\S+) device\s+(?P<dev>\d+) "
                   r"\[(?P<bus>[^\]]*)\] (?P<name>.*?)\s*$")
_ROW = re.compile(r"^\s*(?P<size>\d+)\s+(?P<count>\d+)\s+(?P<type>\w+)\s+(?P<redop>\w+)\s+(?P<root>-?\d+)\s+"
                  r"(?P<rest>.*)$")
_AVG = re.compile(r"^# Avg bus bandwidth\s*: (?P<bw>[\d.eE+-]+)")
_OOB = re.compile(r"^# Out of bounds values\s*: (?P<n>\d+) (?P<ok>OK|FAILED)")


@dataclass
class RankInfo:
    rank: int
    host: str
    device: int
    name: str


@dataclass
class ResultRow:
    size: int
    count: int
    type: str
    redop: str
    oop_time_us: float | None
    oop_algbw: float | None
    oop_busbw: float | None
    ip_time_us: float | None = None
    ip_algbw: float | None = None
    ip_busbw: float | None = None
    wrong: int = 0

    @property
    def busbw(self) -> float | None:
        values = [v for v in (self.oop_busbw, self.ip_busbw) if v is not None]
        return max(values) if values else None


@dataclass
class NcclTestsReport:
    version: str | None = None
    collective: str | None = None
    ranks: list[RankInfo] = field(default_factory=list)
    rows: list[ResultRow] = field(default_factory=list)
    avg_busbw: float | None = None
    out_of_bounds: int | None = None
    errors: list[str] = field(default_factory=list)

    @property
    def peak_busbw(self) -> float | None:
        """The best bus bandwidth of any size (GB/s): the figure to hold against the hardware's."""
        values = [bw for r in self.rows if (bw := r.busbw) is not None]
        return max(values) if values else None

    @property
    def completed(self) -> bool:
        return self.avg_busbw is not None


def _number(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None  # nccl-tests prints N/A for #wrong without validation


def parse_nccl_tests(text: str) -> NcclTestsReport:
    report = NcclTestsReport()
    for line in text.splitlines():
        if m := _VERSION.match(line):
            report.version = m["v"]
        elif m := _STARTING.match(line):
            report.collective = m["name"]
        elif m := _RANK.match(line):
            report.ranks.append(RankInfo(int(m["rank"]), m["host"], int(m["dev"]), m["name"]))
        elif m := _AVG.match(line):
            report.avg_busbw = float(m["bw"])
        elif m := _OOB.match(line):
            report.out_of_bounds = int(m["n"])
        elif line.startswith("# error:"):
            report.errors.append(line[len("# error:"):].strip())
        elif not line.startswith("#") and (m := _ROW.match(line)):
            values = [_number(v) for v in m["rest"].split()]
            values += [None] * (8 - len(values))
            wrong = [int(v) for v in (values[3], values[7]) if v is not None]
            report.rows.append(ResultRow(int(m["size"]), int(m["count"]), m["type"], m["redop"], values[0],
                                         values[1], values[2], values[4], values[5], values[6], sum(wrong)))
    return report
