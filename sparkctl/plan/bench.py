"""PURE: what `fabric bench` measures and the command lines it runs: the links (each twin of each cable; on a
switch, each node to the head and a ring of peers), rounds in which no physical port carries two measurements,
the per-node probe, perftest / iperf3 server and client lines, and the NCCL all-reduce in the containers.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass

from sparkctl.inventory import Inventory
from sparkctl.knowledge.spark import spark_port_of
from sparkctl.plan.fabric import FabricPlan
from sparkctl.plan.mpi import mpirun_line
from sparkctl.plan.render import render
from sparkctl.transport.base import q

#: perftest's default port is 18515 (linux-rdma/perftest README); iperf3's is 5201. One port per link of a round.
PERFTEST_PORT = 18515
IPERF3_PORT = 5201
BW_SECONDS = 2
IPERF3_SECONDS = 3
#: all_reduce_perf's -f (size factor), -n (iterations) and -w (warm-up iterations)
NCCL_FACTOR = 2
NCCL_ITERS = 5
NCCL_WARMUP = 1
#: Where nccl-tests' all_reduce_perf may sit in an image (NVIDIA's NCCL playbook builds it in ~/nccl-tests/build).
ALL_REDUCE_PERF_PATHS = ("all_reduce_perf", "/usr/local/bin/all_reduce_perf", "/opt/nccl-tests/build/all_reduce_perf",
                         "/workspace/nccl-tests/build/all_reduce_perf", "/root/nccl-tests/build/all_reduce_perf")
NCCL_DEBUG_ENV = {"NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "INIT,NET,ENV"}
TOOLS = ("ib_write_bw", "ib_write_lat", "iperf3")


@dataclass(frozen=True)
class BenchLink:
    """One twin's path from a client node to a server node, both ends on one subnet."""

    client: str
    client_if: str
    client_ip: str
    server: str
    server_if: str
    server_ip: str

    @property
    def key(self) -> str:
        return f"{self.client} {self.client_if} -> {self.server} {self.server_if}"

    def ports(self) -> set[tuple[str, str]]:
        """The physical ports the measurement occupies (a twin's port; its name when it is not a Spark name)."""
        return {(node, str(where[0]) if (where := spark_port_of(iface)) else iface)
                for node, iface in ((self.client, self.client_if), (self.server, self.server_if))}


def node_pairs(inventory: Inventory) -> list[tuple[str, str]]:
    """(client, server) pairs: each cable of a pair or ring; on a switch the head to each node, and a ring."""
    names = [n.name for n in inventory.nodes]
    if len(names) < 2:
        return []
    if inventory.topology == "pair":
        return [(names[0], names[1])]
    ring = [(names[i], names[(i + 1) % len(names)]) for i in range(len(names))]
    if inventory.topology == "ring":
        return ring
    pairs = [(names[0], other) for other in names[1:]]
    seen = {frozenset(p) for p in pairs}
    for a, b in ring:
        if frozenset((a, b)) not in seen:
            seen.add(frozenset((a, b)))
            pairs.append((a, b))
    return pairs


def bench_links(inventory: Inventory, plan: FabricPlan) -> list[BenchLink]:
    out = []
    for client, server in node_pairs(inventory):
        theirs = plan.addresses.get(server, {})
        for iface in plan.ports[client].interfaces:
            mine = plan.addresses.get(client, {}).get(iface)
            if mine is None:
                continue
            for server_if, addr in theirs.items():
                if addr.network == mine.network:
                    out.append(BenchLink(client, iface, str(mine.ip), server, server_if, str(addr.ip)))
                    break
    return out


def rounds(links: list[BenchLink]) -> list[list[BenchLink]]:
    """Greedy rounds: links in one round share no physical port (twins of one port share it)."""
    out: list[tuple[set, list[BenchLink]]] = []
    for link in links:
        for busy, members in out:
            if not busy & link.ports():
                busy |= link.ports()
                members.append(link)
                break
        else:
            out.append((set(link.ports()), [link]))
    return [members for _, members in out]


def gid_of(ip: str) -> str:
    """The IPv4-mapped GID of an address as sysfs prints it (`0000:...:ffff:c0a8:640a`)."""
    packed = ipaddress.IPv4Address(ip).packed
    return "0000:0000:0000:0000:0000:ffff:" + f"{packed[0]:02x}{packed[1]:02x}:{packed[2]:02x}{packed[3]:02x}"


def probe_script(interfaces: dict[str, str]) -> str:
    """Per fabric twin (name -> IPv4): PCIe width, qdisc, the RoCE v2 GID index of its address; the tools present.
    One `key value` line each, prefixed by the interface."""
    twins = [{"interface": iface, "gid": gid_of(ip)} for iface, ip in interfaces.items()]
    return render("bench-probe.sh.j2", tools=TOOLS, twins=twins)


@dataclass
class ProbeResult:
    tools: set[str]
    width: dict[str, int]
    max_width: dict[str, int]
    qdisc: dict[str, str]
    gid: dict[str, int]


def parse_probe(text: str) -> ProbeResult:
    out = ProbeResult(set(), {}, {}, {}, {})
    for line in text.splitlines():
        parts = line.split(" ", 2)
        if len(parts) == 2 and parts[0] == "tool":
            out.tools.add(parts[1])
            continue
        if len(parts) < 3:
            continue
        iface, key, value = parts[0], parts[1], parts[2].strip()
        if key in ("width", "maxwidth", "gid") and value.isdigit():
            {"width": out.width, "maxwidth": out.max_width, "gid": out.gid}[key][iface] = int(value)
        elif key == "qdisc":
            out.qdisc[iface] = value.replace(";", "\n").strip()
    return out


def perftest_line(tool: str, device: str, gid: int | None, port: int, server_ip: str | None = None) -> str:
    """`ib_write_bw`/`ib_write_lat` on one RoCE device: the twin's IPv4 RoCE v2 GID index, else RDMA-CM (-R)."""
    addressing = f"-x {int(gid)}" if gid is not None else "-R"
    extra = f" --report_gbits -D {BW_SECONDS}" if tool == "ib_write_bw" else ""
    target = f" {q(server_ip)}" if server_ip else ""
    return f"{tool} -d {q(device)} {addressing} -p {int(port)} -F{extra}{target}"


def link_settings(method: str) -> dict:
    """What changes a link's figure besides the link, recorded with it (only like figures are compared)."""
    if method == "rdma":
        return {"tool": "ib_write_bw", "seconds": BW_SECONDS}
    if method == "tcp":
        return {"tool": "iperf3", "seconds": IPERF3_SECONDS}
    return {}


def size_bytes(size: str) -> int | str:
    """nccl-tests' size argument (`1M`, `256M`, `1G`, a byte count) in bytes, so 1M and 1048576 compare alike."""
    scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(size[-1:].upper(), 1)
    digits = size[:-1] if scale != 1 else size
    return int(digits) * scale if digits.isdigit() else size


def nccl_settings(min_bytes: str, max_bytes: str, nodes: list[str]) -> dict:
    """What changes the all-reduce's bus bandwidth besides the fabric, recorded with it."""
    return {"min": size_bytes(min_bytes), "max": size_bytes(max_bytes), "factor": NCCL_FACTOR, "iters": NCCL_ITERS,
            "warmup": NCCL_WARMUP, "nodes": list(nodes)}


def iperf3_server(server_ip: str, port: int) -> str:
    return f"iperf3 -s -1 -B {q(server_ip)} -p {int(port)} -J"


def iperf3_client(server_ip: str, client_ip: str, port: int) -> str:
    return f"iperf3 -c {q(server_ip)} -B {q(client_ip)} -p {int(port)} -t {IPERF3_SECONDS} -J"


def background(command: str, port: int, seconds: int = 60) -> str:
    """Start a server detached, its output in a temp file; print `pid file`, then wait (<= 3 s) for its port."""
    return (f'f=$(mktemp /tmp/sparkctl-bench.XXXXXX) || exit 1\n'
            f'setsid timeout {int(seconds)} {command} >"$f" 2>&1 </dev/null &\n'
            f'echo "$! $f"\n'
            f'for i in $(seq 30); do ss -ltnH "sport = :{int(port)}" 2>/dev/null | grep -q . && break; sleep 0.1; done')


def collect(pid: int, path: str, seconds: int = 15) -> str:
    """Wait for a background server to finish (then stop it), print its output and remove the file."""
    p, f = int(pid), q(path)
    return (f"for i in $(seq {int(seconds) * 10}); do kill -0 {p} 2>/dev/null || break; sleep 0.1; done\n"
            f"kill {p} 2>/dev/null; cat {f} 2>/dev/null; rm -f {f}")


def all_reduce_script(ranks: int, min_bytes: str, max_bytes: str, path: str | None = None) -> str:
    """In the head container: find all_reduce_perf, then run it on every node through sparkctl's mpirun line."""
    candidates = (path,) if path else ALL_REDUCE_PERF_PATHS
    find = " ".join(q(c) for c in candidates)
    program = (f'"$p" -b {q(min_bytes)} -e {q(max_bytes)} -f {NCCL_FACTOR} -g 1 -n {NCCL_ITERS} '
               f'-w {NCCL_WARMUP}')
    return (f"p=; for c in {find}; do p=$(command -v \"$c\" 2>/dev/null) && break; done\n"
            f'[ -n "$p" ] || {{ echo "@@no-all-reduce-perf@@"; exit 0; }}\n'
            f"{mpirun_line(ranks, program, env=NCCL_DEBUG_ENV)} 2>&1")
