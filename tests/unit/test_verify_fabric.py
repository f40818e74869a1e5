"""verify.fabric's pure checks: a container's actual env against recorded node facts, one case per mismatch."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sparkctl.rules.interface_settings import hostfile_mismatches, node_mismatches, subnet_mismatches
from sparkctl.taskgraph.task import TaskFailed
from sparkctl.tasks.verify.fabric import FabricVerify, nccl_log_findings, probe_mismatches
from tests.taskkit import framed
from tests.unit.container_kit import cluster, node_facts, pair, probe_line, running_like_plan

GOOD = {
    "NCCL_SOCKET_IFNAME": "enp1s0f1np1,enP2p1s0f1np1", "NCCL_IB_HCA": "rocep1s0f1,roceP2p1s0f1",
    "UCX_NET_DEVICES": "enp1s0f1np1,enP2p1s0f1np1", "OMPI_MCA_btl_tcp_if_include": "enp1s0f1np1,enP2p1s0f1np1",
    "OMPI_MCA_oob_tcp_if_include": "enp1s0f1np1,enP2p1s0f1np1",
}
NCCL_FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "nccl-2.28.9"


def errors(env, facts=None):
    return [m for m in node_mismatches("spark2", env, facts or node_facts("spark2", 2)) if m.severity == "error"]


def test_healthy_env_has_no_mismatch():
    assert node_mismatches("spark2", GOOD, node_facts("spark2", 2)) == []


@pytest.mark.parametrize("setting,value,expect", [
    ("NCCL_SOCKET_IFNAME", "enp1s0f0np0,enP2p1s0f0np0", "is Down"),
    ("NCCL_SOCKET_IFNAME", "eth", "no interface matches 'eth'"),
    ("NCCL_SOCKET_IFNAME", "^lo", "enP7s7 is the management"),
    ("NCCL_SOCKET_IFNAME", "=enp1s0f1", "no interface matches 'enp1s0f1'"),
    ("UCX_NET_DEVICES", "rocep9s0f1:1", "RDMA device rocep9s0f1 does not exist"),
    ("OMPI_MCA_btl_tcp_if_include", "enP7s7", "management"),
    ("OMPI_MCA_btl_tcp_if_include", "10.99.0.0/16", "no Up interface has an address in 10.99.0.0/16"),
    ("NCCL_IB_HCA", "rocep1s0f1,roceP2p1s0f9", "silently falls back to TCP"),
    ("NCCL_IB_HCA", "rocep1s0f0", "maps to enp1s0f0np0, which is Down"),
])
def test_each_wrong_setting_is_named_with_what_the_node_has(setting, value, expect):
    found = errors(dict(GOOD, **{setting: value}))
    assert found, f"{setting}={value} passed"
    assert found[0].node == "spark2" and found[0].setting == setting and found[0].names == value
    assert expect in found[0].has
    assert "enp1s0f1np1" in found[0].line() or "rocep1s0f1" in found[0].line()


def test_missing_oob_is_an_error_and_half_the_hcas_a_warning():
    env = {k: v for k, v in GOOD.items() if k != "OMPI_MCA_oob_tcp_if_include"}
    assert [m.setting for m in errors(env)] == ["OMPI_MCA_oob_tcp_if_include"]
    half = node_mismatches("spark2", dict(GOOD, NCCL_IB_HCA="rocep1s0f1"), node_facts("spark2", 2))
    assert [(m.setting, m.severity) for m in half] == [("NCCL_IB_HCA", "warning")]


def test_hostfile_line_must_be_owned_on_an_included_interface():
    facts = {"spark1": node_facts("spark1", 1), "spark2": node_facts("spark2", 2)}
    envs = {"spark1": GOOD, "spark2": GOOD}
    assert hostfile_mismatches(["spark1", "spark2"], "192.168.100.10\n192.168.100.11\n", envs, facts) == []
    found = hostfile_mismatches(["spark1", "spark2"], "192.168.100.10\n10.0.0.2\n", envs, facts)
    assert [(m.node, m.setting) for m in found] == [("spark2", "hostfile")]
    assert "enP7s7" in found[0].has


def test_peers_without_a_shared_subnet():
    facts = {"spark1": node_facts("spark1", 1), "spark2": node_facts("spark2", 2)}
    facts["spark2"].interfaces["enp1s0f1np1"].addresses[0].ip = "192.168.7.11"
    facts["spark2"].interfaces["enP2p1s0f1np1"].addresses[0].ip = "192.168.8.11"
    found = subnet_mismatches([("spark1", "spark2")], {"spark1": GOOD, "spark2": GOOD}, facts)
    assert found and "no subnet in common with spark2" in found[0].has


def test_probe_catches_head_env_forwarded_and_management_traffic():
    facts = {"spark1": node_facts("spark1", 1), "spark2": node_facts("spark2", 2)}
    envs = {"spark1": GOOD, "spark2": dict(GOOD, NCCL_SOCKET_IFNAME="enp1s0f0np0,enP2p1s0f0np0")}
    report = {"size": 2, "bytes": 1000, "ranks": [
        {"rank": 0, "hostname": "spark1", "env": GOOD, "tx_bytes": {"enp1s0f1np1": 900}, "sum_ok": True},
        {"rank": 1, "hostname": "spark2", "env": GOOD, "tx_bytes": {"enP7s7": 900}, "sum_ok": True}]}
    found = probe_mismatches(report, ["spark1", "spark2"], {"spark1": "spark1", "spark2": "spark2"}, envs, facts)
    assert {(m.node, m.setting) for m in found} == {("spark2", "NCCL_SOCKET_IFNAME"),
                                                   ("spark2", "OMPI_MCA_btl_tcp_if_include")}
    report["ranks"][1]["sum_ok"] = False
    found = probe_mismatches(report, ["spark1", "spark2"], {"spark1": "spark1", "spark2": "spark2"}, envs, facts)
    assert ("spark2", "allreduce") in {(m.node, m.setting) for m in found}


@pytest.mark.parametrize("log,setting", [("ib_hca_missing.log", "NCCL_IB_HCA"),
                                         ("socket_missing_if.log", "NCCL_SOCKET_IFNAME"),
                                         ("socket_exact.log", None), ("default_p2p.log", None)])
def test_nccl_logs_report_what_nccl_really_used(log, setting):
    found, summary = nccl_log_findings("spark1", (NCCL_FIXTURES / log).read_text(errors="replace"))
    assert [m.setting for m in found] == ([setting] if setting else [])
    assert summary and summary.startswith("spark1: NCCL")


def test_ring_peers_share_a_subnet_on_any_fabric_twin_not_only_the_mpi_one():
    """A ring gives Open MPI one interface per node; the neighbour routes carry it over the shared cable."""
    facts = {"spark1": node_facts("spark1", 1), "spark2": node_facts("spark2", 2)}
    envs = {"spark1": dict(GOOD, OMPI_MCA_btl_tcp_if_include="enp1s0f1np1"),
            "spark2": dict(GOOD, OMPI_MCA_btl_tcp_if_include="enP2p1s0f1np1")}
    assert subnet_mismatches([("spark1", "spark2")], envs, facts)  # direct only: nothing in common
    assert subnet_mismatches([("spark1", "spark2")], envs, facts, routed=True) == []
    facts["spark2"].interfaces["enp1s0f1np1"].addresses[0].ip = "192.168.7.11"
    facts["spark2"].interfaces["enP2p1s0f1np1"].addresses[0].ip = "192.168.8.11"
    found = subnet_mismatches([("spark1", "spark2")], envs, facts, routed=True)
    assert found and "no subnet in common with spark2" in found[0].has


def test_verify_reads_and_probes_in_one_round_trip_per_node_with_cached_facts():
    inv, facts = pair()
    cctx, _ = cluster(inv, facts)
    for node in ("spark1", "spark2"):
        facts[node].containers["trtllm-multinode"] = running_like_plan(cctx, node)
    hostfile = cctx.plan().hostfile
    env = cctx.plan().nodes["spark1"].container.env
    rules = {"spark1": [(r"docker exec", framed([("container-hostfile", hostfile), ("probe", "mpirun said nothing\n"),
                                                 ("probe-result", probe_line(env) + "\n"), ("nccl", "")]))],
             "spark2": [(r"docker exec", framed([("container-hostfile", hostfile), ("nccl", "")]))]}
    cctx, events = cluster(inv, facts, rules)
    assert FabricVerify().check(cctx) == []
    for node in ("spark1", "spark2"):
        transport = cctx.nodes[node].transport
        assert transport.round_trips == 1 and transport.execs == []
    head, = cctx.nodes["spark1"].transport.commands
    assert "mpi_probe.py" in head and "mpi_probe.py" not in cctx.nodes["spark2"].transport.commands[0]
    assert any("allreduce sum ok" in (e.message or "") for e in events)


def test_verify_does_not_probe_when_a_setting_is_already_wrong():
    inv, facts = pair()
    cctx, _ = cluster(inv, facts)
    for node in ("spark1", "spark2"):
        facts[node].containers["trtllm-multinode"] = running_like_plan(cctx, node)
    facts["spark2"].containers["trtllm-multinode"].env["NCCL_IB_HCA"] = "rocep1s0f1,roceP2p1s0f9"
    reads = framed([("container-hostfile", cctx.plan().hostfile), ("nccl", "")])
    cctx, _ = cluster(inv, facts, {n: [(r"docker exec", reads)] for n in ("spark1", "spark2")})
    with pytest.raises(TaskFailed) as err:
        FabricVerify().check(cctx)
    assert "falls back to TCP" in " ".join(err.value.details)
    assert not any("mpi_probe" in c for n in ("spark1", "spark2") for c in cctx.nodes[n].transport.commands)


def test_the_probe_report_survives_16_ranks_through_a_file(tmp_path):
    """The report of 16 ranks is ~7 KiB: through mpirun's tagged stdout it was cut every 4 KiB with a tag inside
    (a key then read as unset, or the JSON broke). Written to a file by rank 0, it arrives whole."""
    import subprocess
    import sys

    from sparkctl.plan.mpi import probe_source
    from sparkctl.transport.framing import Framing

    fake = tmp_path / "mpi4py"
    fake.mkdir()
    # a stand-in MPI for a 16-rank gather in one process: every rank's report is rank 0's, renumbered
    (fake / "__init__.py").write_text("")
    (fake / "MPI.py").write_text(
        "DOUBLE = SUM = None\n"
        "class _C:\n"
        "    def Get_rank(self): return 0\n"
        "    def Get_size(self): return 16\n"
        "    def Barrier(self): pass\n"
        "    def Allreduce(self, s, r, op=None):\n"
        "        r[0][:] = type(r[0])('d', [136.0]) * len(r[0])\n"
        "    def gather(self, x, root=0): return [dict(x, rank=i, hostname=f'spark{i + 1}') for i in range(16)]\n"
        "COMM_WORLD = _C()\n")
    (tmp_path / "mpi_probe.py").write_text(probe_source())
    result = tmp_path / "report.json"
    env = {"PYTHONPATH": str(tmp_path), "PATH": "/usr/bin:/bin", "OMPI_MCA_oob_tcp_if_include": "enp1s0f1np1"}
    subprocess.run([sys.executable, str(tmp_path / "mpi_probe.py"), "16", "1", str(result)], env=env, check=True)
    report = json.loads(result.read_text())
    assert len(result.read_text()) > 4096 and len(report["ranks"]) == 16
    assert all(r["env"]["OMPI_MCA_oob_tcp_if_include"] == "enp1s0f1np1" for r in report["ranks"])
    assert not (tmp_path / "report.json.part").exists()
    # and the head's shell reads it back in its own section, apart from mpirun's output
    framing = Framing("n0")
    from sparkctl.plan.mpi import probe_shell
    shell = probe_shell(16, framing)
    assert '"$_r"' in shell and "--tag-output" in shell and framing.begin("probe-result") in shell
