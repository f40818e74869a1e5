"""verify.fabric: prove the containers' REAL NCCL/UCX/Open MPI settings match each node, then run the MPI probe."""

from __future__ import annotations

import json
import re

from sparkctl.facts import Facts
from sparkctl.knowledge.nccl import parse_nccl_log
from sparkctl.plan.mpi import mpirun_timeout, probe_shell
from sparkctl.rules.fabric import exposed
from sparkctl.rules.interface_settings import (
    INTERFACE_SETTINGS,
    Mismatch,
    fabric_up,
    hostfile_mismatches,
    included_interfaces,
    management_names,
    node_mismatches,
    peer_pairs,
    subnet_mismatches,
)
from sparkctl.rules.serving import serves, without_mpi
from sparkctl.taskgraph.events import Event
from sparkctl.taskgraph.task import Change, Scope, Task, TaskFailed
from sparkctl.tasks import proof
from sparkctl.tasks.context import ClusterContext
from sparkctl.tasks.verify.reads import VERIFY_READS, answers, container_reads, node_reads
from sparkctl.transport.base import q
from sparkctl.transport.framing import Framing

PER_NODE = ("NCCL_SOCKET_IFNAME", "NCCL_IB_HCA", *INTERFACE_SETTINGS[1:])


def _errors(mismatches: list[Mismatch]) -> list[Mismatch]:
    return [m for m in mismatches if m.severity == "error"]


def probe_mismatches(report: dict, order: list[str], hostnames: dict[str, str], envs: dict[str, dict[str, str]],
                     facts_by_node: dict[str, Facts], routed: bool = False) -> list[Mismatch]:
    """PURE: what the probe's ranks saw and did against what each node should have.

    routed (a ring): Open MPI binds one interface, but its bytes to a peer leave by the ring's route to that peer,
    over whichever fabric twin faces it: any of the node's fabric twins is then the expected path."""
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
        elif used and not set(used) & set(included_interfaces(env, facts)) and not (
                routed and set(used) <= set(fabric_up(facts))):
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


class FabricVerify(Task[ClusterContext, None]):
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
              "used. The probe (and mpi.hostfile's `mpirun hostname`) is not run again when it passed less than 24 h "
              "ago, nothing changed earlier in the same run, and nothing it depends on changed since, as "
              "fingerprinted on the controller (~/.local/state/sparkctl/proofs/): sparkctl's version, the probe and "
              "its mpirun line, the node order and planned hostfile, and per node its hostname, its container (id, "
              "image, start time, restarts, env), each fabric interface (state, carrier, MTU, addresses), its fabric "
              "routes, forwarding and rp_filter, and its firewall rules; the container ssh mesh and the hostfiles are "
              "proven live before it on every run. A failed probe clears the record")
    changes = "nothing (read-only)"
    read_only = True

    def check(self, ctx: ClusterContext) -> list[Change[None]]:
        inv = ctx.inventory
        mpi = without_mpi(inv) is None
        engine = inv.engine()
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
            mismatches += node_mismatches(node, info.env, facts[node], engine)
        mismatches += subnet_mismatches(peer_pairs(order, inv.topology), envs, facts,
                                        routed=inv.topology == "ring")
        if not mpi:
            return self._without_mpi(ctx, order, mismatches)
        # The probe rides in the same round trip as the reads when nothing found so far rules it out, and
        # when no proof on record still holds (tasks/proof.py).
        on_record = proof.proven(ctx) if not _errors(mismatches) and len(envs) == len(order) else None
        probe = not _errors(mismatches) and len(envs) == len(order) and on_record is None
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
        if on_record is not None and not _errors(mismatches):
            ctx.emit(Event(event="log", task=self.name, message=(
                f"MPI probe not run again: nothing it depends on changed since it passed at "
                f"{proof.since(on_record)} ({on_record.get('summary', '')})")))
        elif probe and not _errors(mismatches):
            head = extras.get(order[0], {})
            ran = (head.get("probe", ""), head.get("probe-result", ""))
            # nothing at all came back (the docker exec itself failed): run it on its own
            mismatches += self._probe(ctx, order, {n: facts[n].hostname for n in order}, envs, facts,
                                      ran if any(x.strip() for x in ran) else None)
        return self._conclude(ctx, mismatches)

    def _without_mpi(self, ctx: ClusterContext, order: list[str], mismatches: list[Mismatch]) -> list[Change[None]]:
        """An engine whose ranks meet over their own sockets (vLLM, SGLang): no hostfile, container sshd or MPI
        probe; each serving node's serve log says what NCCL used there (RDMA, or a socket fallback)."""
        framing = Framing()
        scripts = {node: node_reads(ctx.nodes[node], framing, exposure=False) + "\ntrue"
                   for node in order if serves(ctx.inventory, node)}
        for node, result in ctx.run_on_all(scripts, timeout=60).items():
            log = framing.texts(result.stdout).get("nccl", "")
            if log.strip():
                found, summary = nccl_log_findings(node, log)
                mismatches += found
                if summary:
                    ctx.emit(Event(event="log", task=self.name, node=node, message=summary))
        return self._conclude(ctx, mismatches)

    def _conclude(self, ctx: ClusterContext, mismatches: list[Mismatch]) -> list[Change[None]]:
        for m in mismatches:
            if m.severity == "warning":
                ctx.emit(Event(event="warning", task=self.name, node=m.node, message=m.line()))
        errors = _errors(mismatches)
        if errors:
            proof.forget(ctx)
            raise TaskFailed(f"{len(errors)} fabric setting(s) do not match the nodes",
                             hint="each line: node: setting=value: what the node really has (fix)",
                             details=[m.line() for m in errors])
        return []

    def _read_node_files(self, ctx: ClusterContext, order: list[str], probe: bool = False) -> dict[str, dict[str, str]]:
        """Per node: the container's hostfile, the serve log's NCCL lines, the exposure check (container.ssh's
        round trip usually carried them: tasks/verify/reads.py); on the head, when asked, the MPI probe's output.
        One round trip per node for what was not handed over, none on a no-op with the probe on record."""
        container = ctx.inventory.container.name
        handed = ctx.take_over(VERIFY_READS)
        out: dict[str, dict[str, str]] = {}
        if handed is not None and set(order) <= set(handed):
            out = {node: dict(handed[node]) for node in order}
        framing = Framing()
        scripts = {}
        for node in order:
            inside = container_reads(framing) if node not in out else ""
            if probe and node == order[0]:
                inside += "\n" + probe_shell(len(order), framing)
            if not inside.strip():
                continue
            host = node_reads(ctx.nodes[node], framing) if node not in out else ""
            scripts[node] = f"docker exec {q(container)} sh -c {q(inside)} 2>/dev/null\n{host}\ntrue"
        for node, result in ctx.run_on_all(scripts, timeout=mpirun_timeout(len(order)) + 30).items():
            found = framing.texts(result.stdout)
            merged = out.setdefault(node, answers(found))
            merged.update({"probe": found.get("probe", ""), "probe-result": found.get("probe-result", "")})
        return out

    def _probe(self, ctx: ClusterContext, order: list[str], hostnames: dict[str, str], envs: dict[str, dict[str, str]],
               facts: dict[str, Facts], ran: tuple[str, str] | None = None) -> list[Mismatch]:
        """ran: (mpirun's output, the report) when the probe rode along with the reads; None runs it here."""
        inv = ctx.inventory
        head = order[0]
        if ran is None:
            framing = Framing()
            result = ctx.nodes[head].transport.exec_in(inv.container.name, probe_shell(len(order), framing),
                                                       timeout=mpirun_timeout(len(order)) + 10)
            found = framing.texts(result.stdout)
            ran = (found.get("probe", "") + result.stderr, found.get("probe-result", ""))
        output, text = ran
        try:
            report = json.loads(text) if text.strip() else None
        except ValueError:
            report = None
        if not isinstance(report, dict):
            proof.forget(ctx)
            tail = (output.strip() or text.strip()).splitlines()[-4:]
            raise TaskFailed(f"the MPI probe did not complete from {head}'s container", details=tail,
                             hint=probe_hint(output))
        seconds = max(report.get("seconds", 0.0), 1e-9)
        gbps = report.get("bytes", 0) / seconds / 1e9
        summary = (f"{report.get('size')} rank(s), allreduce sum "
                   f"{'ok' if all(r.get('sum_ok') for r in report.get('ranks', [])) else 'WRONG'}, "
                   f"{report.get('bytes', 0) / 2**20:.1f} MiB in {seconds * 1000:.0f} ms = {gbps:.2f} GB/s algbw")
        ctx.emit(Event(event="log", task=self.name, message=(
            f"MPI probe: {summary} (Open MPI TCP; NCCL's RDMA path is faster)"),
            data={"probe": {"ranks": report.get("size"), "seconds": seconds, "gbytes_per_s": gbps,
                            "interfaces": {order[r["rank"]]: r.get("tx_bytes", {}) for r in report.get("ranks", [])
                                           if r["rank"] < len(order)}}}))
        mismatches = probe_mismatches(report, order, hostnames, envs, facts, routed=inv.topology == "ring")
        if _errors(mismatches):
            proof.forget(ctx)
        else:
            proof.record(ctx, summary)
        return mismatches


def probe_hint(output: str) -> str:
    """The hint for what the MPI probe's output shows: the image lacks python3 or mpi4py, or mpirun itself
    failed (mpi.hostfile proves it)."""
    if re.search(r"No module named '?mpi4py|ModuleNotFoundError.*mpi4py", output):
        return "mpi4py is not in the image: pip install mpi4py in it (NVIDIA's TensorRT-LLM images have it)"
    if re.search(r"python3: (command )?not found|No such file or directory.*python3|python3.*not found", output):
        return "python3 is not in the image"
    return "mpirun itself failed: mpi.hostfile's `mpirun hostname` proves the launch (its hint names the cause)"

