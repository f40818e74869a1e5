"""perftest's output (`ib_write_bw`, `ib_write_lat`), read: the test's header and its result rows.

The layout is perftest's own (linux-rdma/perftest src/perftest_parameters.h: RESULT_FMT, RESULT_FMT_G,
RESULT_FMT_LAT, REPORT_FMT*; the header from ctx_print_test_info); the fixtures in tests/fixtures/perftest/ are
real captured runs. Bandwidth units: `--report_gbits` prints Gb/sec; without it older releases print MB/sec
(10^6 bytes) and 6.x releases MiB/sec.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

_TITLE = re.compile(r"^\s+(?P<verb>RDMA_Write|RDMA_Read|Send|Atomic \S+)(?: Bidirectional)?(?: Post List)? "
                    r"(?P<kind>BW|Latency) Test\s*$")
_FIELD = re.compile(r"(?P<key>Device|Link type|GID index|Mtu|rdma_cm QPs|Number of qps)\s*:\s*(?P<value>[^\t\n]+)")
_BW_HEADER = re.compile(r"#bytes\s+#iterations\s+BW peak\[(?P<unit>[A-Za-z]+/sec)\]\s+BW average")
_LAT_HEADER = re.compile(r"#bytes\s+#iterations\s+t_min\[usec\]")
_NUMBER_ROW = re.compile(r"^\s*\d+\s+\d+(\s+[\d.]+)+\s*$")
#: Lines perftest prints when it refuses or fails (src/*.c fprintf(stderr, ...)).
_ERRORS = re.compile(r"(IB device \S+ not found|No IB devices found|Unable to find the Infiniband/RoCE device|"
                     r"Did not detect devices|Couldn't connect to \S+|Unable to init the socket connection|"
                     r"Failed to exchange data between server and clients|Invalid Command( line| or flag)\.?|"
                     r"Couldn't get context for the device|Unable to Connect the HCA's through the link|"
                     r"unrecognized option \S+|Unable to create RDMA_CM resources|Found Incompatibility issue with GID "
                     r"types)")

#: Gb/s per unit of each bandwidth column.
_GBITS_PER_UNIT = {"Gb/sec": 1.0, "MB/sec": 8e6 / 1e9, "MiB/sec": 8 * 1048576 / 1e9}


@dataclass
class BwRow:
    bytes: int
    iterations: int
    peak: float
    average: float
    msg_rate_mpps: float | None


@dataclass
class LatRow:
    bytes: int
    iterations: int
    t_min: float
    t_max: float
    t_typical: float
    t_avg: float
    t_stdev: float | None = None
    p99: float | None = None
    p999: float | None = None


@dataclass
class PerftestReport:
    test: str | None = None  # "RDMA_Write BW" | "RDMA_Write Latency"
    device: str | None = None
    link_type: str | None = None  # "Ethernet" (RoCE) | "IB"
    gid_index: int | None = None
    mtu: int | None = None
    rdma_cm: bool | None = None
    unit: str | None = None
    bw_rows: list[BwRow] = field(default_factory=list)
    lat_rows: list[LatRow] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    @property
    def bw_gbps(self) -> float | None:
        """Average bandwidth of the largest message size, in Gb/s."""
        if not self.bw_rows or self.unit not in _GBITS_PER_UNIT:
            return None
        row = max(self.bw_rows, key=lambda r: r.bytes)
        return row.average * _GBITS_PER_UNIT[self.unit]

    @property
    def latency_us(self) -> float | None:
        """Typical (median) one-way latency of the smallest message, in microseconds."""
        if not self.lat_rows:
            return None
        return min(self.lat_rows, key=lambda r: r.bytes).t_typical


def _floats(line: str) -> list[float]:
    return [float(v) for v in line.split()]


def parse_perftest(text: str) -> PerftestReport:
    report = PerftestReport()
    table: str | None = None
    for line in text.splitlines():
        if m := _TITLE.match(line):
            report.test = report.test or f"{m['verb']} {m['kind']}"
            continue
        for f in _FIELD.finditer(line):
            key, value = f["key"], f["value"].strip()
            if key == "Device" and report.device is None:
                report.device = value
            elif key == "Link type":
                report.link_type = value
            elif key == "GID index" and value.isdigit():
                report.gid_index = int(value)
            elif key == "Mtu" and (mtu := re.match(r"(\d+)", value)):
                report.mtu = int(mtu.group(1))
            elif key == "rdma_cm QPs":
                report.rdma_cm = value.upper().startswith("ON")
        if m := _BW_HEADER.search(line):
            table, report.unit = "bw", m["unit"]
            continue
        if _LAT_HEADER.search(line):
            table = "lat"
            continue
        if m := _ERRORS.search(line):
            if m.group(0) not in report.errors:
                report.errors.append(m.group(0))
            continue
        if table and _NUMBER_ROW.match(line):
            values = _floats(line)
            if table == "bw" and len(values) >= 4:
                report.bw_rows.append(BwRow(int(values[0]), int(values[1]), values[2], values[3],
                                            values[4] if len(values) > 4 else None))
            elif table == "lat" and len(values) >= 6:
                extra = values[6:] + [None] * 3
                report.lat_rows.append(LatRow(int(values[0]), int(values[1]), *values[2:6], *extra[:3]))
    return report
