"""The findings a person must close (doctor/catalog.py): each one, produced from a healthy snapshot, says what to do
(an exact fix and why sparkctl cannot), and `doctor --fix` leaves it alone and says so, running nothing for it.

Where the lab can hold such a fault, tests/lab/test_doctor.py seeds it too.
"""

from __future__ import annotations

import atexit
import dataclasses
import json
import shutil
import tempfile
from pathlib import Path

import pytest
from click.testing import CliRunner
from rich.console import Console

from sparkctl.cli.doctor_cmd import render_diagnosis
from sparkctl.cli.main import cli
from sparkctl.doctor import diagnose as diagnose_module
from sparkctl.doctor.catalog import FINDINGS
from sparkctl.doctor.checks import fabric as checks_fabric
from sparkctl.doctor.findings import KINDS, Diagnosis
from sparkctl.doctor.node_probes import Setting
from sparkctl.doctor.snapshot import LinkProbe, Snapshot, SshProbe, doctor_plan
from sparkctl.facts import Lldp
from sparkctl.facts.lldp import parse_lldp
from sparkctl.inventory.sections import TlsSettings
from sparkctl.plan.container import SPEC_LABEL
from sparkctl.runs import doctor as doctor_run
from tests.certificates_kit import issue
from tests.taskkit import REPO, inventory, spark_facts
from tests.unit import doctor_snapshot_kit as base
from tests.unit import nm_kit as nm_tests
from tests.unit.bench_kit import bench

GiB_KB = base.GiB_KB


def host_key_changed(s):
    base.fault_unreachable(s)
    s.unreachable["spark2"] = ("spark2 (10.0.0.12:22): host key CHANGED for 10.0.0.12; if the node was reinstalled: "
                               "ssh-keygen -f ~/.ssh/known_hosts -R 10.0.0.12")


def docker_missing(s):
    f = s.facts["spark2"]
    f.docker_cli = f.docker_access = False


def not_spark(s):
    s.facts["spark2"].is_dgx_spark, s.facts["spark2"].dgx_name = False, None


def facts_partial(s):
    s.facts["spark1"].raw_errors.append("ethtool enp1s0f1np1: exit 1")


def clock_skew(s):
    s.facts["spark2"].time += 30


def low_memory(s):
    s.facts["spark1"].mem_available_kb = 5 * GiB_KB


def page_cache(s):
    s.facts["spark2"].page_cache_kb = 60 * GiB_KB


def hf_cache_low(s):
    s.facts["spark2"].hf_cache_free_bytes = 5 * 10**9


def speed_low(s):
    s.facts["spark1"].interfaces["enp1s0f1np1"].speed_mbps = 100_000


def known_bad_release(s):
    s.inventory = s.inventory.model_copy(deep=True)
    s.inventory.container.image = "nvcr.io/nvidia/tensorrt-llm/release:1.3.0rc13"
    plan, _ = doctor_plan(s.inventory, s.facts)
    for name, f in s.facts.items():  # the containers already run it as planned: only the release is the finding
        spec = plan.nodes[name].container
        info = f.containers["trtllm-multinode"]
        info.image, info.labels = spec.image, {SPEC_LABEL: spec.spec_hash()}


def wrong_port(s):
    s.inventory = s.inventory.model_copy(deep=True)
    s.inventory.fabric.port = 0


def link_dead(s):
    s.probes["spark2"].pings[0] = LinkProbe("enp1s0f1np1", "spark1", "192.168.100.10", "dead")


def nccl_warn(s):
    s.probes["spark1"].nccl_log = "host:1:1 [0] NCCL WARN Bootstrap : no socket interface found\n"


def bandwidth_regression(s):
    s.bench_history = [bench("t2", 40.0), bench("t1", 93.0)]


def probed(fault):
    """A fault of the node-software probes, on a snapshot where they saw a healthy pair first."""
    def seeded(s):
        base.with_system_probes(s)
        fault(s)
    return seeded


def gid_missing(s):
    s.probes["spark2"].system.gids = [g for g in s.probes["spark2"].system.gids if g.device != "roceP2p1s0f1"]


def port_inactive(s):
    s.probes["spark1"].system.hcas["rocep1s0f1"].state = "PORT_DOWN"


def driver_mismatch(s):
    s.probes["spark2"].system.driver = "575.64.03"


def kernel_mismatch(s):
    s.probes["spark2"].system.kernel = "6.8.0-1010-nvidia"


def firmware_mismatch(s):
    for hca in s.probes["spark2"].system.hcas.values():
        hca.fw = "28.43.1014"


def driver_too_old(s):
    for node in base.ADDRS:
        s.facts[node].containers["trtllm-multinode"].env["CUDA_VERSION"] = "13.0.2"
    s.probes["spark1"].system.driver, s.probes["spark1"].system.cuda = "570.133.20", "12.8"


def image_setting(s):
    s.facts["spark1"].containers["trtllm-multinode"].env["NCCL_IB_DISABLE"] = "1"


def file_setting(s):
    s.probes["spark2"].system.container_settings = [Setting("/etc/nccl.conf", 3, "NCCL_NET", "Socket")]


def host_setting(s):
    s.probes["spark2"].system.host_settings = [Setting("/home/nvidia/.bashrc", 9, "NCCL_IB_HCA", "mlx5_0")]


def sshd_dropin(s):
    s.probes["spark2"].system.sshd_dropins = [("/etc/ssh/sshd_config.d/10-hardening.conf",
                                               "PubkeyAuthentication", "no")]


def cma_reserved(s):
    base.set_meminfo(s, "spark2", MemTotal=120 * GiB_KB, MemFree=100 * GiB_KB, CmaTotal=60 * GiB_KB,
                          CmaFree=59 * GiB_KB)


def swap_in_use(s):
    base.set_meminfo(s, "spark2", MemTotal=120 * GiB_KB, MemFree=100 * GiB_KB, SwapTotal=8 * GiB_KB,
                          SwapFree=2 * GiB_KB, SwapCached=0)


def lldp_unavailable(s):
    s.facts["spark2"].lldp = Lldp("stopped", "lldpd is not running")


def cable_wrong(s):
    """The lab's three-node ring cabled 1,3,2, as each node's real lldpd reported it (tests/fixtures/lldp/)."""
    captures = REPO / "tests" / "fixtures" / "lldp"
    s.inventory = inventory("three-sparks-ring.yaml")
    s.facts = {}
    for i in (1, 2, 3):
        s.facts[f"spark{i}"] = spark_facts(f"spark{i}", up_ports=(0, 1))
        s.facts[f"spark{i}"].lldp = parse_lldp((captures / f"ring3-order132.spark{i}.json").read_text())
    s.probes, s.plan = {}, None


def nm_not_running(s):
    for name in ("spark1", "spark2"):
        s.facts[name].netplan_files.append(nm_tests.DGX_OS)
        s.facts[name].nm = nm_tests.nmcli("stopped.txt" if name == "spark2" else "converged.txt")
        s.facts[name].interfaces["enp1s0f1np1"].mac = nm_tests.BOUND_MAC


def nm_unread(s):
    nm_not_running(s)
    s.facts["spark2"].nm = nm_tests.nmcli("converged.txt")
    s.facts["spark2"].nm.status, s.facts["spark2"].nm.detail = "error", "no answer"


def mesh_unchecked(s):
    reset = "kex_exchange_identification: read: Connection reset by peer"
    s.probes["spark1"].ssh[0] = SshProbe("spark2", "192.168.100.11", False, reset, "unknown")


def container_ssh_unchecked(s):
    reset = "kex_exchange_identification: read: Connection reset by peer"
    s.probes["spark2"].container_ssh[0] = SshProbe("spark1", "root@192.168.100.10", False, reset, "unknown")


def container_unread(s):
    s.facts["spark2"].containers["trtllm-multinode"] = dataclasses.replace(
        s.facts["spark2"].containers["trtllm-multinode"], exists=False, running=False, status="unknown")


def not_ssh(s):
    base.fault_unreachable(s)
    s.unreachable["spark2"] = "port 22 on spark2 (10.0.0.12) accepted and closed the connection: is it an SSH server?"


def ssh_refused(s):
    base.fault_unreachable(s)
    s.unreachable["spark2"] = "spark2 (10.0.0.12): connection refused on port 22"


def run_in_progress(s):
    s.busy = "bootstrap by nvidia@ctl (pid 42) since 2026-01-02 03:04:05Z (12 s ago)"


def outside_unreadable(s):
    base.fault_unreachable(s)
    s.limit = frozenset({"spark1"})


def tls_ending(s):
    """serve.tls's certificate, served as it is, ends in 3 days."""
    folder = tempfile.mkdtemp(prefix="sparkctl-test-tls-")
    atexit.register(shutil.rmtree, folder, True)
    issued = issue(Path(folder), ["10.0.0.11"], days=3)
    tls = TlsSettings(certificate=str(issued.certificate), key=str(issued.key), ca=str(issued.ca))
    s.inventory = s.inventory.model_copy(update={"serve": s.inventory.serve.model_copy(update={"tls": tls})})
    s.tls_certificate = issued.certificate.read_text()
    s.probes["spark1"] = dataclasses.replace(s.probes["spark1"], gateway="running",
                                             served_certificate=s.tls_certificate)


FAULTS = {
    "node.unreachable": base.fault_unreachable, "node.ssh_auth": base.fault_ssh_auth,
    "node.host_key_changed": host_key_changed, "node.user_mismatch": base.fault_user,
    "node.sudo_password": base.fault_sudo, "node.docker_missing": docker_missing,
    "node.docker_group": base.fault_docker_group, "node.docker_broken": base.fault_docker_broken,
    "node.not_spark": not_spark, "node.facts_partial": facts_partial, "node.clock_skew": clock_skew,
    "node.low_memory": low_memory, "node.page_cache": page_cache, "disk.hf_cache_low": hf_cache_low,
    "image.known_bad_release": known_bad_release, "fabric.interface_missing": base.fault_interface_missing,
    "fabric.no_carrier": base.fault_no_carrier, "fabric.wrong_port": wrong_port, "fabric.speed_low": speed_low,
    "fabric.jumbo_ping": base.fault_jumbo, "fabric.link_dead": link_dead, "port.taken": base.fault_port_taken,
    "serve.degenerate": base.fault_serve_degenerate, "serve.unit_disabled": base.fault_unit_disabled,
    "serve.stuck": base.fault_serve_stuck,
    "nccl.warn": nccl_warn,
    "fabric.bandwidth_regression": bandwidth_regression,
    "roce.gid_missing": probed(gid_missing), "roce.port_inactive": probed(port_inactive),
    "gpu.driver_mismatch": probed(driver_mismatch), "node.kernel_mismatch": probed(kernel_mismatch),
    "roce.firmware_mismatch": probed(firmware_mismatch), "gpu.driver_too_old": probed(driver_too_old),
    "env.image_setting": probed(image_setting), "env.file_setting": probed(file_setting),
    "env.host_setting": probed(host_setting), "ssh.sshd_dropin": probed(sshd_dropin),
    "node.cma_reserved": probed(cma_reserved), "node.swap_in_use": probed(swap_in_use),
    "ssh.mesh_unchecked": mesh_unchecked, "container.ssh_unchecked": container_ssh_unchecked,
    "container.unread": container_unread, "fabric.lldp_unavailable": lldp_unavailable,
    "fabric.cable_wrong": cable_wrong, "nm.not_running": nm_not_running, "node.not_ssh": not_ssh,
    "node.ssh_refused": ssh_refused, "doctor.run_in_progress": run_in_progress,
    "doctor.outside_unreadable": outside_unreadable, "nm.unread": nm_unread, "serve.tls_ending": tls_ending,
}
#: found on two Sparks serving with vLLM
VLLM_FAULTS = {"vllm.master_unreachable": base.fault_vllm_master_unreachable,
               "vllm.flag_refused": base.fault_vllm_flag_refused, "vllm.ray_missing": base.fault_vllm_ray_missing}
FAULTS.update(VLLM_FAULTS)
#: found on two Sparks serving with SGLang
SGLANG_FAULTS = {"sglang.dist_unreachable": base.fault_sglang_dist_unreachable,
                 "sglang.flag_refused": base.fault_sglang_flag_refused}
FAULTS.update(SGLANG_FAULTS)
#: produced by their own tests below: a plan that cannot be made, nodes on different ports, a crashing check
OWN_TESTS = {"fabric.no_plan", "fabric.ports_differ", "doctor.check_failed"}
PERSON = sorted(i for i, r in FINDINGS.items() if not r.repairable)


def test_every_persons_finding_is_produced_here():
    assert set(PERSON) - set(FAULTS) - OWN_TESTS == set()


def diagnosed(finding_id: str) -> Diagnosis:
    s = (base.healthy_vllm_snapshot() if finding_id in VLLM_FAULTS else base.healthy_sglang_snapshot()
         if finding_id in SGLANG_FAULTS else base.healthy_snapshot())
    FAULTS[finding_id](s)
    return base.diagnose(s)


def says_what_to_do(d: Diagnosis, finding_id: str) -> None:
    found = [f for f in d.findings if f.id == finding_id]
    assert found, [(f.id, f.node) for f in d.findings]
    remedy = FINDINGS[finding_id]
    for f in found:
        assert f.fix and f.evidence and f.summary, f
        assert f.remedy is remedy and f.to_dict()["closed_by"] == {"person": remedy.kind, "why": remedy.person}
    console = Console(record=True, width=400)
    render_diagnosis(console, d, verbose=True)
    text = console.export_text()
    if any(f.severity != "info" for f in found):
        assert f"needs you ({KINDS[remedy.kind]}): {remedy.person}" in text


def fix_leaves_it_alone(d: Diagnosis, finding_id: str, monkeypatch, tmp_path) -> str:
    """`doctor --fix` on this diagnosis: no task runs for it, and the output says it is left to a person."""
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path))
    snapshot = base.healthy_snapshot()
    monkeypatch.setattr(doctor_run, "diagnose", lambda inventory, request=None: (d, snapshot))
    ran: list = []
    monkeypatch.setattr(doctor_run, "run_playbook", lambda *args, **kwargs: ran.append(args))
    inventory = str(REPO / "inventories" / "two-sparks.yaml")
    result = CliRunner().invoke(cli, ["doctor", inventory, "--fix"], catch_exceptions=False)
    others = {t for f in d.findings if f.severity != "info" and f.remedy and f.remedy.repairable
              for t in f.remedy.tasks}
    assert bool(ran) == bool(others)  # a run only for the other findings' tasks (checked in --json below)
    as_json = CliRunner().invoke(cli, ["doctor", inventory, "--fix", "--json"], catch_exceptions=False)
    report = json.loads(as_json.stdout.splitlines()[-1])  # JSON Lines: the `report` closes them (docs/events.md)
    assert report["event"] == "report" and report["report"] == "doctor"
    errors = [f for f in d.findings if f.id == finding_id and f.is_error]
    if errors:
        if not any(f.remedy.repairable for f in d.findings if f.remedy and f.severity != "info"):
            assert "nothing sparkctl can repair by itself" in result.output
        for f in errors:
            assert f"left alone: {f.node}: {f.id}: {FINDINGS[finding_id].needs_person}" in result.output
        assert {(f["id"], f["node"]) for f in report["fix"]["needs_you"]} >= {(f.id, f.node) for f in errors}
    if errors or others:
        assert set(report["fix"]["ran"]) == others
    else:
        assert "fix" not in report  # a warning or a note a person closes: nothing to run
    return result.output


@pytest.mark.parametrize("finding_id", sorted(FAULTS))
def test_a_persons_finding_says_what_to_do_and_fix_leaves_it_alone(finding_id, monkeypatch, tmp_path):
    d = diagnosed(finding_id)
    says_what_to_do(d, finding_id)
    fix_leaves_it_alone(d, finding_id, monkeypatch, tmp_path)


def test_no_plan_says_what_to_do_and_fix_leaves_it_alone(monkeypatch, tmp_path):
    s = base.healthy_snapshot()
    s.plan, s.plan_error = None, "spark1: no fabric port is Up (no QSFP port has carrier on both twins)"
    d = Diagnosis(checks_fabric.fabric_checks(s), nodes=s.all_nodes)
    says_what_to_do(d, "fabric.no_plan")
    fix_leaves_it_alone(d, "fabric.no_plan", monkeypatch, tmp_path)


def test_ports_differ_is_a_note_and_fix_leaves_it_alone(monkeypatch, tmp_path):
    inv = inventory()
    facts = {"spark1": spark_facts("spark1", up_ports=(1,)), "spark2": spark_facts("spark2", up_ports=(0,))}
    plan, _ = doctor_plan(inv, facts)
    s = Snapshot(inv, facts, {}, {}, plan)
    d = Diagnosis(checks_fabric.check_ports(s), nodes=s.all_nodes)
    assert [(f.id, f.severity) for f in d.findings] == [("fabric.ports_differ", "info")]
    says_what_to_do(d, "fabric.ports_differ")
    fix_leaves_it_alone(d, "fabric.ports_differ", monkeypatch, tmp_path)


def test_a_crashing_check_says_to_report_it_and_fix_leaves_it_alone(monkeypatch, tmp_path):
    def broken(_s):
        raise KeyError("boom")

    monkeypatch.setattr(diagnose_module, "CHECKS", [broken])
    d = diagnose_module.run_checks(base.healthy_snapshot())
    says_what_to_do(d, "doctor.check_failed")
    fix_leaves_it_alone(d, "doctor.check_failed", monkeypatch, tmp_path)


def test_one_stuck_world_restarted_is_history_and_one_that_keeps_getting_stuck_an_error():
    s = base.healthy_snapshot()
    base.fault_serve_stuck(s, times=1)
    (once,) = [f for f in base.diagnose(s).findings if f.id == "serve.stuck"]
    assert once.severity == "info" and "no token for 120s with 2 requests running" in once.evidence
    assert "the head's GPU power 11.5 W" in once.evidence
    s = base.healthy_snapshot()
    base.fault_serve_stuck(s, times=3)
    (again,) = [f for f in base.diagnose(s).findings if f.id == "serve.stuck"]
    assert again.severity == "error" and again.summary.endswith("it keeps getting stuck")
