"""`sparkctl fabric bench` end to end: per link RDMA write bandwidth and latency (perftest on the twin's RoCE device,
server on one end, client on the other) or TCP (iperf3) where RDMA cannot run, in rounds that share no port; an
NCCL all-reduce across the containers; verdicts against the Spark's figures; the figures recorded per cluster."""

from __future__ import annotations

import re
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime, timezone

from sparkctl.errors import BadInput, SparkctlError, Unreachable
from sparkctl.facts import Facts
from sparkctl.inventory import Inventory
from sparkctl.knowledge.fabric_verdict import TwinEnd, judge_allreduce, judge_link, parse_shaper
from sparkctl.knowledge.iperf3 import parse_iperf3_json
from sparkctl.knowledge.nccl import NcclReport, parse_nccl_log
from sparkctl.knowledge.nccl_tests import parse_nccl_tests
from sparkctl.knowledge.perftest import parse_perftest
from sparkctl.plan import PlanError, plan_cluster
from sparkctl.plan.bench import (
    IPERF3_PORT,
    PERFTEST_PORT,
    BenchLink,
    ProbeResult,
    all_reduce_script,
    background,
    bench_links,
    collect,
    iperf3_client,
    iperf3_server,
    link_settings,
    nccl_settings,
    parse_probe,
    perftest_line,
    probe_script,
    rounds,
)
from sparkctl.plan.fabric import FabricPlan
from sparkctl.runs.bench_records import record_bench
from sparkctl.runs.nccl_tests_build import build_all_reduce_perf
from sparkctl.runs.session import Session
from sparkctl.taskgraph.runner import DEFAULT_FORKS
from sparkctl.transport.base import q

CLIENT_TIMEOUT = 90.0
NCCL_TIMEOUT = 600.0
_TAG = re.compile(r"^\[\d+,(?P<rank>\d+)\]<std(?:out|err)>:(?P<line>.*)$", re.M)
_BACKGROUND = re.compile(r"^(?P<pid>\d+) (?P<path>/tmp/sparkctl-bench\.\S+)$", re.M)


@dataclass
class BenchRequest:
    forks: int = DEFAULT_FORKS
    links: bool = True
    nccl: bool = True
    tcp: bool = False  # measure every link with iperf3 even where RDMA could run
    nccl_min: str = "1M"
    nccl_max: str = "256M"
    all_reduce_perf: str | None = None  # its path inside the containers, when not on PATH or a usual place
    record: bool = True


class BenchRun:
    """One bench over an open session: what it read of the nodes, and each measurement."""

    def __init__(self, inventory: Inventory, session: Session, facts: dict[str, Facts], plan: FabricPlan,
                 request: BenchRequest, progress: Callable[[str], None]):
        self.inventory, self.session, self.facts, self.plan = inventory, session, facts, plan
        self.request, self.progress = request, progress
        self.probes: dict[str, ProbeResult] = {}

    # --- what the nodes report --------------------------------------------------------------------------------
    def read_probes(self) -> None:
        def one(node: str) -> tuple[str, ProbeResult]:
            interfaces = {i: str(a.ip) for i, a in self.plan.addresses.get(node, {}).items()}
            result = self.session.transports[node].run(probe_script(interfaces), timeout=30)
            return node, parse_probe(result.stdout)
        with ThreadPoolExecutor(max_workers=max(1, min(self.request.forks, len(self.facts)))) as pool:
            self.probes = dict(pool.map(one, list(self.facts)))

    def end(self, node: str, iface: str) -> TwinEnd:
        facts, probe = self.facts.get(node), self.probes.get(node)
        nic = facts.interfaces.get(iface) if facts else None
        shaper = parse_shaper(probe.qdisc.get(iface, "")) if probe else None
        return TwinEnd(node, iface, speed_mbps=nic.speed_mbps if nic else None, mtu=nic.mtu if nic else None,
                       pcie_width=probe.width.get(iface) if probe else None,
                       pcie_max_width=probe.max_width.get(iface) if probe else None,
                       shaper=shaper[0] if shaper else None, shaper_gbps=shaper[1] if shaper else None)

    # --- one link -----------------------------------------------------------------------------------------------
    def method(self, link: BenchLink) -> tuple[str, str | None]:
        """("rdma", None) | ("tcp", why not RDMA) | ("none", why nothing)."""
        why = None
        for node, iface in ((link.client, link.client_if), (link.server, link.server_if)):
            tools = self.probes[node].tools
            if self.request.tcp:
                why = why or "--tcp asked for TCP"
            elif self.facts[node].roce_for(iface) is None:
                why = why or f"no RDMA device for {iface} on {node} (ibdev2netdev lists none)"
            elif not {"ib_write_bw", "ib_write_lat"} <= tools:
                why = why or f"perftest is not installed on {node} (sudo apt install perftest)"
        if why is None:
            return "rdma", None
        missing = [n for n in (link.client, link.server) if "iperf3" not in self.probes[n].tools]
        if missing:
            return "none", f"{why}; iperf3 is not installed on {', '.join(missing)} either (sudo apt install iperf3)"
        return "tcp", why

    def _serve_and_run(self, link: BenchLink, server_cmd: str, client_cmd: str, port: int) -> tuple[str, str]:
        server, client = self.session.transports[link.server], self.session.transports[link.client]
        started = server.run(background(server_cmd, port), timeout=30)
        found = _BACKGROUND.search(started.stdout)
        if not found:
            return "", (started.stdout + started.stderr).strip() or "the server did not start"
        ran = client.run(f"timeout {int(CLIENT_TIMEOUT - 10)} {client_cmd} 2>&1", timeout=CLIENT_TIMEOUT)
        served = server.run(collect(int(found["pid"]), found["path"]), timeout=30)
        return ran.stdout + ran.stderr, served.stdout

    def measure(self, link: BenchLink, slot: int) -> dict:
        method, why = self.method(link)
        out: dict = {"key": link.key, "client": link.client, "client_if": link.client_if, "server": link.server,
                     "server_if": link.server_if, "method": method, "why_not_rdma": why, "gbps": None,
                     "settings": link_settings(method), "latency_us": None, "error": None}
        rdma_mtu = None
        if method == "rdma":
            out.update(self._rdma(link, slot))
            rdma_mtu = out.pop("rdma_mtu", None)
        elif method == "tcp":
            client_out, _ = self._serve_and_run(link, iperf3_server(link.server_ip, IPERF3_PORT + slot),
                                                iperf3_client(link.server_ip, link.client_ip, IPERF3_PORT + slot),
                                                IPERF3_PORT + slot)
            report = parse_iperf3_json(client_out)
            out["gbps"], out["error"] = report.gbps, report.error
        else:
            out["error"] = why
        verdict = judge_link(out["gbps"], method, [self.end(link.client, link.client_if),
                                                   self.end(link.server, link.server_if)],
                             rdma_mtu=rdma_mtu, tcp_reason=why)
        out["verdict"] = verdict.to_dict()
        out["summary"] = verdict.summary() if out["gbps"] is not None else f"not measured: {out['error']}"
        self.progress(f"{link.key}: {_figure(out['gbps'], 'Gb/s')} ({method}): {out['summary']}")
        return out

    def _rdma(self, link: BenchLink, slot: int) -> dict:
        roce_c = self.facts[link.client].roce_for(link.client_if)
        roce_s = self.facts[link.server].roce_for(link.server_if)
        assert roce_c is not None and roce_s is not None  # method() chose RDMA: both ends have a device
        dev_c, dev_s = roce_c.device, roce_s.device
        gid_c = self.probes[link.client].gid.get(link.client_if)
        gid_s = self.probes[link.server].gid.get(link.server_if)
        if gid_c is None or gid_s is None:
            gid_c = gid_s = None  # both ends must address the same way: RDMA-CM then
        out: dict = {"device": dev_c, "server_device": dev_s, "gid_index": gid_c}
        port = PERFTEST_PORT + slot
        bw_out, bw_srv = self._serve_and_run(link, perftest_line("ib_write_bw", dev_s, gid_s, port),
                                             perftest_line("ib_write_bw", dev_c, gid_c, port, link.server_ip), port)
        bw = parse_perftest(bw_out)
        out["gbps"], out["rdma_mtu"] = bw.bw_gbps, bw.mtu
        errors = bw.errors or parse_perftest(bw_srv).errors
        if bw.bw_gbps is None:
            out["error"] = "; ".join(errors) or _tail(bw_out) or "ib_write_bw printed no result"
            return out
        lat_out, _ = self._serve_and_run(link, perftest_line("ib_write_lat", dev_s, gid_s, port),
                                         perftest_line("ib_write_lat", dev_c, gid_c, port, link.server_ip), port)
        out["latency_us"] = parse_perftest(lat_out).latency_us
        return out

    def measure_links(self) -> list[dict]:
        links = [link for link in bench_links(self.inventory, self.plan)
                 if link.client in self.facts and link.server in self.facts]
        results: dict[str, dict] = {}
        for members in rounds(links):
            with ThreadPoolExecutor(max_workers=max(1, min(self.request.forks, len(members)))) as pool:
                for result in pool.map(lambda pair: self.measure(*pair), [(m, i) for i, m in enumerate(members)]):
                    results[result["key"]] = result
        return [results[link.key] for link in links]

    # --- NCCL -------------------------------------------------------------------------------------------------
    def _run_all_reduce(self, head: str, order: list[str], path: str | None):
        script = all_reduce_script(len(order), self.request.nccl_min, self.request.nccl_max, path)
        return self.session.transports[head].exec_in(self.inventory.container.name, f"bash -c {q(script)}",
                                                     timeout=NCCL_TIMEOUT)

    def build_nccl_tests(self, order: list[str]) -> tuple[str | None, str]:
        return build_all_reduce_perf(self.session.transports, self.inventory.container.name, self.facts, order,
                                     forks=self.request.forks, progress=self.progress)

    def all_reduce(self) -> dict:
        inv = self.inventory
        order = [n.name for n in inv.nodes if n.name in self.facts]
        missing = [n.name for n in inv.nodes if n.name not in self.facts]
        if missing:
            # fewer ranks than nodes is another all-reduce, not this cluster's figure
            out = _not_measured(f"{', '.join(missing)} did not answer: the all-reduce needs every node", len(order))
            out["unreachable"] = missing
            self.progress(f"NCCL all-reduce: {out['summary']}")
            return out
        head = order[0]
        result = self._run_all_reduce(head, order, self.request.all_reduce_perf)
        output = result.stdout + result.stderr
        if "@@no-all-reduce-perf@@" in output and self.request.all_reduce_perf is None:
            # not in the image: built once per node and image into the cache the containers mount
            path, error = self.build_nccl_tests(order)
            if path is None:
                return _not_measured(f"all_reduce_perf is not in the image, and {error}", len(order))
            result = self._run_all_reduce(head, order, path)
            output = result.stdout + result.stderr
        if not _TAG.search(output) and "@@no-all-reduce-perf@@" not in output and not result.ok:
            # docker's or mpirun's own words (no such container, not running, ORTE ...): facts may be stale by now
            why = _tail(output) or "no output"
            return _not_measured(f"the all-reduce in {inv.container.name} on {head} failed: {why}"
                                 + container_hint(output), len(order))
        if "@@no-all-reduce-perf@@" in output:
            return _not_measured(f"no all_reduce_perf at {self.request.all_reduce_perf} in {inv.container.name} on "
                                 f"{head} (--all-reduce-perf)", len(order))
        by_rank: dict[int, list[str]] = {}
        for line in output.splitlines():
            if m := _TAG.match(line):
                by_rank.setdefault(int(m["rank"]), []).append(m["line"])
        table = parse_nccl_tests("\n".join(by_rank.get(0, [])) or output)
        reports: dict[str, NcclReport] = {order[r]: parse_nccl_log("\n".join(lines))
                                          for r, lines in by_rank.items() if r < len(order)}
        ends = {n: [self.end(n, i) for i in self.plan.ports[n].interfaces] for n in order}
        cabled = {n: list(self.plan.ports[n].roce_devices) for n in order}
        busbw = table.peak_busbw if table.rows else None
        verdict = judge_allreduce(busbw, inv.topology, len(order), reports, ends, cabled)
        out = {"busbw": busbw, "avg_busbw": table.avg_busbw, "ranks": len(order), "nccl_tests": table.version,
               "settings": nccl_settings(self.request.nccl_min, self.request.nccl_max, order),
               "transport": {n: _transport(r) for n, r in reports.items()}, "verdict": verdict.to_dict(),
               "error": None if busbw is not None else (table.errors[:1] or [_tail(output) or "no result rows"])[0]}
        out["summary"] = verdict.summary("the all-reduce") if busbw is not None else f"not measured: {out['error']}"
        self.progress(f"NCCL all-reduce over {len(order)} nodes: {_figure(busbw, 'GB/s')} busbw: {out['summary']}")
        return out


# docker's and podman's words for a container that is not there or not running: moby's "No such container: X"
# and "container X is not running" (daemon/errors.go), podman's "no container with name or ID ... found: no such
# container" (libpod/define ErrNoSuchCtr) and "can only create exec sessions on running containers: container
# state improper" (libpod/container_exec.go)
_NO_CONTAINER = re.compile(r"No such container|no container with name or ID|container \S+ is not running|"
                           r"container state improper", re.I)


def container_hint(output: str) -> str:
    """The bootstrap hint, only when the failure is the container's absence."""
    return " (sparkctl cluster bootstrap starts the containers)" if _NO_CONTAINER.search(output) else ""


def _not_measured(error: str, ranks: int | None = None) -> dict:
    return {"error": error, "busbw": None, "ranks": ranks, "summary": f"not measured: {error}"}


def _transport(report: NcclReport) -> dict:
    return {"network": report.network, "ib_devices": [f"{d.device}:{d.port}" for d in report.ib_devices],
            "socket": [f"{n}:{a}" for n, a in report.socket_interfaces], "ib_no_device": report.ib_no_device,
            "nccl": report.nccl_version}


def _tail(text: str) -> str:
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    return lines[-1][:300] if lines else ""


def _figure(value: float | None, unit: str) -> str:
    return f"{value:.3g} {unit}" if value is not None else "-"


def fabric_bench(inventory: Inventory, request: BenchRequest,
                 progress: Callable[[str], None] = lambda _: None) -> dict:
    """The whole command; returns the recorded result (also written beside the run journals)."""
    if inventory.topology == "single" or len(inventory.nodes) < 2:
        raise BadInput(f"{inventory.source or 'the inventory'}: topology {inventory.topology}: fabric bench needs "
                       "two or more nodes cabled together", hint="a single Spark has no fabric link to measure")
    started = datetime.now(timezone.utc)
    with Session(inventory, forks=request.forks) as session:
        facts = session.gather()
        if not facts:
            kinds = list(session.unreachable_kinds.values())
            raise Unreachable(f"no node of {inventory.cluster.name} answered: nothing measured",
                              kind=kinds[0] if kinds else "network",
                              details=[f"{n}: {e}" for n, e in session.unreachable.items()])
        try:
            plan = plan_cluster(inventory, facts)
        except PlanError as exc:
            raise SparkctlError(f"cannot tell the fabric links: {exc.message}", hint=exc.hint) from exc
        run = BenchRun(inventory, session, facts, plan.fabric, request, progress)
        run.read_probes()
        links = run.measure_links() if request.links else []
        nccl = run.all_reduce() if request.nccl else None
        unreachable = dict(session.unreachable)
    result = {"cluster": inventory.cluster.name, "time": started.strftime("%Y-%m-%dT%H:%M:%SZ"),
              "topology": inventory.topology, "nodes": [n.name for n in inventory.nodes if n.name in facts],
              "unreachable": unreachable, "links": links, "nccl": nccl}
    if request.record:
        result["recorded"] = str(record_bench(inventory.cluster.name, result))
    return result
