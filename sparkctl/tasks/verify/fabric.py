"""verify.fabric: prove the containers' REAL NCCL/UCX/Open MPI settings match each node, then run the MPI probe."""

from __future__ import annotations

import json
import posixpath

from sparkctl.engine.events import Event
from sparkctl.engine.task import Change, Scope, Task, TaskFailed
from sparkctl.facts import Facts
from sparkctl.knowledge.nccl import parse_nccl_log
from sparkctl.plan.mpi import MPIRUN_TIMEOUT, PROBE_RESULT, mpirun_line, probe_program, timed
from sparkctl.plan.paths import HOSTFILE_PATH, SERVE_LOG
from sparkctl.rules.fabric import exposed, exposure_script, management_addresses
from sparkctl.rules.interface_settings import (
    INTERFACE_SETTINGS,
    Mismatch,
    hostfile_mismatches,
    included_interfaces,
    management_names,
    node_mismatches,
    peer_pairs,
    subnet_mismatches,
)
from sparkctl.tasks.context import ClusterContext
from sparkctl.transport.base import q
from sparkctl.transport.framing import Framing

PER_NODE = ("NCCL_SOCKET_IFNAME", "NCCL_IB_HCA", *INTERFACE_SETTINGS[1:])


def _errors(mismatches: list[Mismatch]) -> list[Mismatch]:
    return [m for m in mismatches if m.severity == "error"]


def probe_mismatches(report: dict, order: list[str], hostnames: dict[str, str], envs: dict[str, dict[str, str]],
                     facts_by_node: dict[str, Facts]) -> list[Mismatch]:
    """PURE: what the probe's ranks saw and did against what each node should have."""
    out = []
    ranks = sorted(report.get("ranks", []), key=lambda r: r["rank"])
    if len(ranks) != len(order):
        out.append(Mismatch(order[0], "mpirun", f"-np {len(order)}", f"{len(ranks)} rank(s) reported",
                            "check the hostfile and the container ssh mesh (mpi.hostfile)"))
    for rank in ranks:
        if rank["rank"] >= len(order):
            continue
        node = order[rank["rank"]]
        if rank["hostname"] != hostnames.get(node):
            out.append(Mismatch(node, "hostfile", f"rank {rank['rank']}", f"ran on {rank['hostname']}, expected "
                                f"{hostnames.get(node)}", "rerun bootstrap (mpi.hostfile)"))
            continue
        if not rank.get("sum_ok"):
            out.append(Mismatch(node, "allreduce", f"rank {rank['rank']}", "wrong sum", "check the fabric links"))
        env = envs.get(node, {})
        for key in PER_NODE:
            saw = rank.get("env", {}).get(key)
            if key in env and saw != env[key]:
                out.append(Mismatch(node, key, saw or "(unset)", f"the rank saw this, its container has "
                                    f"{env[key]} (a head's setting forwarded by `mpirun -x`?)",
                                    "let each rank take its node's settings (sshd SetEnv); never `-x` them"))
        facts = facts_by_node.get(node)
        moved = rank.get("tx_bytes", {})
        floor = report.get("bytes", 0) // 4
        if facts is None or len(order) < 2 or not floor:
            continue
        used = sorted(n for n, b in moved.items() if b >= floor)
        mgmt = sorted(set(used) & management_names(facts))
        if mgmt:
            out.append(Mismatch(node, "OMPI_MCA_btl_tcp_if_include", env.get("OMPI_MCA_btl_tcp_if_include", ""),
                                f"the allreduce crossed {', '.join(mgmt)} (management)",
                                "restrict btl/oob to the fabric twins"))
        elif used and not set(used) & set(included_interfaces(env, facts)):
            out.append(Mismatch(node, "OMPI_MCA_btl_tcp_if_include", env.get("OMPI_MCA_btl_tcp_if_include", ""),
                                f"the allreduce crossed {', '.join(used)}, not an included interface",
                                "rerun bootstrap", "warning"))
    return out


def nccl_log_findings(node: str, text: str) -> tuple[list[Mismatch], str | None]:
    """(mismatches, one-line summary) from an NCCL_DEBUG=INFO log, e.g. the serve log."""
    report = parse_nccl_log(text)
    if report.nccl_version is None and report.network is None and not report.warnings:
        return [], None
    out = []
    if report.silent_tcp_fallback or (report.ib_hca_requested and report.network == "Socket"):
        out.append(Mismatch(node, "NCCL_IB_HCA", report.env.get("NCCL_IB_HCA", ""),
                            "NCCL found no listed RDMA device and ran over TCP sockets (`Using network Socket`)",
                            "list the Up twins' RoCE devices (ibdev2netdev)"))
    if report.bootstrap_error:
        out.append(Mismatch(node, "NCCL_SOCKET_IFNAME", report.env.get("NCCL_SOCKET_IFNAME", ""),
                            report.bootstrap_error, "name the node's Up fabric twins"))
    devices = ", ".join(f"{d.device}:{d.port}" for d in report.ib_devices) or "-"
    sockets = ", ".join(f"{n}:{a}" for n, a in report.socket_interfaces) or "-"
    summary = (f"{node}: NCCL {report.nccl_version or '?'} used network {report.network or '?'}; IB devices "
               f"{devices}; socket {sockets}" + (f"; {len(report.warnings)} NCCL WARN" if report.warnings else ""))
    return out, summary


class FabricVerify(Task):
    name = "verify.fabric"
    phase = "verify"
    scope = Scope.CLUSTER
    needs = ("mpi.hostfile",)
    description = "prove the containers' real NCCL/UCX/Open MPI settings match each node's interfaces"
    checks = ("per node, the container's sshd does not answer on the node's management address (the mesh is on the "
              "fabric only); the container's ACTUAL env (docker inspect): every interface named by NCCL_SOCKET_IFNAME "
              "(^/= rules), UCX_NET_DEVICES, OMPI_MCA_btl/oob_tcp_if_include exists and is Up and is not the management"
              " or Wi-Fi interface; every NCCL_IB_HCA device exists on an Up twin (else NCCL falls back to TCP "
              "silently); each hostfile line is an address its node owns on an included interface; peers share subnets."
              " Then an mpi4py probe over mpirun: each rank's hostname, env and the interface its bytes crossed; the "
              "allreduce sum; its bandwidth. An NCCL log (serve log) when present: the network and devices NCCL really "
              "used")
    changes = "nothing (read-only)"
    read_only = True

    def check(self, ctx: ClusterContext) -> list[Change]:
        inv = ctx.inventory
        order = [n.name for n in inv.nodes if n.name in ctx.nodes]
        # Every change re-reads its node's facts (NodeContext.invalidate): what is cached is the state now.
        facts = {n: ctx.nodes[n].facts() for n in order}
        mismatches: list[Mismatch] = []
        envs = {}
        for node in order:
            info = facts[node].containers.get(inv.container.name)
            if info is None or not info.running:
                mismatches.append(Mismatch(node, "container", inv.container.name,
                                           f"not running ({getattr(info, 'status', 'absent')})",
                                           "rerun bootstrap (container.run)"))
                continue
            envs[node] = info.env
            mismatches += node_mismatches(node, info.env, facts[node])
        mismatches += subnet_mismatches(peer_pairs(order, inv.topology), envs, facts,
                                        routed=inv.topology == "ring")
        # The probe rides in the same round trip as the reads when nothing found so far rules it out.
        probe = not _errors(mismatches) and len(envs) == len(order)
        extras = self._read_node_files(ctx, order, probe)
        for node in order:
            for ip in exposed(extras.get(node, {}).get("exposure", "")):
                mismatches.append(Mismatch(node, "container sshd", f"{ip}:{inv.container.ssh_port}",
                                           "answers on the management address (the mesh belongs on the fabric)",
                                           "rerun bootstrap (container.run recreates it listening on the fabric "
                                           "only)"))
        hostfile = extras.get(inv.head.name, {}).get("hostfile", "")
        if inv.head.name in envs:
            mismatches += hostfile_mismatches(order, hostfile, envs, facts)
        for node in order:
            log = extras.get(node, {}).get("nccl", "")
            if log.strip():
                found, summary = nccl_log_findings(node, log)
                mismatches += found
                if summary:
                    ctx.emit(Event(event="log", task=self.name, node=node, message=summary))
        if probe and not _errors(mismatches):
            mismatches += self._probe(ctx, order, {n: facts[n].hostname for n in order}, envs, facts,
                                      extras.get(order[0], {}).get("probe", ""))
        for m in mismatches:
            if m.severity == "warning":
                ctx.emit(Event(event="warning", task=self.name, node=m.node, message=m.line()))
        errors = _errors(mismatches)
        if errors:
            raise TaskFailed(f"{len(errors)} fabric setting(s) do not match the nodes",
                             hint="each line: node: setting=value: what the node really has (fix)",
                             details=[m.line() for m in errors])
        return []

    def _read_node_files(self, ctx: ClusterContext, order: list[str], probe: bool = False) -> dict[str, dict[str, str]]:
        """Per node, one round trip: the container's hostfile and the serve log's NCCL lines; on the head, when
        asked, the MPI probe's output too."""
        container = ctx.inventory.container.name
        framing = Framing()
        scripts = {}
        for node in order:
            log = posixpath.join(ctx.nodes[node].state_dir(), SERVE_LOG)
            inside = framing.section("hostfile", f"cat {HOSTFILE_PATH} 2>/dev/null")
            if probe and node == order[0]:
                inside += "\n" + framing.section("probe", f"{timed(mpirun_line(len(order), probe_program()))} 2>&1")
            exposure = exposure_script(management_addresses(ctx.nodes[node].facts()), ctx.inventory.container.ssh_port)
            scripts[node] = (f"docker exec {q(container)} sh -c {q(inside)} 2>/dev/null\n"
                             + framing.section("nccl", f"grep -E 'NCCL|NET/' {q(log)} 2>/dev/null | tail -n 4000")
                             + "\n" + framing.section("exposure", exposure) + "\ntrue")
        out = {}
        for node, result in ctx.run_on_all(scripts, timeout=MPIRUN_TIMEOUT + 30).items():
            found = framing.texts(result.stdout)
            out[node] = {"hostfile": found.get("hostfile", ""), "nccl": found.get("nccl", ""),
                         "probe": found.get("probe", ""), "exposure": found.get("exposure", "")}
        return out

    def _probe(self, ctx: ClusterContext, order: list[str], hostnames: dict[str, str], envs: dict[str, dict[str, str]],
               facts: dict[str, Facts], output: str = "") -> list[Mismatch]:
        inv = ctx.inventory
        head = order[0]
        if not output.strip():
            # not run with the reads: run it on its own
            result = ctx.nodes[head].transport.exec_in(inv.container.name, mpirun_line(len(order), probe_program()),
                                                       timeout=MPIRUN_TIMEOUT)
            output = result.stdout + "\n" + result.stderr
        line = next((ln.split(PROBE_RESULT, 1)[1] for ln in output.splitlines() if PROBE_RESULT in ln), None)
        if line is None:
            tail = output.strip().splitlines()[-4:]
            raise TaskFailed(f"the MPI probe did not complete from {head}'s container", details=tail,
                             hint="python3 with mpi4py must be in the image; see mpi.hostfile for mpirun itself")
        report = json.loads(line)
        seconds = max(report.get("seconds", 0.0), 1e-9)
        gbps = report.get("bytes", 0) / seconds / 1e9
        ctx.emit(Event(event="log", task=self.name, message=(
            f"MPI probe: {report.get('size')} rank(s), allreduce sum "
            f"{'ok' if all(r.get('sum_ok') for r in report.get('ranks', [])) else 'WRONG'}, "
            f"{report.get('bytes', 0) / 2**20:.1f} MiB in {seconds * 1000:.0f} ms = {gbps:.2f} GB/s algbw "
            "(Open MPI TCP; NCCL's RDMA path is faster)"),
            data={"probe": {"ranks": report.get("size"), "seconds": seconds, "gbytes_per_s": gbps,
                            "interfaces": {order[r["rank"]]: r.get("tx_bytes", {}) for r in report.get("ranks", [])
                                           if r["rank"] < len(order)}}}))
        return probe_mismatches(report, order, hostnames, envs, facts)

