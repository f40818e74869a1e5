"""iperf3's JSON report (`iperf3 -J`), read: what the receiver got, retransmits, or the error.

Keys as iperf3 writes them (esnet/iperf src/iperf_api.c: "start", "end"."sum_sent"/"sum_received"
."bits_per_second", "retransmits", top-level "error"); a real captured report is tests/fixtures/iperf3/.
"""

from __future__ import annotations

import json
from dataclasses import dataclass


@dataclass
class IperfReport:
    sent_gbps: float | None = None
    received_gbps: float | None = None
    retransmits: int | None = None
    seconds: float | None = None
    local: str | None = None
    remote: str | None = None
    version: str | None = None
    error: str | None = None

    @property
    def gbps(self) -> float | None:
        return self.received_gbps if self.received_gbps is not None else self.sent_gbps


def parse_iperf3_json(text: str) -> IperfReport:
    """An unreadable report is an error report, never an exception: iperf3 may die before its JSON is whole."""
    start = text.find("{")
    try:
        data = json.loads(text[start:]) if start >= 0 else None
    except json.JSONDecodeError:
        data = None
    if not isinstance(data, dict):
        tail = text.strip().splitlines()[-1:] or ["no output"]
        return IperfReport(error=f"no iperf3 JSON report ({tail[0][:200]})")
    report = IperfReport(error=data.get("error"))
    begin = data.get("start") or {}
    report.version = begin.get("version")
    connected = (begin.get("connected") or [{}])[0] if begin.get("connected") else {}
    report.local, report.remote = connected.get("local_host"), connected.get("remote_host")
    end = data.get("end") or {}
    sent, received = end.get("sum_sent") or {}, end.get("sum_received") or {}
    if "bits_per_second" in sent:
        report.sent_gbps = sent["bits_per_second"] / 1e9
        report.retransmits = sent.get("retransmits")
        report.seconds = sent.get("seconds")
    if "bits_per_second" in received:
        report.received_gbps = received["bits_per_second"] / 1e9
    return report
