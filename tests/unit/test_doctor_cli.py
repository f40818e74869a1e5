"""`sparkctl doctor` end to end without a cluster (nodes that refuse on loopback), the report's wording,
the --fix selection, and the support bundle's redaction."""

from __future__ import annotations

import hashlib
import json
import socket
import tarfile

import pytest
from click.testing import CliRunner
from rich.console import Console

from sparkctl.cli.doctor_cmd import render_diagnosis
from sparkctl.cli.main import cli
from sparkctl.doctor.bundle import scrub, write_bundle
from sparkctl.doctor.diagnose import run_checks
from sparkctl.doctor.findings import Diagnosis, Finding
from sparkctl.doctor.fix import repair_selection, tasks_for
from sparkctl.runs.playbooks import bootstrap_graph
from sparkctl.secrets import MASK, forget_secrets, register_secret
from tests.taskkit import doctor_report
from tests.unit.doctor_snapshot_kit import fault_container_exited, fault_mtu, fault_sudo, healthy_snapshot

TOKEN = "hf_" + "Ab1" * 12


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def refusing_inventory(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    port = closed_port()
    path = tmp_path / "inventory.yaml"
    path.write_text(f"""cluster: {{name: t}}
user: nvidia
ssh: {{known_hosts: {tmp_path}/known_hosts, use_ssh_config: false, connect_timeout: 2, port: {port}}}
nodes:
  - {{name: spark1, host: 127.0.0.1}}
  - {{name: spark2, host: 127.0.0.2}}
fabric: {{topology: pair}}
""")
    return path


def test_unreachable_nodes_are_findings_in_json_and_exit_1(refusing_inventory):
    result = CliRunner().invoke(cli, ["doctor", str(refusing_inventory), "--json"])
    assert result.exit_code == 1, result.output
    report = doctor_report(result.stdout)
    assert report["healthy"] is False
    assert [(f["id"], f["node"], f["severity"]) for f in report["findings"]] == [
        ("node.ssh_refused", "spark1", "error"), ("node.ssh_refused", "spark2", "error")]
    assert "connection refused" in report["findings"][0]["evidence"]
    assert report["findings"][0]["fix"]


def test_bundle_from_the_cli_prints_its_sha256(refusing_inventory, tmp_path):
    bundle = tmp_path / "out" / "b.tar.gz"
    bundle.parent.mkdir()  # an output's folder is never created for the user (a typo would pass unseen)
    result = CliRunner().invoke(cli, ["doctor", str(refusing_inventory), "--bundle", str(bundle), "--limit", "spark2"])
    assert result.exit_code == 1
    digest = hashlib.sha256(bundle.read_bytes()).hexdigest()
    assert f"sha256: {digest}" in result.output
    assert oct(bundle.stat().st_mode & 0o777) == "0o600"
    with tarfile.open(bundle) as tar:
        names = tar.getnames()
    assert any(n.endswith("/findings.json") for n in names) and any(n.endswith("/unreachable.json") for n in names)


def test_bundle_to_stdout(refusing_inventory):
    import io

    result = CliRunner().invoke(cli, ["doctor", str(refusing_inventory), "--bundle", "-"])
    assert result.exit_code == 1
    payload = result.stdout_bytes
    digest = hashlib.sha256(payload).hexdigest()
    assert f"sha256: {digest}" in result.stderr and "node.ssh_refused" in result.stderr
    with tarfile.open(fileobj=io.BytesIO(payload)) as tar:
        assert any(n.endswith("/findings.json") for n in tar.getnames())
    refused = CliRunner().invoke(cli, ["doctor", str(refusing_inventory), "--bundle", "-", "--json"])
    assert refused.exit_code == 2 and "both want stdout" in refused.stderr


def test_limit_names_an_unknown_node(refusing_inventory):
    result = CliRunner().invoke(cli, ["doctor", str(refusing_inventory), "--limit", "spark9"])
    assert result.exit_code == 2 and "spark9" in result.output


def test_the_report_groups_by_node_with_evidence_and_fix():
    s = healthy_snapshot()
    fault_mtu(s)
    fault_sudo(s)
    console = Console(record=True, width=200)
    render_diagnosis(console, run_checks(s))
    text = console.export_text()
    assert text.index("spark1") < text.index("node.sudo_password") < text.index("spark2") \
        < text.index("fabric.mtu_mismatch")
    assert "seen: MTU 1500 on enP2p1s0f1np1, planned 9000" in text
    assert "fix:  sparkctl cluster bootstrap" in text and "--only network" in text
    assert "2 error(s)" in text and "unhealthy" in text


def test_fix_selects_the_owning_tasks_and_leaves_the_rest_to_a_person():
    s = healthy_snapshot()
    fault_mtu(s)
    fault_sudo(s)
    fault_container_exited(s)
    only, manual = repair_selection(run_checks(s), bootstrap_graph())
    assert {"network.netplan", "network.verify", "container", "mpi"} <= only
    assert [f.id for f in manual] == ["node.sudo_password"]
    assert tasks_for(Finding("ssh.mesh_broken", "error", "a", "x")) == ("ssh.keys", "ssh.mesh", "ssh.verify")
    assert tasks_for(Finding("node.docker_group", "error", "a", "x")) == ()


def test_fix_repairs_repairable_warnings_too_but_leaves_notes_and_a_persons_warnings():
    d = Diagnosis([Finding("nccl.ib_hca_partial", "warning", "a", "x"), Finding("node.clock_skew", "warning", "a", "x"),
                   Finding("model.absent", "info", "a", "x")], nodes=["a"])
    only, manual = repair_selection(d, bootstrap_graph())
    assert only == {"container", "mpi"} and manual == []


def test_scrub_masks_registered_secrets_and_token_shapes():
    forget_secrets()
    register_secret("sudo-pass-123")
    try:
        text = scrub(f"pw sudo-pass-123 token {TOKEN} HF_TOKEN=abc Authorization: Bearer {'x' * 20}")
    finally:
        forget_secrets()
    assert "sudo-pass-123" not in text and TOKEN not in text and "abc" not in text and "xxxxxxxxxx" not in text
    assert text.count(MASK) == 4


def test_the_bundle_holds_facts_netplan_logs_and_journals_but_no_token(tmp_path):
    s = healthy_snapshot()
    fault_container_exited(s)
    s.probes["spark2"].container_logs = f"starting with HF_TOKEN={TOKEN}\nsshd: Bind to port 2233 failed"
    s.probes["spark1"].serve_log_tail = f"loading {TOKEN}\nNCCL WARN x"
    journal = tmp_path / "20260101T000000.000000Z-bootstrap.jsonl"
    journal.write_text(json.dumps({"event": "log", "message": f"token {TOKEN}"}) + "\n")
    path = tmp_path / "bundle.tar.gz"
    digest = write_bundle(path, run_checks(s), s, journals=[journal])
    assert digest == hashlib.sha256(path.read_bytes()).hexdigest()
    with tarfile.open(path) as tar:
        files = {m.name.split("/", 1)[1]: tar.extractfile(m).read().decode() for m in tar.getmembers()}
    assert {"findings.json", "spark1/facts.json", "spark2/container-trtllm-multinode.json",
            "spark2/container.log", "spark1/serve.log", f"journals/{journal.name}"} <= set(files)
    assert "spark1/netplan/40-cx7.yaml" in files
    assert json.loads(files["findings.json"])["healthy"] is False
    assert all(TOKEN not in body for body in files.values())
    assert "Bind to port 2233 failed" in files["spark2/container.log"]


def test_diagnosis_json_shape():
    d = Diagnosis([Finding("a.b", "warning", "n", "s", "e", "f", "network")], nodes=["n"])
    assert d.to_dict() == {"healthy": True, "findings": [
        {"id": "a.b", "severity": "warning", "node": "n", "summary": "s", "evidence": "e", "fix": "f",
         "phase": "network"}]}
    with pytest.raises(ValueError):
        Finding("a", "fatal", "n", "s")


WIFI_PASSWORD = "correct-horse-battery"
WIFI_PSK = "Wpa2-Psk-Secret-77"
NM_WIFI = f"""network:
  version: 2
  wifis:
    NM-4b1d:
      renderer: NetworkManager
      match: {{name: "wlP9s9"}}
      dhcp4: true
      access-points:
        "Lab WiFi":
          auth:
            key-management: "psk"
            password: "{WIFI_PASSWORD}"
          networkmanager:
            uuid: "4b1d0000-0000-0000-0000-000000000000"
            name: "Lab WiFi"
            passthrough:
              wifi-security.psk: '{WIFI_PSK}'
              wifi-security.psk-flags: "0"
"""


def test_scrub_masks_quoted_values_of_secret_keys():
    text = scrub('password: "correct-horse"\nDB_PASSWORD=\'s p a c e\'\n{"api_key": "k-123456"}\n'
                 'wifi-security.psk: plainpsk99\n"sudo_nopasswd": true')
    assert "correct-horse" not in text and "s p a c e" not in text and "k-123456" not in text
    assert "plainpsk99" not in text
    assert 'password: "********"' in text and '"sudo_nopasswd": true' in text  # JSON stays JSON


def test_a_quoted_password_and_a_wifi_psk_never_reach_the_bundle(tmp_path):
    from sparkctl.facts import NetplanFile

    s = healthy_snapshot()
    s.facts["spark1"].netplan_files.append(NetplanFile("/etc/netplan/90-NM-4b1d.yaml", NM_WIFI, 0o600))
    s.probes["spark1"].serve_log_tail = f'config: {{password: "{WIFI_PASSWORD}"}}'
    path = tmp_path / "bundle.tar.gz"
    write_bundle(path, run_checks(s), s, journals=[])
    with tarfile.open(path) as tar:
        files = {m.name.split("/", 1)[1]: tar.extractfile(m).read().decode() for m in tar.getmembers()}
    assert "spark1/netplan/90-NM-4b1d.yaml" in files and "spark1/facts.json" in files
    for secret in (WIFI_PASSWORD, WIFI_PSK):
        assert [n for n, body in files.items() if secret in body] == []
    assert 'key-management: "psk"' in files["spark1/netplan/90-NM-4b1d.yaml"]  # the rest stays readable
    json.loads(files["spark1/facts.json"])


def test_doctor_registers_the_hf_token_for_redaction(refusing_inventory, monkeypatch):
    from sparkctl.secrets import redact_known

    forget_secrets()
    monkeypatch.setenv("HF_TOKEN", "plain-token-without-a-known-shape")
    try:
        CliRunner().invoke(cli, ["doctor", str(refusing_inventory), "--json"])
        assert redact_known("x plain-token-without-a-known-shape y") == f"x {MASK} y"
    finally:
        forget_secrets()


@pytest.mark.parametrize("command", [["doctor", "{inv}", "--bundle", "{bad}"],
                                     ["serve", "bench", "{inv}", "--output", "{bad}"]])
def test_an_unwritable_output_path_is_refused_up_front(refusing_inventory, tmp_path, command):
    (tmp_path / "a-file").write_text("x")
    bad = str(tmp_path / "a-file" / "out.tar.gz")
    args = [a.format(inv=refusing_inventory, bad=bad) for a in command]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 2, result.output
    assert "a-file is not a directory" in result.output and "Traceback" not in result.output
    assert "node.unreachable" not in result.output  # refused before any diagnosis
    assert len(result.output.strip().splitlines()) <= 2


@pytest.mark.parametrize("command", [["playbooks", "-o", "{bad}"],
                                     ["doctor", "{inv}", "--bundle", "{bad}"],
                                     ["serve", "bench", "{inv}", "--output", "{bad}"]])
def test_an_output_path_in_a_missing_folder_is_refused_not_created(refusing_inventory, tmp_path, command):
    bad = str(tmp_path / "no-such-folder" / "out")
    args = [a.format(inv=refusing_inventory, bad=bad) for a in command]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 2, result.output
    assert "no-such-folder does not exist" in result.output and "internal error" not in result.output
    assert not (tmp_path / "no-such-folder").exists()
    assert len(result.output.strip().splitlines()) <= 2


def test_fix_with_a_limit_repairs_only_the_limited_nodes(refusing_inventory, monkeypatch):
    """`doctor --fix --limit spark2`: both looks diagnose spark2 only, and the repair run changes spark2 only (the
    limit reaches the bootstrap tasks it runs, with Ansible's meaning)."""
    from sparkctl.runs import doctor
    from sparkctl.taskgraph import RunResult

    looks, runs = [], []

    def diagnose(_inventory, request):
        looks.append(request.limit)
        s = healthy_snapshot()
        fault_mtu(s)
        return run_checks(s), s

    def run_playbook(_inventory, graph, request, _emit, *, command):
        runs.append((command, request.limit, set(request.only)))
        return RunResult(["spark2"], [], {}, check_mode=False, duration=0.0)

    monkeypatch.setattr(doctor, "diagnose", diagnose)
    monkeypatch.setattr(doctor, "run_playbook", run_playbook)
    result = CliRunner().invoke(cli, ["doctor", str(refusing_inventory), "--fix", "--limit", "spark2", "--json"])
    assert looks == [{"spark2"}, {"spark2"}], result.output
    assert len(runs) == 1 and runs[0][:2] == ("doctor --fix", {"spark2"}), runs
    assert {"network.netplan", "network.verify"} <= runs[0][2]
