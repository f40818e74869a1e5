"""sparkctl doctor on a bootstrapped lab: clean when healthy, read-only, each seeded fault found on the right node
with a fix that works, a node powered off mid-diagnosis, and a support bundle without the planted token."""

from __future__ import annotations

import os
import signal
import tarfile
import threading
import time
from dataclasses import dataclass

import pytest
from click.testing import CliRunner

from sparkctl.cli.main import cli
from tests.lab.conftest import poll
from tests.taskkit import doctor_report

pytestmark = pytest.mark.lab

CONTAINER = "trtllm-multinode"
PLANTED = "hf_" + "Zq8" * 12  # shaped like a Hugging Face token, registered nowhere


def doctor(lab, *args: str) -> dict:
    result = CliRunner().invoke(cli, ["doctor", str(lab.inventory_path), "--json", *args], catch_exceptions=False)
    report = doctor_report(result.stdout)
    assert result.exit_code == (0 if report["healthy"] else 1), result.output
    return report


def errors(report: dict) -> set[tuple[str, str]]:
    return {(f["id"], f["node"]) for f in report["findings"] if f["severity"] == "error"}


def node_state(lab, node: str) -> str:
    """What doctor must never change: links, addresses, netplan, keys, the container and its files."""
    script = (f"ip -br addr; ip -br link; sha256sum /etc/netplan/*; sha256sum /home/nvidia/.ssh/*; "
              f"find /home/nvidia/.local/state/sparkctl -printf '%p %s %T@\\n' | sort; "
              f"docker inspect -f '{{{{.Id}}}} {{{{.State.Status}}}} {{{{.RestartCount}}}}' {CONTAINER}; "
              f"docker exec {CONTAINER} sh -c 'sha256sum /etc/openmpi-hostfile /root/.ssh/*'")
    return lab.exec(node, script).stdout


@pytest.fixture(scope="module")
def lab(lab_factory):
    lab = lab_factory(2, "pair", port=1)
    result = CliRunner().invoke(cli, ["cluster", "bootstrap", str(lab.inventory_path)], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return lab


def cluster_name(lab) -> str:
    return next(line.split(":", 1)[1].strip() for line in lab.inventory_path.read_text().splitlines()
                if line.strip().startswith("name:") and "spark" not in line)


def test_a_healthy_lab_has_no_errors_and_doctor_changes_nothing(lab):
    before = {n.name: node_state(lab, n.name) for n in lab.nodes}
    started = time.monotonic()
    report = doctor(lab)
    elapsed = time.monotonic() - started
    assert report["healthy"], errors(report)
    for f in report["findings"]:
        assert set(f) >= {"id", "severity", "node", "summary", "evidence", "fix", "phase"}
    assert {n.name: node_state(lab, n.name) for n in lab.nodes} == before
    assert elapsed < 30, f"doctor took {elapsed:.1f}s"


@dataclass(frozen=True)
class Fault:
    name: str
    node: str
    seed: str
    expect: str
    #: None: `doctor --fix` repairs it; else the command (run as root on the node) a person would run
    manual: str | None = None
    #: the finding is a warning (the lab stays "healthy"), found all the same
    warning: bool = False


def faults(cluster: str) -> list[Fault]:
    return [
        Fault("mtu", "spark2", "ip link set enP2p1s0f1np1 mtu 1500", "fabric.mtu_mismatch"),
        Fault("link-local", "spark1", "ip addr add 169.254.3.3/16 dev enp1s0f1np1", "fabric.link_local"),
        Fault("twins-one-subnet", "spark1", "ip addr add 192.168.100.50/24 dev enP2p1s0f1np1",
              "fabric.twins_same_subnet"),
        Fault("address-missing", "spark2", "ip addr del 192.168.101.11/24 dev enP2p1s0f1np1",
              "fabric.address_missing"),
        Fault("address-foreign", "spark2", "ip addr add 10.77.0.2/24 dev enp1s0f1np1", "fabric.address_foreign"),
        Fault("netplan-conflict", "spark1",
              "umask 077; printf 'network:\\n  version: 2\\n  ethernets:\\n    enp1s0f1np1:\\n"
              "      addresses: [192.168.100.77/24]\\n' > /etc/netplan/90-NM-lab.yaml", "netplan.conflict"),
        Fault("ssh-mesh", "spark2", f"sed -i '/sparkctl-{cluster}@/d' /home/nvidia/.ssh/authorized_keys",
              "ssh.mesh_broken"),
        Fault("container-exited", "spark2", f"docker stop -t 1 {CONTAINER}", "container.exited"),
        Fault("container-missing", "spark1", f"docker rm -f {CONTAINER}", "container.missing"),
        Fault("hostfile", "spark2", f"docker exec {CONTAINER} sh -c 'echo 10.9.9.9 > /etc/openmpi-hostfile'",
              "mpi.hostfile_mismatch"),
        Fault("container-ssh", "spark2", f"docker exec {CONTAINER} sh -c ': > /root/.ssh/authorized_keys'",
              "container.ssh_broken"),
        Fault("port-taken", "spark2",
              f"docker stop -t 1 {CONTAINER} >/dev/null; setsid -f python3 -m http.server 2233 >/dev/null 2>&1; "
              "sleep 1", "port.taken",
              manual="kill $(ss -ltnpH 'sport = :2233' | sed -n 's/.*pid=\\([0-9]*\\).*/\\1/p')"),
        Fault("docker-group", "spark1", "gpasswd -d nvidia docker", "node.docker_group",
              manual="usermod -aG docker nvidia"),
        Fault("sudo-password", "spark2", "sed -i 's/NOPASSWD: ALL/ALL/' /etc/sudoers.d/50-lab-nvidia",
              "node.sudo_password", manual="sed -i 's/(ALL:ALL) ALL/(ALL:ALL) NOPASSWD: ALL/' "
                                            "/etc/sudoers.d/50-lab-nvidia"),
        Fault("port-down", "spark2", "ip link set enp1s0f1np1 down", "fabric.port_down",
              manual="ip link set enp1s0f1np1 up"),
        Fault("ssh-auth", "spark2", "cp /home/nvidia/.ssh/authorized_keys /root/ak && "
              "sed -i '/lab-controller/d' /home/nvidia/.ssh/authorized_keys", "node.ssh_auth",
              manual="cp /root/ak /home/nvidia/.ssh/authorized_keys"),
        Fault("hf-cache-full", "spark1", "mount -t tmpfs -o size=1m tmpfs /home/nvidia/.cache/huggingface",
              "disk.hf_cache_low", manual="umount /home/nvidia/.cache/huggingface", warning=True),
    ]


def test_each_seeded_fault_is_found_on_its_node_and_fixed(lab):
    cluster = cluster_name(lab)
    problems = []
    for fault in faults(cluster):
        seeded = lab.exec(fault.node, fault.seed)
        assert seeded.returncode == 0, (fault.name, seeded.stderr)
        report = doctor(lab)
        found = [f for f in report["findings"] if f["id"] == fault.expect and f["node"] == fault.node]
        other_errors = {e for e in errors(report) if e != (fault.expect, fault.node)}
        if not found or not all(f["fix"] for f in found) or other_errors:
            problems.append(f"{fault.name}: found {bool(found)}, other errors {sorted(other_errors)}")
        if not fault.warning and report["healthy"]:
            problems.append(f"{fault.name}: reported healthy")
        if fault.manual:
            lab.exec(fault.node, fault.manual)
        after = doctor(lab, "--fix") if not fault.warning else doctor(lab)
        if not after["healthy"] or any(f["id"] == fault.expect and f["node"] == fault.node
                                       for f in after["findings"]):
            problems.append(f"{fault.name}: still there after the fix: {sorted(errors(after))}")
            # leave the lab clean for the next fault
            CliRunner().invoke(cli, ["cluster", "bootstrap", str(lab.inventory_path)])
    assert not problems, "\n".join(problems)


def test_the_bundle_holds_the_facts_and_findings_but_no_planted_token(lab, tmp_path):
    log = "/home/nvidia/.local/state/sparkctl"
    lab.exec("spark1", f"d=$(ls -d {log}/*/run | head -n 1)/serve; mkdir -p $d; "
                       f"printf 'loading with HF_TOKEN={PLANTED}\\nNCCL WARN something\\ntoken {PLANTED}\\n' "
                       f"> $d/serve.log")
    try:
        path = tmp_path / "bundle.tar.gz"
        report = doctor(lab, "--bundle", str(path))
    finally:
        lab.exec("spark1", f"rm -f {log}/*/run/serve/serve.log")
    assert len(report["bundle"]["sha256"]) == 64
    with tarfile.open(path) as tar:
        names = tar.getnames()
        blob = b"".join(tar.extractfile(m).read() for m in tar.getmembers() if m.isfile())
    assert any(n.endswith("spark1/facts.json") for n in names)
    assert any(n.endswith("findings.json") for n in names)
    assert any("/netplan/" in n for n in names)
    assert any(n.endswith("spark1/serve.log") for n in names)
    assert PLANTED.encode() not in blob
    assert b"NCCL WARN something" in blob


def test_a_node_powered_off_mid_diagnosis_is_unreachable_and_the_rest_is_diagnosed(lab):
    # power off = the node's init dies (the lab started that process; nothing else is touched)
    timer = threading.Timer(0.3, lambda: os.kill(lab.pid_of("spark2"), signal.SIGKILL))
    timer.start()
    try:
        report = doctor(lab)
    finally:
        timer.join()
    if not any(f["id"] == "node.unreachable" for f in report["findings"]):
        # powered off after doctor had finished with it: the next look must see it gone
        assert poll(lambda: lab.exec("spark1", "true").returncode == 0, timeout=5)
        report = doctor(lab)
    ids = {(f["id"], f["node"]) for f in report["findings"]}
    assert ("node.unreachable", "spark2") in ids
    down = next(f for f in report["findings"] if f["id"] == "node.unreachable")
    assert down["fix"] and down["evidence"]
    assert not report["healthy"]
    # spark1 was still diagnosed: its facts-based findings are there, and nothing blames spark1 for spark2
    assert not {e for e in errors(report) if e[1] == "spark1"}, errors(report)
