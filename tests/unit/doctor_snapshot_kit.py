"""Two bootstrapped, serving Sparks as doctor sees them, and the faults more than one doctor test seeds in them."""

from __future__ import annotations

import dataclasses

from sparkctl.doctor.diagnose import run_checks
from sparkctl.doctor.snapshot import LinkProbe, ModelCache, NodeProbe, Snapshot, SshProbe, doctor_plan
from sparkctl.facts import ContainerInfo, Lldp, LldpNeighbor, NetplanFile
from sparkctl.plan.container import SPEC_LABEL
from tests.taskkit import inventory, spark_facts

NODES = ("spark1", "spark2")
ADDRS = {"spark1": ("192.168.100.10", "192.168.101.10"), "spark2": ("192.168.100.11", "192.168.101.11")}
TWINS = ("enp1s0f1np1", "enP2p1s0f1np1")
GiB_KB = 1024 * 1024


def healthy_snapshot() -> Snapshot:
    """Two bootstrapped, serving Sparks as doctor would see them."""
    inv = inventory()
    facts = {}
    for i, name in enumerate(NODES):
        f = spark_facts(name, addresses={t: [f"{ip}/24"] for t, ip in zip(TWINS, ADDRS[name], strict=True)},
                        mtu=9000, session_ip=f"10.0.0.{11 + i}")
        f.mem_total_kb, f.mem_available_kb, f.page_cache_kb = 120 * GiB_KB, 100 * GiB_KB, 4 * GiB_KB
        f.hf_cache_free_bytes = 2 * 10**12
        peer = NODES[1 - i]
        f.lldp = Lldp("ok", neighbors=[LldpNeighbor(t, peer, port_descr=t) for t in TWINS])
        facts[name] = f
    plan, _ = doctor_plan(inv, facts)
    probes = {}
    for name in NODES:
        node_plan = plan.nodes[name]
        facts[name].netplan_files = [NetplanFile(inv.fabric.netplan_file, node_plan.netplan, 0o600)]
        spec = node_plan.container
        facts[name].containers = {spec.name: ContainerInfo(
            spec.name, exists=True, running=True, status="running", image=spec.image, env=dict(spec.env),
            labels={SPEC_LABEL: spec.spec_hash()},
            mounts=[{"Source": h, "Destination": i} for h, i, _ in spec.mounts])}
        facts[name].listening_tcp = {22: "sshd", 2233: "sshd"}
        peer = NODES[1 - NODES.index(name)]
        probes[name] = NodeProbe(
            pings=[LinkProbe(t, peer, ip, "ok") for t, ip in zip(TWINS, ADDRS[peer], strict=True)],
            ssh=[SshProbe(peer, ADDRS[peer][0], True)],
            container_ssh=[SshProbe(peer, f"root@{ip}", True) for ip in ADDRS[peer]],
            container_hostfile=plan.hostfile, port_owners={2233: "sshd (pid 40)"}, hf_token_file=True,
            models=[ModelCache(r, "complete") for r in ("nvidia/Qwen3-235B-A22B-FP4", "nvidia/Qwen3-235B-A22B-Eagle3")],
            serve_log_exists=name == "spark1")
    probes["spark1"].health_status = 200
    probes["spark1"].completion = "The sea is wide and deep."
    probes["spark1"].port_owners[18355] = "trtllm-serve (pid 77)"  # the engine, behind the gateway
    return Snapshot(inv, facts, {}, probes, plan)


def diagnose(s: Snapshot):
    s.plan, s.plan_error = doctor_plan(s.inventory, s.facts)
    return run_checks(s)


def fault_mtu(s):
    s.facts["spark2"].interfaces["enP2p1s0f1np1"].mtu = 1500
    s.probes["spark1"].pings[1].verdict = "mtu"  # explained by the MTU finding, not reported again


def fault_container_exited(s):
    info = s.facts["spark2"].containers["trtllm-multinode"]
    info.running, info.status = False, "exited"
    s.facts["spark2"].listening_tcp.pop(2233)
    s.probes["spark2"].port_owners.pop(2233)
    s.probes["spark1"].container_ssh = [dataclasses.replace(p, ok=False, error="Connection refused")
                                        for p in s.probes["spark1"].container_ssh]
    s.probes["spark2"].container_hostfile = None


def fault_sudo(s):
    s.facts["spark1"].sudo_nopasswd = False
