"""PURE: what `sparkctl top` asks a node each refresh, in ONE script (one round trip on a connection kept open).

Cheap on the node by design (its cost is measured in benchmarks/top.py): files under /proc and /sys read with the
shell's own `read` where it can, one `nvidia-smi` query, and docker asked only every CONTAINER_EVERY refreshes (in
between, whether the container's PID 1 is still there is one test of /proc). On the head it also reads the engine's
`/metrics` through the gateway with curl, the key on curl's stdin (`-H @-`), never its command line.
"""

from __future__ import annotations

from dataclasses import dataclass

from sparkctl.transport.base import q
from sparkctl.transport.framing import Framing

#: nvidia-smi(1) --query-gpu fields, in the order knowledge/node_metrics.parse_gpu_query reads them
GPU_QUERY = ("nvidia-smi --query-gpu=utilization.gpu,memory.used,memory.total,temperature.gpu,power.draw "
             "--format=csv,noheader,nounits")
#: docker inspect is the expensive read (a CLI start and a daemon round trip): once every this many refreshes
CONTAINER_EVERY = 15
#: the serve log's NCCL lines (which twins the world runs on) change only when the server restarts
NCCL_EVERY = 30
NETDEV_FIELDS = ("rx_bytes", "tx_bytes", "rx_errors", "tx_errors", "rx_dropped", "tx_dropped")


@dataclass(frozen=True)
class Twin:
    interface: str
    device: str | None   # its RoCE device, whose port counters count the RDMA bytes too
    port: int = 1


@dataclass(frozen=True)
class NodeRead:
    """What one node's script reads."""
    twins: tuple[Twin, ...]
    container: str
    container_pid: int | None          # from the last docker read; None: ask docker this time
    metrics_url: str | None = None     # the head's engine /metrics through the gateway
    authorized: bool = False           # the key goes on curl's stdin
    nccl_log: str | None = None        # the serve log, when its NCCL lines are wanted this time


def _cat(path: str) -> str:
    """One line of a sysfs file with the shell's `read` (no process), `x` when it cannot be read."""
    return f"{{ read -r _v < {q(path)} 2>/dev/null && printf ' %s' \"$_v\" || printf ' x'; }}"


def _links(twins: tuple[Twin, ...]) -> str:
    lines = []
    for twin in twins:
        stats = f"/sys/class/net/{twin.interface}/statistics"
        lines.append(f"printf 'netdev %s' {q(twin.interface)}; "
                     + "; ".join(_cat(f"{stats}/{name}") for name in NETDEV_FIELDS) + "; echo")
        if twin.device:
            counters = f"/sys/class/infiniband/{twin.device}/ports/{int(twin.port)}/counters"
            lines.append(f"if [ -r {q(counters + '/port_rcv_data')} ]; then printf 'roce %s' {q(twin.interface)}; "
                         f"{_cat(counters + '/port_rcv_data')}; {_cat(counters + '/port_xmit_data')}; echo; fi")
    return "\n".join(lines) or "true"


def node_script(read: NodeRead, framing: Framing) -> str:
    container = (f"[ -d /proc/{int(read.container_pid)} ] && echo 'running {int(read.container_pid)}' || "
                 "echo 'gone 0'" if read.container_pid else
                 f"docker inspect -f '{{{{.State.Status}}}} {{{{.State.Pid}}}}' {q(read.container)} 2>/dev/null "
                 "|| echo 'absent 0'")
    sections = [
        framing.section("gpu", f"{GPU_QUERY} 2>/dev/null | head -n 1"),
        framing.section("cpu", "{ read -r _l < /proc/stat; echo \"$_l\"; }"),
        framing.section("mem", "while read -r _k _n _u; do case $_k in MemTotal:|MemAvailable:) "
                               "echo \"$_k $_n\";; esac; done < /proc/meminfo"),
        framing.section("links", _links(read.twins)),
        framing.section("container", container),
    ]
    if read.metrics_url:
        header = "-H @- " if read.authorized else ""
        sections.append(framing.section("metrics", f"curl -sS -m 3 --noproxy '*' {header}"
                                                   f"-w '\\n%{{http_code}}\\n' {q(read.metrics_url)}"))
    if read.nccl_log:
        sections.append(framing.section("nccl", f"grep -E 'NCCL|NET/' {q(read.nccl_log)} 2>/dev/null | "
                                                "tail -n 2000"))
    return "\n".join([*sections, "true"])
