"""sparkctl doctor on a bootstrapped lab: clean when healthy, read-only, each seeded fault a person must close found on
the right node and left alone by --fix, a node powered off mid-diagnosis, and a support bundle without the planted
token. (Every repairable finding: tests/lab/test_doctor_repairs.py.)"""

from __future__ import annotations

import tarfile
import threading

import pytest
from click.testing import CliRunner

from sparkctl.cli.main import cli
from sparkctl.lab.reboot import forget_memory, power_off
from tests.lab.conftest import poll
from tests.lab.doctor_kit import doctor, errors
from tests.lab.seeds_kit import faults, system_faults

pytestmark = pytest.mark.lab

CONTAINER = "trtllm-multinode"
PLANTED = "hf_" + "Zq8" * 12  # shaped like a Hugging Face token, registered nowhere


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


#: The checks of the nodes' own software (issue 13, section 4): on a healthy lab, silent at every severity.
SYSTEM_CHECKS = {"node.page_cache", "node.swap_in_use", "node.cma_reserved", "node.kernel_mismatch",
                 "gpu.driver_mismatch", "gpu.driver_too_old", "roce.firmware_mismatch", "roce.gid_missing",
                 "roce.port_inactive", "env.host_setting", "env.file_setting", "env.image_setting", "ssh.sshd_dropin",
                 "fabric.bandwidth_regression"}


def machine_memory_excuses() -> set[str]:
    """The memory findings the machine itself warrants: lab nodes share this machine's memory (their /proc/meminfo
    is its own), so a page cache over the check's share or swap in use here is rightly seen on every node."""
    from sparkctl.doctor.checks.node import PAGE_CACHE_FRACTION, SWAP_USED_BYTES

    kb = {}
    with open("/proc/meminfo") as handle:
        for line in handle:
            name, _, rest = line.partition(":")
            kb[name] = int(rest.split()[0]) if rest.split() else 0
    out = set()
    if kb.get("Cached", 0) > kb.get("MemTotal", 0) * PAGE_CACHE_FRACTION * 0.9:  # it moves while doctor reads it
        out.add("node.page_cache")
    if (kb.get("SwapTotal", 0) - kb.get("SwapFree", 0) - kb.get("SwapCached", 0)) * 1024 > SWAP_USED_BYTES * 0.9:
        out.add("node.swap_in_use")
    return out


def test_a_healthy_lab_has_no_errors_and_doctor_changes_nothing(lab):
    before = {n.name: node_state(lab, n.name) for n in lab.nodes}
    report = doctor(lab)
    assert report["healthy"], errors(report)
    heard = {(f["id"], f["node"], f["severity"]) for f in report["findings"] if f["id"] in SYSTEM_CHECKS}
    excused = machine_memory_excuses()
    assert not {h for h in heard if h[0] not in excused}, heard
    for f in report["findings"]:
        assert set(f) >= {"id", "severity", "node", "summary", "evidence", "fix", "phase"}
    assert {n.name: node_state(lab, n.name) for n in lab.nodes} == before


def test_each_fault_a_person_must_close_is_found_left_alone_by_fix_and_gone_once_closed(lab):
    """The repairable ones: tests/lab/test_doctor_repairs.py."""
    problems = []
    for fault in faults():
        seeded = lab.exec(fault.node, fault.seed)
        assert seeded.returncode == 0, (fault.name, seeded.stderr)
        report = doctor(lab)
        found = [f for f in report["findings"] if f["id"] == fault.expect and f["node"] == fault.node]
        other_errors = {e for e in errors(report) if e != (fault.expect, fault.node)}
        if not found or not all(f["fix"] and f["closed_by"].get("person") for f in found) or other_errors:
            problems.append(f"{fault.name}: found {found}, other errors {sorted(other_errors)}")
        if not fault.warning and report["healthy"]:
            problems.append(f"{fault.name}: reported healthy")
        if not fault.warning:
            fixed = doctor(lab, "--fix")
            left = [(f["id"], f["node"]) for f in fixed.get("fix", {}).get("needs_you", [])]
            if (fault.expect, fault.node) not in left or (fault.expect, fault.node) not in errors(fixed):
                problems.append(f"{fault.name}: --fix did not leave it to a person: {fixed.get('fix')}")
        lab.exec(fault.node, fault.manual)
        # once the person has done their part, what follows from it (a container left stopped) sparkctl repairs
        after = doctor(lab, "--fix") if not fault.warning else doctor(lab)
        if not after["healthy"] or any(f["id"] == fault.expect and f["node"] == fault.node
                                       for f in after["findings"]):
            problems.append(f"{fault.name}: still there once closed: {sorted(errors(after))}")
            # leave the lab clean for the next fault
            CliRunner().invoke(cli, ["cluster", "bootstrap", str(lab.inventory_path)])
    assert not problems, "\n".join(problems)


def test_each_system_fault_is_found_on_its_node_and_gone_once_undone(lab):
    problems = []
    for fault in system_faults():
        seeded = lab.exec(fault.node, fault.seed)
        assert seeded.returncode == 0, (fault.name, seeded.stderr)
        try:
            report = doctor(lab)
        finally:
            lab.exec(fault.node, fault.manual)
        found = [f for f in report["findings"] if f["id"] == fault.expect and f["node"] == fault.node]
        other_errors = {e for e in errors(report) if e != (fault.expect, fault.node)
                        and e not in {(a, fault.node) for a in fault.along}}
        if not found or not all(f["fix"] and f["evidence"] for f in found) or other_errors:
            problems.append(f"{fault.name}: found {bool(found)}, other errors {sorted(other_errors)}")
        if found and (found[0]["severity"] == "error") == fault.warning:
            problems.append(f"{fault.name}: severity {found[0]['severity']}")
        after = doctor(lab)
        if not after["healthy"] or any(f["id"] == fault.expect for f in after["findings"]):
            problems.append(f"{fault.name}: still there once undone: {sorted(errors(after))}")
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
    # a power cut once doctor's session to the node is open: every process of the node dies, and its interfaces
    # go dark (a powered-off Spark answers nothing; a lab node whose processes alone died would refuse instead)
    def power_off_once_connected():
        poll(lambda: lab.exec("spark2", "ss -Htn state established '( sport = :22 )'").stdout.strip(),
             timeout=60, interval=0.02)
        power_off(lab, "spark2", hard=True)
        forget_memory(lab, "spark2")

    timer = threading.Thread(target=power_off_once_connected)
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
