"""PURE readings of a node's live figures (for `sparkctl top`): the GPU from nvidia-smi's query, CPU and memory from
/proc, every fabric twin's bytes, errors and drops from its netdev counters and, where the twin has a RoCE device,
from the device's port counters (RDMA traffic bypasses the netdev's), and rates between two readings.

Sources of the formats:
- `nvidia-smi --query-gpu=utilization.gpu,memory.used,memory.total,temperature.gpu,power.draw
  --format=csv,noheader,nounits` (nvidia-smi(1), "--query-gpu"); on a DGX Spark the GB10 shares system memory and
  NVML answers NOT_SUPPORTED for its memory (forums.developer.nvidia.com/t/358869), so the memory fields read
  `[N/A]` and the unified memory is read from /proc/meminfo.
- /proc/stat's first `cpu` line and /proc/meminfo's MemTotal/MemAvailable (proc(5)).
- /sys/class/net/<if>/statistics/{rx,tx}_{bytes,errors,dropped} (Documentation/ABI/testing/sysfs-class-net-statistics).
- /sys/class/infiniband/<dev>/ports/<port>/counters/port_{rcv,xmit}_data: "the total number of data octets, divided
  by 4" (Documentation/ABI/stable/sysfs-class-infiniband), so bytes are 4 x the value.
"""

from __future__ import annotations

from dataclasses import dataclass

#: port_rcv_data and port_xmit_data count 4-octet words
ROCE_WORD_BYTES = 4
_MISSING = ("[N/A]", "[Not Supported]", "N/A", "")


@dataclass(frozen=True)
class GpuSample:
    util_pct: float | None
    mem_used_mib: float | None   # None on a Spark: unified memory (see MemInfo)
    mem_total_mib: float | None
    temp_c: float | None
    power_w: float | None


def _number(text: str) -> float | None:
    text = text.strip()
    if text in _MISSING:
        return None
    try:
        return float(text.split()[0])
    except (ValueError, IndexError):
        return None


def parse_gpu_query(line: str) -> GpuSample | None:
    """One GPU's line of the query above (noheader, nounits); None when it is not one."""
    parts = [p.strip() for p in line.split(",")]
    if len(parts) != 5:
        return None
    util, used, total, temp, power = (_number(p) for p in parts)
    return GpuSample(util, used, total, temp, power)


@dataclass(frozen=True)
class CpuTimes:
    busy: int   # jiffies not idle or iowait
    total: int

    def percent_since(self, before: CpuTimes) -> float | None:
        """Busy share of all CPUs since `before`, 0-100."""
        span = self.total - before.total
        return None if span <= 0 else 100.0 * (self.busy - before.busy) / span


def parse_proc_stat(text: str) -> CpuTimes | None:
    for line in text.splitlines():
        fields = line.split()
        if fields and fields[0] == "cpu":
            values = [int(v) for v in fields[1:]]
            idle = values[3] + (values[4] if len(values) > 4 else 0)  # idle + iowait
            # guest time is already in user/nice (proc(5)): only the first eight fields add up to the total
            total = sum(values[:8])
            return CpuTimes(total - idle, total)
    return None


@dataclass(frozen=True)
class MemInfo:
    total_kib: int
    available_kib: int

    @property
    def used_kib(self) -> int:
        return self.total_kib - self.available_kib


def parse_meminfo(text: str) -> MemInfo | None:
    values = {}
    for line in text.splitlines():
        key, _, rest = line.partition(":")
        if key in ("MemTotal", "MemAvailable") and rest.split():
            values[key] = int(rest.split()[0])
    if "MemTotal" not in values or "MemAvailable" not in values:
        return None
    return MemInfo(values["MemTotal"], values["MemAvailable"])


@dataclass(frozen=True)
class LinkCounters:
    rx_bytes: int
    tx_bytes: int
    errors: int      # rx + tx errors
    dropped: int     # rx + tx drops
    rdma: bool       # the bytes are the RoCE port's (RDMA included), else the netdev's


def parse_link_lines(text: str) -> dict[str, LinkCounters]:
    """Lines `netdev <if> rx_bytes tx_bytes rx_errors tx_errors rx_dropped tx_dropped` and `roce <if> rcv_words
    xmit_words` (as the top read prints them): per interface, the RoCE port's bytes where it has them."""
    netdev: dict[str, list[int]] = {}
    roce: dict[str, tuple[int, int]] = {}
    for line in text.splitlines():
        parts = line.split()
        try:
            if len(parts) == 8 and parts[0] == "netdev":
                netdev[parts[1]] = [int(v) for v in parts[2:]]
            elif len(parts) == 4 and parts[0] == "roce":
                roce[parts[1]] = (int(parts[2]) * ROCE_WORD_BYTES, int(parts[3]) * ROCE_WORD_BYTES)
        except ValueError:
            continue
    out = {}
    for iface, (rx, tx, rx_err, tx_err, rx_drop, tx_drop) in netdev.items():
        rdma = iface in roce
        rx, tx = roce[iface] if rdma else (rx, tx)
        out[iface] = LinkCounters(rx, tx, rx_err + tx_err, rx_drop + tx_drop, rdma)
    return out


@dataclass(frozen=True)
class LinkRate:
    rx_gbps: float
    tx_gbps: float
    new_errors: int
    new_drops: int
    rdma: bool


def link_rate(before: LinkCounters, now: LinkCounters, seconds: float) -> LinkRate | None:
    """Gb/s each way and the errors and drops since `before`; None when the counters restarted (a reset link, a
    reloaded driver) or no time passed."""
    if seconds <= 0 or now.rx_bytes < before.rx_bytes or now.tx_bytes < before.tx_bytes or before.rdma != now.rdma:
        return None
    return LinkRate((now.rx_bytes - before.rx_bytes) * 8 / seconds / 1e9,
                    (now.tx_bytes - before.tx_bytes) * 8 / seconds / 1e9,
                    max(0, now.errors - before.errors), max(0, now.dropped - before.dropped), now.rdma)
