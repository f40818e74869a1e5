"""PURE: what `sparkctl top` asks a node each refresh, in ONE script (one round trip on a connection kept open).

Cheap on the node by design (its cost is measured in benchmarks/top.py): the node runs one bash for as long as top
runs (agent_script, started once over the kept connection), which answers a line on its stdin with the sections:
no SSH session, login shell or process per file each refresh. Files under /proc and /sys are read with the shell's
own `read`; `nvidia-smi` runs once in its loop mode (NVML initialised once), its last line kept; docker is asked
only when the controller says so (every CONTAINER_EVERY refreshes; in between, whether the container's PID 1 is
still there is one test of /proc). On the head it also reads the engine's `/metrics` through the gateway with curl,
the key given once on the agent's stdin and passed to curl's stdin (`-H @-`), never a command line.
"""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import urlsplit

from sparkctl.knowledge.nccl import log_lines_script
from sparkctl.plan.render import render
from sparkctl.transport.base import q
from sparkctl.transport.framing import Framing

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
    metrics_url: str | None = None     # the head's engine /metrics through the gateway
    authorized: bool = False           # the key goes on curl's stdin
    nccl_log: str | None = None        # the serve log, when its NCCL lines are wanted this time
    #: with several worlds, the /metrics of each other world whose API server runs here, by its key: read from the
    #: engine itself where it answers (no key: the gateway is not in the way)
    engines: tuple[tuple[str, str], ...] = ()


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
    return "\n".join([*lines, "true"])


#: the line that ends each answer of the agent
END = "@@sparkctl-top-end@@"

def _http_target(url: str) -> tuple[str, int, str]:
    """(IPv4 host, port, path) of an http://host:port/path URL sparkctl made itself (checked: it is put in a script)."""
    parts = urlsplit(url)
    host, port = parts.hostname or "", parts.port or 80
    if parts.scheme != "http" or not host.replace(".", "").isdigit() or not parts.path.startswith("/") or \
            not all(c.isascii() and (c.isalnum() or c in "/_-.") for c in parts.path):
        raise ValueError(f"not a metrics URL top can read: {url!r}")
    return host, int(port), parts.path


def _metrics_call(url: str, *, authorized: bool) -> str:
    """The agent's read of one /metrics (its `_metrics` function), with the key where the gateway wants it."""
    host, port, path = _http_target(url)
    return f"_metrics {q(host)} {int(port)} {q(path)}" + (' "$_auth"' if authorized else "")


def agent_script(read: NodeRead, framing: Framing, interval_s: float) -> str:
    """The node's side of `top` (templates/top-agent.sh.j2), started once (Transport.hold) and ended when its stdin
    closes; each refresh it answers is the sections framed here, then END."""
    sections = [
        framing.section("gpu", """{ IFS= read -r _g < "$_d/gpu" && printf '%s\\n' "$_g"; } 2>/dev/null; true"""),
        framing.section("cpu", 'read -r _l < /proc/stat; echo "$_l"; true'),
        framing.section("mem", "while read -r _k _n _u; do case $_k in MemTotal:|MemAvailable:) "
                               'echo "$_k $_n";; esac; done < /proc/meminfo'),
        framing.section("links", _links(read.twins)),
        framing.section("container", "_container"),
    ]
    metrics = bool(read.metrics_url or read.engines)
    if read.metrics_url:
        sections.append(framing.section("metrics", _metrics_call(read.metrics_url, authorized=True)))
    for key, url in read.engines:
        sections.append(framing.section(f"metrics--{key}", _metrics_call(url, authorized=False)))
    if read.nccl_log:
        nccl = log_lines_script(q(read.nccl_log), 2000)
        sections.append(framing.section("nccl", f"case $_ask in *n*) {nccl};; esac"))
    return render("top-agent.sh.j2", loop_ms=max(100, int(interval_s * 1000)),
                  container=read.container, metrics=metrics, sections="\n".join(sections), end=END)
