"""Two bootstrapped, serving Sparks as doctor sees them, and the faults the doctor tests seed in them (one each)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from sparkctl.doctor.diagnose import run_checks
from sparkctl.doctor.node_probes import Gid, Hca
from sparkctl.doctor.snapshot import LinkProbe, ModelCache, NodeProbe, Snapshot, SshProbe, doctor_plan
from sparkctl.facts import Address, ContainerInfo, Lldp, LldpNeighbor, NetplanFile
from sparkctl.facts.parse import parse_meminfo
from sparkctl.plan.container import SPEC_LABEL
from tests.taskkit import inventory, spark_facts

NODES = ("spark1", "spark2")
ADDRS = {"spark1": ("192.168.100.10", "192.168.101.10"), "spark2": ("192.168.100.11", "192.168.101.11")}
DEVICES = (("rocep1s0f1", "enp1s0f1np1"), ("roceP2p1s0f1", "enP2p1s0f1np1"))
FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
TWINS = ("enp1s0f1np1", "enP2p1s0f1np1")
GiB_KB = 1024 * 1024


def bootstrapped(inv) -> tuple[dict, object]:
    """Both nodes' facts as a bootstrap leaves them (fabric addressed, netplan and container as planned), and the
    plan."""
    facts = {}
    for i, name in enumerate(NODES):
        f = spark_facts(name, addresses={t: [f"{ip}/24"] for t, ip in zip(TWINS, ADDRS[name], strict=True)},
                        mtu=9000, session_ip=f"10.0.0.{11 + i}")
        f.mem_total_kb, f.mem_available_kb, f.page_cache_kb = 120 * GiB_KB, 100 * GiB_KB, 4 * GiB_KB
        f.hf_cache_free_bytes = 2 * 10**12
        f.lldp = Lldp("ok", neighbors=[LldpNeighbor(t, NODES[1 - i], port_descr=t) for t in TWINS])
        facts[name] = f
    plan, _ = doctor_plan(inv, facts)
    for name in NODES:
        node_plan = plan.nodes[name]
        facts[name].netplan_files = [NetplanFile(inv.fabric.netplan_file, node_plan.netplan, 0o600)]
        spec = node_plan.container
        facts[name].containers = {spec.name: ContainerInfo(
            spec.name, exists=True, running=True, status="running", image=spec.image, env=dict(spec.env),
            labels={SPEC_LABEL: spec.spec_hash()},
            mounts=[{"Source": h, "Destination": c} for h, c, _ in spec.mounts])}
    return facts, plan


def healthy_snapshot() -> Snapshot:
    """Two bootstrapped, serving Sparks as doctor would see them."""
    inv = inventory()
    facts, plan = bootstrapped(inv)
    probes = {}
    for name in NODES:
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
    probes["spark1"].gateway = "running"
    probes["spark1"].collector = "running"  # TensorRT-LLM's /metrics: the figures collector's
    probes["spark1"].unit = dict(UNIT_RUNNING)
    probes["spark1"].gateway_ss = ("LISTEN 0 511 10.0.0.11:8355 0.0.0.0:*\n"
                                   "LISTEN 0 511 127.0.0.1:8355 0.0.0.0:*\n")
    return Snapshot(inv, facts, {}, probes, plan)


UNIT_RUNNING = {"LoadState": "loaded", "ActiveState": "active", "SubState": "running", "UnitFileState": "enabled",
                "NRestarts": "0", "Result": "success"}

VLLM_CONTAINER = "vllm-multinode"


def healthy_vllm_snapshot(example: str = "two-sparks-vllm.yaml") -> Snapshot:
    """Two Sparks serving with vLLM (inventories/two-sparks-vllm.yaml: mp, one rank each) or another engine of one
    rank per node (two-sparks-sglang.yaml), healthy, as doctor sees them: no container ssh mesh or hostfile, a unit
    on each, the worker reaching the head's rendezvous."""
    inv = inventory(example)
    facts, plan = bootstrapped(inv)
    probes = {}
    for name in NODES:
        facts[name].listening_tcp = {22: "sshd"}
        peer = NODES[1 - NODES.index(name)]
        probes[name] = NodeProbe(
            pings=[LinkProbe(t, peer, ip, "ok") for t, ip in zip(TWINS, ADDRS[peer], strict=True)],
            ssh=[SshProbe(peer, ADDRS[peer][0], True)], hf_token_file=True, serve_log_exists=True,
            unit=dict(UNIT_RUNNING),
            models=[ModelCache(r, "complete") for r in ("meta-llama/Llama-3.3-70B-Instruct",
                                                        "yuhuili/EAGLE3-LLaMA3.3-Instruct-70B")])
    probes["spark1"].health_status = 200
    probes["spark1"].completion = "The sea is wide and deep."
    probes["spark1"].port_owners[inv.serve_spec().engine_port] = "vllm (pid 77)"
    probes["spark1"].gateway = "running"
    probes["spark1"].gateway_ss = "LISTEN 0 511 10.0.0.11:8000 0.0.0.0:*\nLISTEN 0 511 127.0.0.1:8000 0.0.0.0:*\n"
    probes["spark2"].rendezvous = (plan.launch.rendezvous() or "", True)
    return Snapshot(inv, facts, {}, probes, plan)


def healthy_sglang_snapshot() -> Snapshot:
    return healthy_vllm_snapshot("two-sparks-sglang.yaml")


def fault_sglang_dist_unreachable(s):
    s.probes["spark2"].rendezvous = (s.probes["spark2"].rendezvous[0], False)
    s.probes["spark2"].serve_log_tail = ("[W socket.cpp] The client socket has failed to connect to "
                                         "[192.168.100.10]:25000 (errno: 113 - No route to host).")


def fault_sglang_flag_refused(s):
    s.probes["spark2"].serve_log_tail = ("usage: launch_server.py [-h] --model-path MODEL_PATH ...\n"
                                         "launch_server.py: error: unrecognized arguments: --tp_size 2")


def fault_vllm_master_unreachable(s):
    s.probes["spark2"].rendezvous = (s.probes["spark2"].rendezvous[0], False)
    s.probes["spark2"].serve_log_tail = ("[W socket.cpp] The client socket has failed to connect to "
                                         "[192.168.100.10]:29501 (errno: 113 - No route to host).")


def fault_vllm_flag_refused(s):
    s.probes["spark2"].serve_log_tail = ("usage: vllm serve [options] [model_tag]\n"
                                         "vllm serve: error: unrecognized arguments: --swap-space 4")


def fault_vllm_ray_missing(s):
    s.probes["spark1"].ray_found = False


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


def _addr(text: str) -> Address:
    ip, _, prefix = text.partition("/")
    return Address(ip, int(prefix), "inet", "link" if ip.startswith("169.254.") else "global")


def fault_link_local(s):
    s.facts["spark1"].interfaces["enp1s0f1np1"].addresses.append(_addr("169.254.3.3/16"))


def fault_twins_same_subnet(s):
    s.facts["spark1"].interfaces["enP2p1s0f1np1"].addresses.append(_addr("192.168.100.50/24"))


def fault_address_missing(s):
    s.facts["spark2"].interfaces["enP2p1s0f1np1"].addresses = []
    s.probes["spark1"].pings[1].verdict = "dead"
    s.probes["spark1"].container_ssh[1] = SshProbe("spark2", "root@192.168.101.11", False, "No route to host")
    s.probes["spark2"].container_ssh[1] = SshProbe("spark1", "root@192.168.101.10", False, "No route to host")


def fault_address_foreign(s):
    s.facts["spark2"].interfaces["enp1s0f1np1"].addresses.append(_addr("10.77.0.2/24"))


def fault_address_duplicate(s):
    s.facts["spark2"].interfaces["enp1s0f1np1"].addresses.append(_addr("192.168.100.10/24"))


def fault_netplan_conflict(s):
    s.facts["spark1"].netplan_files.append(NetplanFile(
        "/etc/netplan/90-NM-x.yaml",
        "network:\n  ethernets:\n    enp1s0f1np1:\n      addresses: [1.2.3.4/24]\n", 0o600))


def fault_port_down(s):
    nic = s.facts["spark2"].interfaces["enp1s0f1np1"]
    nic.operstate, nic.flags, nic.addresses = "DOWN", ["BROADCAST", "MULTICAST"], []
    peer = s.facts["spark1"].interfaces["enp1s0f1np1"]
    peer.operstate, peer.carrier, peer.flags, peer.addresses = "DOWN", False, ["UP", "NO-CARRIER"], []
    for name in NODES:
        for d in s.facts[name].roce:
            d.up = d.up and d.netdev != "enp1s0f1np1"
    s.probes["spark1"].pings[0].verdict = "dead"
    s.probes["spark1"].ssh[0] = SshProbe("spark2", "192.168.100.11", False, "No route to host")


def fault_no_carrier(s):
    """Both ends up, no carrier (a dead cable): one finding, on the first node, the far end under it."""
    for name in NODES:
        nic = s.facts[name].interfaces["enP2p1s0f1np1"]
        nic.operstate, nic.carrier, nic.flags, nic.addresses = "DOWN", False, ["NO-CARRIER", "UP"], []
    s.probes["spark1"].pings[1].verdict = "dead"
    s.probes["spark2"].pings[1].verdict = "dead"


def fault_interface_missing(s):
    del s.facts["spark2"].interfaces["enP2p1s0f1np1"]
    s.facts["spark2"].roce = [d for d in s.facts["spark2"].roce if d.netdev != "enP2p1s0f1np1"]
    s.probes["spark1"].pings[1].verdict = "dead"


def fault_jumbo(s):
    s.probes["spark2"].pings[0].verdict = "mtu"


def fault_ssh_mesh(s):
    s.probes["spark1"].ssh[0] = SshProbe("spark2", "192.168.100.11", False, "Permission denied (publickey).")


def fault_container_restarting(s):
    """Its command keeps failing under a restart policy: its ssh and hostfile fail with it, said there."""
    info = s.facts["spark2"].containers["trtllm-multinode"]
    info.restart_count = 12
    s.probes["spark1"].container_ssh = [dataclasses.replace(p, ok=False, error="Connection refused")
                                        for p in s.probes["spark1"].container_ssh]
    s.probes["spark2"].container_hostfile = ""


def fault_container_missing(s):
    fault_container_exited(s)
    s.facts["spark2"].containers["trtllm-multinode"] = ContainerInfo("trtllm-multinode", exists=False)


def fault_spec_drift(s):
    s.facts["spark1"].containers["trtllm-multinode"].image = "nvcr.io/nvidia/tensorrt-llm/release:1.2.0rc6"


def fault_port_taken(s):
    fault_container_exited(s)
    s.facts["spark2"].listening_tcp[2233] = "python3"
    s.probes["spark2"].port_owners[2233] = "python3 (pid 999)"


def fault_env_absent(s):
    s.facts["spark2"].containers["trtllm-multinode"].env["NCCL_SOCKET_IFNAME"] = "enp1s0f0np9"


def fault_env_management(s):
    env = s.facts["spark1"].containers["trtllm-multinode"].env
    env["OMPI_MCA_btl_tcp_if_include"] = "enP7s7"


def fault_ib_hca(s):
    s.facts["spark2"].containers["trtllm-multinode"].env["NCCL_IB_HCA"] = "mlx5_0"


def fault_env_unset(s):
    del s.facts["spark2"].containers["trtllm-multinode"].env["OMPI_MCA_oob_tcp_if_include"]


def fault_hostfile(s):
    s.probes["spark2"].container_hostfile = "192.168.100.10\n10.9.9.9\n"


def fault_container_ssh(s):
    s.probes["spark1"].container_ssh[0] = SshProbe("spark2", "root@192.168.100.11", False, "Permission denied")


def fault_unreachable(s):
    s.facts.pop("spark2")
    s.unreachable["spark2"] = "spark2 (10.0.0.12:22): timed out after 10s"
    for p in s.probes["spark1"].ssh + s.probes["spark1"].container_ssh:
        p.ok, p.error = False, "timed out"
    s.probes.pop("spark2")


def fault_ssh_auth(s):
    fault_unreachable(s)
    s.unreachable["spark2"] = "spark2 (10.0.0.12:22): authentication failed for user nvidia"


def fault_ssh_no_key(s):
    """paramiko's 'No authentication methods available': told by its kind, whatever the words."""
    fault_unreachable(s)
    s.unreachable["spark2"] = "spark2 (10.0.0.12): no key to offer"
    s.unreachable_kinds["spark2"] = "auth"


def fault_not_ssh(s):
    fault_unreachable(s)
    s.unreachable["spark2"] = ("port 22 on spark2 (10.0.0.12) accepted and closed the connection: is it an SSH "
                               "server, is the lab down?")


def fault_ssh_refused(s):
    fault_unreachable(s)
    s.unreachable["spark2"] = "spark2 (10.0.0.12): connection refused on port 22"


def fault_user(s):
    s.facts["spark2"].user = "ubuntu"


def fault_docker_broken(s):
    f = s.facts["spark2"]
    f.docker_access, f.docker_error = False, "Cannot connect to the Docker daemon at unix:///var/run/docker.sock. " \
                                             "Is the docker daemon running?"


def fault_docker_group(s):
    f = s.facts["spark2"]
    f.docker_access, f.docker_error = False, "permission denied while trying to connect to the docker daemon socket"
    f.groups.remove("docker")


def fault_model_incomplete(s):
    s.probes["spark2"].models[1] = ModelCache("nvidia/Qwen3-235B-A22B-Eagle3", "incomplete", "partial download")


def fault_model_changed(s):
    s.probes["spark2"].models[0] = ModelCache("nvidia/Qwen3-235B-A22B-FP4", "complete", changed=2)


def fault_serve_down(s):
    s.probes["spark1"].health_status, s.probes["spark1"].completion = 0, None
    s.probes["spark1"].port_owners.pop(18355)


def fault_serve_health(s):
    s.probes["spark1"].health_status, s.probes["spark1"].completion = 503, None


def fault_serve_degenerate(s):
    s.probes["spark1"].completion = "!!!!!!!!!!!!!!!!!!!!!!"


def fault_socket_fallback(s):
    s.probes["spark2"].nccl_log = ("NCCL INFO NCCL_IB_HCA set by environment to mlx5_9\nNCCL INFO NET/IB : No device "
                                   "found.\nNCCL INFO NET/Socket : Using [0]enp1s0f1np1:192.168.100.11<0>\n"
                                   "NCCL INFO Using network Socket\n")


def with_system_probes(s):
    """What the node-software probes see on a healthy pair, added to a healthy snapshot."""
    for node, ips in ADDRS.items():
        system = s.probes[node].system
        system.kernel, system.driver, system.cuda = "6.11.0-1016-nvidia", "580.95.05", "13.0"
        system.hcas = {d: Hca(d, "28.45.4028", "PORT_ACTIVE", "Ethernet") for d, _ in DEVICES}
        system.gids = [Gid(d, 1, 3, f"::ffff:{ip}", "v2", n) for (d, n), ip in zip(DEVICES, ips, strict=True)]
        s.facts[node].meminfo = parse_meminfo((FIXTURES / "facts" / "meminfo.txt").read_text())
    return s


def set_meminfo(s, node, **kb):
    s.facts[node].meminfo = {**s.facts[node].meminfo, **kb}
    s.facts[node].mem_total_kb = s.facts[node].meminfo["MemTotal"]


def fault_unit_missing(s):
    """A server that an earlier sparkctl started by hand, and no unit to bring it back."""
    s.probes["spark1"].unit = {"LoadState": "not-found", "ActiveState": "inactive", "SubState": "dead"}


def fault_unit_disabled(s):
    """`sparkctl serve stop`: the unit disabled and stopped, nothing listens."""
    fault_serve_down(s)
    s.probes["spark1"].unit = {**UNIT_RUNNING, "ActiveState": "inactive", "SubState": "dead",
                               "UnitFileState": "disabled"}


STUCK_END = ('2026-11-29T07:00:00Z 1795935600 stuck killed TERM 3600 {"gpu_power_w":[11.5],"last_token_at":'
             '"2026-11-29T06:58:00Z","reason":"no token for 120s with 2 requests running","running":2}')


def fault_serve_stuck(s, times: int = 3):
    """The watchdog ended a stuck world `times` times (exits.log), and it serves again."""
    s.probes["spark1"].unit_exits = "\n".join([STUCK_END] * times) + "\n"


def fault_unit_failed(s):
    fault_serve_down(s)
    s.probes["spark1"].unit = {**UNIT_RUNNING, "ActiveState": "failed", "SubState": "failed", "Result": "exit-code"}
    s.probes["spark1"].unit_exits = "2026-11-27T20:31:39Z 1795811499 exit-code exited 78 0\n"


def fault_unit_looping(s):
    """The server ends soon after each start (out of memory while loading): the unit between two tries."""
    fault_serve_down(s)
    s.probes["spark1"].unit = {**UNIT_RUNNING, "ActiveState": "activating", "SubState": "auto-restart",
                               "NRestarts": "2"}
    s.probes["spark1"].unit_exits = ("2026-11-27T20:31:39Z 1795811499 asked none none 0\n"
                                     "2026-11-27T20:33:39Z 1795811619 exit-code exited 1 95\n"
                                     "2026-11-27T20:35:39Z 1795811739 exit-code exited 1 97\n")
    s.probes["spark1"].serve_log_tail = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB"


def fault_collector_down(s):
    s.probes["spark1"].collector = "exited"


def fault_gateway_down(s):
    s.probes["spark1"].gateway = "exited"
    s.probes["spark1"].gateway_ss = ""
