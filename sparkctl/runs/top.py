"""`sparkctl top`: the cluster's live figures, one round trip per node per refresh on connections kept open.

A `Top` holds the session (one SSH connection per node), what each node is asked (plan/top.py) and the last
reading of each; `refresh()` reads every node at once and returns a `Frame`: per node its GPU, CPU, memory,
container, every fabric twin's rates (and the management port's, to see that the fabric carries the work), and
the serving figures read on the head through the gateway. A node that stops answering is shown so; it is
connected to again every RECONNECT_EVERY refreshes while the others go on.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field

from sparkctl.errors import Unreachable
from sparkctl.facts import Facts
from sparkctl.inventory import Inventory
from sparkctl.knowledge.nccl import parse_nccl_log
from sparkctl.knowledge.node_metrics import (
    CpuTimes,
    GpuSample,
    LinkCounters,
    MemInfo,
    link_rate,
    parse_gpu_query,
    parse_link_lines,
    parse_meminfo,
    parse_proc_stat,
)
from sparkctl.knowledge.serve_metrics import (
    ServeSample,
    ServingFigures,
    parse_prometheus,
    prometheus_figures,
)
from sparkctl.plan import plan_cluster
from sparkctl.plan.paths import node_home, state_dir
from sparkctl.plan.serve import figures_port
from sparkctl.plan.top import CONTAINER_EVERY, END, NCCL_EVERY, NodeRead, Twin, agent_script
from sparkctl.plan.world import WorldNames
from sparkctl.rules.serving import serves, serving_enabled
from sparkctl.runs.session import DEFAULT_FORKS, Session
from sparkctl.tasks.serve.api_key import api_key
from sparkctl.transport.base import Transport
from sparkctl.transport.framing import Framing
from sparkctl.transport.held import HeldCommand

#: a node that stopped answering is connected to again this often (in refreshes)
RECONNECT_EVERY = 5
#: how long one node's read may take before it counts as not answering
READ_TIMEOUT_S = 10.0


@dataclass
class LinkFigures:
    interface: str
    rx_gbps: float | None
    tx_gbps: float | None
    errors: int | None          # since the last refresh
    drops: int | None
    counters: str               # "rdma" (the RoCE port's, RDMA included) | "netdev"
    role: str                   # "fabric" | "management"
    nccl: bool = False          # the serving world's NCCL lines name it


@dataclass
class NodeFigures:
    node: str
    answering: bool
    why: str = ""
    gpu_util_pct: float | None = None
    gpu_mem_used_mib: float | None = None
    gpu_mem_total_mib: float | None = None
    gpu_temp_c: float | None = None
    gpu_power_w: float | None = None
    cpu_pct: float | None = None
    mem_used_gib: float | None = None
    mem_total_gib: float | None = None
    container: str = "unknown"
    links: list[LinkFigures] = field(default_factory=list)


@dataclass
class Frame:
    """One refresh: every node's figures and the serving ones, over `seconds` since the refresh before."""
    cluster: str
    seconds: float
    nodes: list[NodeFigures]
    serving: dict | None        # ServingFigures as a dict, with "engine" and "endpoint_status"
    #: with several worlds, every world's figures in the order of serve.models, each with its "model" (its name, and
    #: "replica" when it has several); `serving` is the first's
    worlds: list[dict] = field(default_factory=list)

    def to_dict(self) -> dict:
        out = {"cluster": self.cluster, "seconds": round(self.seconds, 3),
               "nodes": {n.node: {k: v for k, v in asdict(n).items() if k != "node"} for n in self.nodes},
               "serving": self.serving}
        return {**out, "worlds": self.worlds} if self.worlds else out


@dataclass
class _Reading:
    at: float
    gpu: GpuSample | None = None
    cpu: CpuTimes | None = None
    mem: MemInfo | None = None
    links: dict[str, LinkCounters] = field(default_factory=dict)
    container: str = "unknown"
    container_pid: int | None = None
    metrics: str | None = None
    metrics_status: int = 0
    nccl: str | None = None
    #: with several worlds, each other world's /metrics read on this node: key -> (status, body or None)
    engines: dict[str, tuple[int, str | None]] = field(default_factory=dict)


class Top:
    def __init__(self, inventory: Inventory, session: Session, facts: dict[str, Facts], nodes: list[str],
                 interval: float = 2.0):
        self.inventory, self.session, self.nodes, self.interval = inventory, session, nodes, interval
        self.agents: dict[str, tuple[HeldCommand, Framing]] = {}
        plan = plan_cluster(inventory, facts)
        self.engine = inventory.engine() if serving_enabled(inventory) else None
        self.twins: dict[str, tuple[Twin, ...]] = {}
        self.management: dict[str, tuple[str, ...]] = {}
        self.logs: dict[str, str] = {}
        worlds = inventory.worlds() if self.engine else []
        #: with several worlds, each other world's figures (/metrics) by the node of its API server, and its name
        self.engines: dict[str, tuple[tuple[str, str], ...]] = {}
        self.world_names: list[tuple[str, str]] = []
        if len(worlds) > 1:
            for world in worlds:
                view = inventory.for_world(world)
                replicas = sum(1 for w in worlds if w.model == world.model)
                self.world_names.append((world.key, world.model + (f" #{world.replica + 1}" if replicas > 1 else "")))
                if world.key:
                    # the figures every reader of the world shares: its engine's, or its collector's
                    url = f"http://{plan.launches[world.key].host}:{figures_port(view)}/metrics"
                    self.engines[world.nodes[0]] = (*self.engines.get(world.nodes[0], ()), (world.key, url))
        for name in nodes:
            ports = plan.fabric.ports[name]
            devices = list(ports.roce_devices) + [""] * len(ports.interfaces)
            self.twins[name] = tuple(Twin(i, d or None) for i, d in zip(ports.interfaces, devices, strict=False))
            node_facts = facts.get(name)
            self.management[name] = tuple(node_facts.management_interfaces) if node_facts else ()
            home = node_home(inventory, inventory.node(name), node_facts)
            # the NCCL lines of the first world on the node (any world's name the node's own twins)
            here = next((w for w in worlds if name in w.nodes), None)
            log = WorldNames(inventory.cluster.name, here.key if here else "").log
            self.logs[name] = f"{state_dir(inventory, home)}/{log}"
        self.key = api_key(inventory) if self.engine else None
        self.count = 0
        self.last: dict[str, _Reading] = {}
        self.lost: dict[str, str] = {n: why for n, why in session.unreachable.items() if n in nodes}
        self.nccl_twins: dict[str, set[str]] = {}
        self.serve_before: tuple[float, ServeSample] | None = None
        self.engines_before: dict[str, tuple[float, ServeSample]] = {}
        self.pool = ThreadPoolExecutor(max_workers=max(1, min(session.forks, len(nodes))))

    # --- reading ---------------------------------------------------------------------------------------------

    def _read(self, name: str) -> _Reading:
        """One refresh of the node: a line to its agent, its sections back (no new session on the node)."""
        new = name not in self.agents  # a new agent knows no container PID yet: it asks docker first
        agent, framing = self._agent(name)
        ask = ("c" if new or self.count % CONTAINER_EVERY == 0 else "") + \
            ("n" if new or self.count % NCCL_EVERY == 0 else "")
        if not agent.send(ask or "-"):
            raise Unreachable(f"{name} stopped answering (its top agent is gone)", kind="lost", node=name)
        lines: list[str] = []
        deadline = time.monotonic() + READ_TIMEOUT_S
        while True:
            line = agent.readline(max(0.0, deadline - time.monotonic()))
            if line is None:
                raise Unreachable(f"{name} did not answer within {READ_TIMEOUT_S:g} s", kind="lost", node=name)
            if line == END:
                break
            lines.append(line)
        return self._parse(framing.texts("\n".join(lines)))

    def _agent(self, name: str) -> tuple[HeldCommand, Framing]:
        """The node's agent (plan/top.py), started once on its connection; given the key first when it reads the
        endpoint's metrics."""
        if name not in self.agents:
            serving_head = self.engine is not None and name == self.inventory.head.name
            port = self.inventory.endpoint_port() if serving_head else None
            read = NodeRead(
                twins=self.twins[name] + tuple(Twin(m, None) for m in self.management[name]),
                container=self.inventory.container.name,
                metrics_url=f"http://127.0.0.1:{port}/metrics" if port else None,
                authorized=bool(self.key) and serving_head,
                nccl_log=self.logs[name] if self.engine and serves(self.inventory, name) else None,
                engines=self.engines.get(name, ()))
            framing = Framing()
            agent = self._transport(name).hold(agent_script(read, framing, self.interval), what="top")
            agent.send(f"Authorization: Bearer {self.key}" if read.authorized else "")
            self.agents[name] = (agent, framing)
        return self.agents[name]

    def _transport(self, name: str) -> Transport:
        if name not in self.session.transports:
            self.session.transports[name] = self.session.open(name)
        return self.session.transports[name]

    def _drop(self, name: str) -> None:
        """A node that stopped answering: its agent and connection go, to be made again when it is tried."""
        held = self.agents.pop(name, None)
        if held is not None:
            held[0].close()
        stale = self.session.transports.pop(name, None)
        if stale is not None:
            stale.close()

    def close(self) -> None:
        for name in list(self.agents):
            self.agents.pop(name)[0].close()
        self.pool.shutdown(wait=False)

    @staticmethod
    def _parse(texts: dict[str, str]) -> _Reading:
        now = _Reading(at=time.monotonic())
        lines = texts.get("gpu", "").strip().splitlines()
        now.gpu = parse_gpu_query(lines[0]) if lines else None
        now.cpu = parse_proc_stat(texts.get("cpu", ""))
        now.mem = parse_meminfo(texts.get("mem", ""))
        now.links = parse_link_lines(texts.get("links", ""))
        # the agent keeps the PID docker last gave and says whether it still runs (plan/top.py)
        state, _, pid = texts.get("container", "").strip().partition(" ")
        now.container = state or "unknown"
        now.container_pid = int(pid) if pid.isdigit() and int(pid) > 0 else None
        if "metrics" in texts:
            now.metrics_status, body = _http_response(texts["metrics"])
            now.metrics = body if now.metrics_status == 200 else None
        for name, text in texts.items():
            if name.startswith("metrics--"):
                status, body = _http_response(text)
                now.engines[name.removeprefix("metrics--")] = (status, body if status == 200 else None)
        now.nccl = texts.get("nccl") or None  # asked every NCCL_EVERY refreshes; empty in between
        return now

    def refresh(self) -> Frame:
        """Read every node at once (a node lost is tried again every RECONNECT_EVERY refreshes)."""
        wanted = [n for n in self.nodes if n not in self.lost or self.count % RECONNECT_EVERY == 0]
        futures = {n: self.pool.submit(self._read, n) for n in wanted}
        readings: dict[str, _Reading] = {}
        for name, future in futures.items():
            try:
                readings[name] = future.result()
                self.lost.pop(name, None)
            except Exception as exc:  # noqa: BLE001 - a node that stops answering is shown, the view goes on
                self.lost[name] = str(exc) or type(exc).__name__
                self._drop(name)
        frame = self._frame(readings)
        for name, reading in readings.items():
            self.last[name] = reading
        self.count += 1
        return frame

    # --- figures ---------------------------------------------------------------------------------------------

    def _frame(self, readings: dict[str, _Reading]) -> Frame:
        nodes = []
        spans = []
        for name in self.nodes:
            if name not in readings:
                nodes.append(NodeFigures(name, answering=False, why=self.lost.get(name, "not read")))
                continue
            now, before = readings[name], self.last.get(name)
            if before is not None:
                spans.append(now.at - before.at)
            if now.nccl is not None:
                self.nccl_twins[name] = _nccl_interfaces(now.nccl)
            nodes.append(self._node_figures(name, now, before))
        seconds = max(spans) if spans else 0.0
        serving = self._serving(readings)
        return Frame(self.inventory.cluster.name, seconds, nodes, serving, self._worlds(readings, serving))

    def _node_figures(self, name: str, now: _Reading, before: _Reading | None) -> NodeFigures:
        out = NodeFigures(name, answering=True, container=now.container)
        if now.gpu is not None:
            out.gpu_util_pct, out.gpu_temp_c, out.gpu_power_w = now.gpu.util_pct, now.gpu.temp_c, now.gpu.power_w
            out.gpu_mem_used_mib, out.gpu_mem_total_mib = now.gpu.mem_used_mib, now.gpu.mem_total_mib
        if now.mem is not None:
            out.mem_used_gib, out.mem_total_gib = now.mem.used_kib / 2**20, now.mem.total_kib / 2**20
        if before is not None and before.cpu is not None and now.cpu is not None:
            out.cpu_pct = now.cpu.percent_since(before.cpu)
        said = self.nccl_twins.get(name, set())
        named = {t.interface for t in self.twins[name] if t.interface in said or t.device in said}
        roles = [(t.interface, "fabric") for t in self.twins[name]] + [(m, "management") for m in self.management[name]]
        for interface, role in roles:
            counters = now.links.get(interface)
            rate = link_rate(before.links[interface], counters, now.at - before.at) \
                if counters and before is not None and interface in before.links else None
            out.links.append(LinkFigures(
                interface, rate.rx_gbps if rate else None, rate.tx_gbps if rate else None,
                rate.new_errors if rate else None, rate.new_drops if rate else None,
                "rdma" if counters and counters.rdma else "netdev", role, interface in named))
        return out

    def _serving(self, readings: dict[str, _Reading]) -> dict | None:
        head = self.inventory.head.name
        if self.engine is None or head not in readings:
            return None
        now = readings[head]
        figures: ServingFigures | None = None
        out: dict = {"engine": self.engine.name, "metrics_status": now.metrics_status}
        if now.metrics is not None:
            sample = parse_prometheus(now.metrics, self.engine.metrics)
            if self.serve_before is not None:
                figures = prometheus_figures(self.serve_before[1], sample, now.at - self.serve_before[0])
            self.serve_before = (now.at, sample)
            out["generated_tokens"] = sample.generation_tokens
        if figures is not None:
            out.update(asdict(figures))
        return out


    def _worlds(self, readings: dict[str, _Reading], first: dict | None) -> list[dict]:
        """With several worlds, each world's figures: the first's are `first` (through the gateway), every other's
        read from its engine on its head."""
        if self.engine is None or not self.world_names:
            return []
        out = []
        for key, name in self.world_names:
            if not key:
                out.append({"model": name, **(first or {"engine": self.engine.name, "metrics_status": 0})})
                continue
            head = next((n for n, urls in self.engines.items() if any(k == key for k, _u in urls)), "")
            status, text = readings[head].engines.get(key, (0, None)) if head in readings else (0, None)
            figures: dict = {"model": name, "engine": self.engine.name, "metrics_status": status}
            if text is not None:
                sample = parse_prometheus(text, self.engine.metrics)
                now = readings[head].at
                if key in self.engines_before:
                    before_at, before = self.engines_before[key]
                    figures.update(asdict(prometheus_figures(before, sample, now - before_at)))
                self.engines_before[key] = (now, sample)
                figures["generated_tokens"] = sample.generation_tokens
            out.append(figures)
        return out


def _http_response(raw: str) -> tuple[int, str]:
    """(status, body) of an HTTP/1.x response as it came off the socket; (0, "") when nothing answered."""
    head, _, body = raw.replace("\r\n", "\n").partition("\n\n")
    parts = head.split(maxsplit=2)
    status = int(parts[1]) if len(parts) > 1 and parts[0].startswith("HTTP/") and parts[1].isdigit() else 0
    return status, body


def _nccl_interfaces(log: str) -> set[str]:
    """The interfaces the serving world's NCCL lines name: its socket interfaces and its RoCE devices' netdevs
    (NCCL names a device; the twin is the netdev behind it, which the caller knows)."""
    report = parse_nccl_log(log)
    return {ifname for ifname, _ in report.socket_interfaces} | {d.device for d in report.ib_devices}


@contextmanager
def open_top(inventory: Inventory, *, limit: set[str] | None = None, forks: int = DEFAULT_FORKS,
             interval: float = 2.0) -> Iterator[Top]:
    """A Top over the inventory's nodes (those of --limit), its connections and agents open for as long as it is
    used."""
    with Session(inventory, limit=limit, forks=forks) as session:
        facts = session.gather()
        top = Top(inventory, session, facts, session.limited, interval)
        try:
            yield top
        finally:
            top.close()
