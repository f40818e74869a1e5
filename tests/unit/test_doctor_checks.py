"""doctor's PURE checks: a healthy two-Spark snapshot has no errors; each fault gives its own id on its node."""

from __future__ import annotations

import copy
import dataclasses

import pytest

from sparkctl.doctor.diagnose import run_checks
from sparkctl.doctor.findings import CLUSTER
from sparkctl.doctor.snapshot import ModelCache, NodeProbe, Snapshot, SshProbe, doctor_plan
from sparkctl.facts import ContainerInfo, Lldp
from sparkctl.plan.container import SPEC_LABEL
from sparkctl.rules.twins import SET_DOWN, twin_faults
from tests.taskkit import inventory, spark_facts
from tests.unit.doctor_snapshot_kit import (
    GiB_KB,
    diagnose,
    fault_address_duplicate,
    fault_address_foreign,
    fault_address_missing,
    fault_collector_down,
    fault_container_exited,
    fault_container_missing,
    fault_container_restarting,
    fault_container_ssh,
    fault_docker_broken,
    fault_docker_group,
    fault_env_absent,
    fault_env_management,
    fault_env_unset,
    fault_gateway_down,
    fault_hostfile,
    fault_ib_hca,
    fault_interface_missing,
    fault_jumbo,
    fault_link_local,
    fault_model_changed,
    fault_model_incomplete,
    fault_mtu,
    fault_netplan_conflict,
    fault_no_carrier,
    fault_not_ssh,
    fault_port_down,
    fault_port_taken,
    fault_serve_degenerate,
    fault_serve_down,
    fault_serve_health,
    fault_socket_fallback,
    fault_spec_drift,
    fault_ssh_auth,
    fault_ssh_mesh,
    fault_ssh_no_key,
    fault_ssh_refused,
    fault_sudo,
    fault_twins_same_subnet,
    fault_unit_disabled,
    fault_unit_failed,
    fault_unit_looping,
    fault_unit_missing,
    fault_unreachable,
    fault_user,
    healthy_snapshot,
    with_system_probes,
)


def errors(s: Snapshot) -> set[tuple[str, str]]:
    return {(f.id, f.node) for f in diagnose(s).errors}


def test_a_healthy_cluster_has_no_findings_at_all():
    d = diagnose(healthy_snapshot())
    assert d.healthy and d.findings == [], d.findings
    assert d.to_dict() == {"healthy": True, "findings": []}
    assert [(r.node, r.port, r.far, r.source) for r in d.cabling.rows if r.up] == [
        ("spark1", 1, "spark2 port 1 (enp1s0f1np1, enP2p1s0f1np1)", "lldp (spark1, spark2)"),
        ("spark2", 1, "spark1 port 1 (enp1s0f1np1, enP2p1s0f1np1)", "lldp (spark1, spark2)")]


def test_a_node_without_lldp_is_a_note_and_its_ports_are_seen_from_the_other_end():
    s = healthy_snapshot()
    s.facts["spark2"].lldp = Lldp("stopped", "lldpd is not running")
    d = diagnose(s)
    assert d.healthy and {(f.id, f.node, f.severity) for f in d.findings} == {
        ("fabric.lldp_unavailable", "spark2", "info")}
    assert "apt-get install lldpd" in d.findings[0].fix
    assert d.cabling.row("spark2", 1).source == "lldp (spark1)"


CASES = [
    (fault_mtu, "fabric.mtu_mismatch", "spark2"),
    (fault_link_local, "fabric.link_local", "spark1"),
    (fault_twins_same_subnet, "fabric.twins_same_subnet", "spark1"),
    (fault_address_missing, "fabric.address_missing", "spark2"),
    (fault_address_foreign, "fabric.address_foreign", "spark2"),
    (fault_netplan_conflict, "netplan.conflict", "spark1"),
    (fault_port_down, "fabric.port_down", "spark2"),
    (fault_no_carrier, "fabric.no_carrier", "spark1"),
    (fault_interface_missing, "fabric.interface_missing", "spark2"),
    (fault_jumbo, "fabric.jumbo_ping", "spark2"),
    (fault_ssh_mesh, "ssh.mesh_broken", "spark2"),
    (fault_container_exited, "container.exited", "spark2"),
    (fault_container_missing, "container.missing", "spark2"),
    (fault_container_restarting, "container.restarting", "spark2"),
    (fault_spec_drift, "container.spec_drift", "spark1"),
    (fault_port_taken, "port.taken", "spark2"),
    (fault_env_absent, "env.iface_absent", "spark2"),
    (fault_env_management, "env.management_iface", "spark1"),
    (fault_ib_hca, "nccl.ib_hca_missing", "spark2"),
    (fault_env_unset, "env.unset", "spark2"),
    (fault_hostfile, "mpi.hostfile_mismatch", "spark2"),
    (fault_container_ssh, "container.ssh_broken", "spark2"),
    (fault_unreachable, "node.unreachable", "spark2"),
    (fault_ssh_auth, "node.ssh_auth", "spark2"),
    (fault_ssh_no_key, "node.ssh_auth", "spark2"),
    (fault_not_ssh, "node.not_ssh", "spark2"),
    (fault_ssh_refused, "node.ssh_refused", "spark2"),
    (fault_user, "node.user_mismatch", "spark2"),
    (fault_sudo, "node.sudo_password", "spark1"),
    (fault_docker_group, "node.docker_group", "spark2"),
    (fault_docker_broken, "node.docker_broken", "spark2"),
    (fault_model_incomplete, "model.incomplete", "spark2"),
    (fault_serve_down, "serve.down", "spark1"),
    (fault_gateway_down, "serve.gateway_down", "spark1"),
    (fault_collector_down, "serve.collector_down", "spark1"),
    (fault_unit_missing, "serve.unit_missing", "spark1"),
    (fault_unit_failed, "serve.unit_failed", "spark1"),
    (fault_unit_looping, "serve.unit_looping", "spark1"),
    (fault_serve_health, "serve.health", "spark1"),
    (fault_serve_degenerate, "serve.degenerate", "spark1"),
    (fault_socket_fallback, "nccl.socket_fallback", "spark2"),
]


@pytest.mark.parametrize(("fault", "finding", "node"), CASES, ids=[c[1] for c in CASES])
def test_each_fault_is_exactly_one_error_id_on_its_node_with_a_fix(fault, finding, node):
    s = healthy_snapshot()
    fault(s)
    d = diagnose(s)
    assert {(f.id, f.node) for f in d.errors} == {(finding, node)}, [(f.id, f.node, f.evidence) for f in d.errors]
    for f in d.errors:
        assert f.fix and f.evidence and f.summary
    assert not d.healthy


def test_files_changed_since_they_were_verified_are_a_warning_with_the_model_phase_as_fix():
    s = healthy_snapshot()
    fault_model_changed(s)
    d = diagnose(s)
    (found,) = [f for f in d.findings if f.id == "model.changed"]
    assert (found.node, found.severity) == ("spark2", "warning") and not d.errors
    assert found.summary == ("2 file(s) of nvidia/Qwen3-235B-A22B-FP4 changed since they were verified against the "
                             "hashes the Hub recorded")
    assert "--only model" in found.fix and "sent again from the head" in found.fix


def test_a_twin_without_carrier_toward_a_node_that_does_not_answer_blames_that_node_not_this_one():
    """A node powered off leaves its cables without carrier: its peer's twins (and their RoCE ports) are told as
    information beside node.unreachable, not as the peer's errors (a dead cable between two nodes that answer
    stays an error)."""
    s = healthy_snapshot()
    fault_unreachable(s)
    for twin in ("enp1s0f1np1", "enP2p1s0f1np1"):
        nic = s.facts["spark1"].interfaces[twin]
        nic.operstate, nic.carrier, nic.flags, nic.addresses = "DOWN", False, ["NO-CARRIER", "UP"], []
    d = diagnose(s)
    assert {(f.id, f.node) for f in d.errors} == {("node.unreachable", "spark2")}
    (note,) = [f for f in d.findings if f.id == "fabric.no_carrier"]
    assert note.node == "spark1" and note.severity == "info"
    assert "spark2 does not answer (node.unreachable)" in note.evidence and "once spark2 answers" in note.fix
    dead = healthy_snapshot()
    fault_no_carrier(dead)
    assert [(f.id, f.severity) for f in diagnose(dead).errors] == [("fabric.no_carrier", "error")]
    # read a moment earlier, the twins still Up but their RoCE ports already down: the same silent node explains it
    early = with_system_probes(healthy_snapshot())
    fault_unreachable(early)
    for hca in early.probes["spark1"].system.hcas.values():
        hca.state = "PORT_DOWN"
    assert {(f.id, f.node) for f in diagnose(early).errors} == {("node.unreachable", "spark2")}


def test_a_twin_set_down_is_one_finding_with_what_it_causes_under_it():
    s = healthy_snapshot()
    fault_port_down(s)
    (f,) = diagnose(s).errors
    assert (f.id, f.node, f.summary) == ("fabric.port_down", "spark2",
                                          "fabric twin enp1s0f1np1 set down (administratively down)")
    assert f.evidence.startswith("spark2 enp1s0f1np1 is administratively down; the network phase (network.netplan) "
                                 "brings it Up")
    assert f.fix.endswith("--only network") and f.remedy.repairable
    assert f.details == (
        "spark1 enp1s0f1np1 has no carrier because spark2's end is administratively down",
        "spark2 enp1s0f1np1 is without its address 192.168.100.11/24 (the renderer gives it back with the carrier)",
        "spark1 enp1s0f1np1 is without its address 192.168.100.10/24 (the renderer gives it back with the carrier)",
        "the jumbo ping spark1 enp1s0f1np1 -> spark2 192.168.100.11 fails",
        "ssh from spark1 to spark2 (192.168.100.11) fails: No route to host")
    assert not any("cable" in text for text in (f.summary, f.evidence, f.fix, *f.details))


def test_a_dead_cable_is_said_once_with_both_ends():
    s = healthy_snapshot()
    fault_no_carrier(s)
    (f,) = diagnose(s).errors
    assert f.evidence.startswith("spark1 enP2p1s0f1np1 has no carrier with both ends up (spark2's end "
                                 "enP2p1s0f1np1 not set down): the cable or the port")
    assert f.details[0] == "spark2 enP2p1s0f1np1 has no carrier either (the same cable)"
    assert f.fix == "reseat or replace the QSFP cable between spark1 port 1 and spark2 port 1"
    assert f.remedy.kind == "cable"


def test_the_cable_in_another_port_is_named_on_its_node():
    s = healthy_snapshot()
    s.inventory = s.inventory.model_copy(deep=True)
    s.inventory.fabric.port = 0
    d = diagnose(s)
    # one cable, in port 1 at both ends: one finding, on the first node, the other end under it
    (f,) = [f for f in d.errors if f.id == "fabric.wrong_port"]
    assert f.node == "spark1"
    assert "the cable is in port 1 of spark1, the inventory plans port 0" in f.evidence
    assert f.details[0] == ("spark2 enp1s0f0np0 and enP2p1s0f0np0 have no carrier: the cable is in port 1 of spark2, "
                            "the inventory plans port 0")
    assert f.fix == "move the cable to port 0 on both nodes, or set fabric.port: auto in the inventory"


def test_a_far_end_set_down_is_never_a_finding_of_its_own():
    """spark1's twin lost its carrier because spark2's end is set down (FAR_END_DOWN): that is said under
    spark2's own fault, the root, and never as a finding on spark1."""
    s = healthy_snapshot()
    fault_port_down(s)
    faults = twin_faults(s.inventory, s.plan.fabric, s.facts)
    assert [(f.node, f.cause) for f in faults] == [("spark2", SET_DOWN)]
    assert faults[0].consequences == ("spark1 enp1s0f1np1 has no carrier because spark2's end is "
                                      "administratively down",)
    assert [(f.id, f.node) for f in diagnose(s).errors if f.id.startswith("fabric.")] == [
        ("fabric.port_down", "spark2")]


def test_a_far_end_read_before_its_operstate_moved_is_already_without_carrier():
    """The kernel drops the far end's carrier the moment a twin is set down and moves its operstate later (its
    linkwatch work): a doctor run in between reads spark1's twin as operstate UP without LOWER_UP, and still
    says that under spark2's fault."""
    s = healthy_snapshot()
    fault_port_down(s)
    early = s.facts["spark1"].interfaces["enp1s0f1np1"]
    early.operstate, early.carrier, early.flags = "UP", False, ["BROADCAST", "MULTICAST", "UP"]
    assert not early.up
    faults = twin_faults(s.inventory, s.plan.fabric, s.facts)
    assert [(f.node, f.cause) for f in faults] == [("spark2", SET_DOWN)]
    assert faults[0].consequences == ("spark1 enp1s0f1np1 has no carrier because spark2's end is "
                                      "administratively down",)


def test_nccl_ib_hca_leaving_out_a_twin_is_one_warning_not_a_spec_drift_too():
    s = healthy_snapshot()
    s.facts["spark1"].containers["trtllm-multinode"].env["NCCL_IB_HCA"] = "rocep1s0f1"
    d = diagnose(s)
    assert d.healthy and [(f.id, f.node, f.severity) for f in d.findings] == [
        ("nccl.ib_hca_partial", "spark1", "warning")]


def test_address_duplicate_is_reported_on_both_owners_with_what_fails_because_of_it():
    s = healthy_snapshot()
    fault_address_duplicate(s)
    # what the lab shows: the pings and logins to the address reach the wrong node or none
    s.probes["spark2"].pings[0].verdict = "dead"
    s.probes["spark2"].ssh[0] = SshProbe("spark1", "192.168.100.10", False, "Host key verification failed.")
    s.probes["spark1"].container_ssh[0] = SshProbe("spark2", "root@192.168.100.11", False, "Connection timed out")
    s.probes["spark2"].container_ssh[0] = SshProbe("spark1", "root@192.168.100.10", False, "Connection refused")
    assert errors(s) == {("fabric.address_duplicate", "spark1"), ("fabric.address_duplicate", "spark2"),
                         ("fabric.address_extra", "spark2")}
    dup = next(f for f in diagnose(s).errors if f.id == "fabric.address_duplicate")
    assert dup.details == (
        "the jumbo ping spark2 enp1s0f1np1 -> spark1 192.168.100.10 fails",
        "ssh from spark2 to spark1 (192.168.100.10) fails: Host key verification failed.",
        "ssh from spark2's container to spark1's container (root@192.168.100.10) fails: Connection refused",
        "ssh from spark1's container to spark2's container (root@192.168.100.11) fails: Connection timed out")


def test_warnings_clock_memory_page_cache_disk_speed_and_bad_release():
    s = healthy_snapshot()
    s.facts["spark2"].time += 30
    s.facts["spark1"].mem_available_kb = 5 * GiB_KB
    s.facts["spark2"].page_cache_kb = 60 * GiB_KB
    s.facts["spark2"].hf_cache_free_bytes = 5 * 10**9
    s.facts["spark1"].interfaces["enp1s0f1np1"].speed_mbps = 100_000
    s.inventory = s.inventory.model_copy(deep=True)
    s.inventory.container.image = "nvcr.io/nvidia/tensorrt-llm/release:1.3.0rc13"
    d = diagnose(s)
    warnings = {(f.id, f.node) for f in d.findings if f.severity == "warning"}
    assert {("node.clock_skew", "spark2"), ("node.low_memory", "spark1"), ("node.page_cache", "spark2"),
            ("disk.hf_cache_low", "spark2"), ("fabric.speed_low", "spark1"),
            ("image.known_bad_release", CLUSTER)} <= warnings
    cache = next(f for f in d.findings if f.id == "node.page_cache")
    assert "drop_caches" in cache.fix
    # the release change also drifts every container from the plan: that is an error, the rest are warnings
    assert {f.id for f in d.errors} == {"container.spec_drift"}


def test_hf_token_missing_is_an_error_for_a_gated_repo_still_to_download(tmp_path):
    s = healthy_snapshot()
    s.probes["spark2"].hf_token_file = False
    assert diagnose(s).healthy  # everything is downloaded: no token needed
    s.probes["spark2"].models[0] = ModelCache("meta-llama/Llama-3.3-70B-Instruct", "absent")
    found = [f for f in diagnose(s).findings if f.id == "hf.token_missing"]
    assert [(f.node, f.severity) for f in found] == [("spark2", "error")]
    assert "HF_TOKEN" in found[0].fix


def test_nccl_warn_lines_are_reported():
    s = healthy_snapshot()
    s.probes["spark1"].nccl_log = ("NCCL INFO NCCL version 2.28.9\n"
                                   "host:1:1 [0] NCCL WARN Bootstrap : no socket interface found\n")
    d = diagnose(s)
    assert ("nccl.warn", "spark1") in {(f.id, f.node) for f in d.errors}


def test_port_taken_on_the_engine_s_port_names_the_process():
    s = healthy_snapshot()
    fault_serve_down(s)
    s.probes["spark1"].port_owners[18355] = "nginx (pid 5)"
    found = [f for f in diagnose(s).errors]
    assert [(f.id, f.node) for f in found] == [("port.taken", "spark1")] and "nginx (pid 5)" in found[0].summary


def test_a_server_stopped_by_serve_stop_is_a_note_and_a_warning_not_an_error():
    s = healthy_snapshot()
    fault_unit_disabled(s)
    d = diagnose(s)
    assert d.healthy and d.errors == []
    found = {f.id: f for f in d.findings}
    assert found["serve.down"].severity == "info" and "stopped by `sparkctl serve stop`" in found["serve.down"].evidence
    assert found["serve.unit_disabled"].severity == "warning"
    assert "stays so across reboots" in found["serve.unit_disabled"].summary


def test_a_looping_unit_says_how_often_how_it_ended_and_the_likely_cause():
    s = healthy_snapshot()
    fault_unit_looping(s)
    (f,) = diagnose(s).errors
    assert f.evidence.startswith("2 runs in a row ended by themselves within 600 s (restarts: 2, now activating "
                                 "(auto-restart)); last end: 2026-11-27T20:35:39Z, exited with status 1 after 97s; "
                                 "likely cause (serve log): ")
    assert "serve logs" in f.fix and f.fix.endswith("--only serve starts it from the planned files")
    # one early end, or a server that answers again: not looping
    s.probes["spark1"].unit_exits = "\n".join(s.probes["spark1"].unit_exits.splitlines()[:2])
    assert [f.id for f in diagnose(s).errors] == ["serve.down"]


def test_serve_down_is_only_a_note_before_sparkctl_ever_served():
    s = healthy_snapshot()
    fault_serve_down(s)
    s.probes["spark1"].serve_log_exists = False
    d = diagnose(s)
    assert d.healthy and ("serve.down", "info") in {(f.id, f.severity) for f in d.findings}


def test_a_crashing_check_is_reported_not_raised(monkeypatch):
    from sparkctl.doctor import diagnose as module

    def broken(_s):
        raise KeyError("boom")

    monkeypatch.setattr(module, "CHECKS", [broken, *module.CHECKS])
    d = run_checks(healthy_snapshot())
    assert [f.id for f in d.findings] == ["doctor.check_failed"] and d.healthy


def test_findings_are_grouped_by_node_errors_first_cluster_last():
    s = healthy_snapshot()
    fault_mtu(s)
    fault_sudo(s)
    s.facts["spark1"].interfaces["enp1s0f1np1"].speed_mbps = 100_000
    s.inventory = copy.deepcopy(s.inventory)
    s.inventory.container.image = "x/y:1.3.0rc13"
    d = diagnose(s)
    nodes = [f.node for f in d.findings]
    assert nodes == sorted(nodes, key=lambda n: (n == CLUSTER, n))
    spark1 = [f.severity for f in d.findings if f.node == "spark1"]
    assert spark1 == sorted(spark1, key=["error", "warning", "info"].index)


def test_a_healthy_single_spark_has_no_findings():
    inv = inventory("single-spark.yaml")
    name = inv.nodes[0].name
    f = spark_facts(name, mtu=9000)
    plan, _ = doctor_plan(inv, {name: f})
    spec = plan.nodes[name].container
    f.containers = {spec.name: ContainerInfo(
        spec.name, exists=True, running=True, status="running", image=spec.image, env=dict(spec.env),
        labels={SPEC_LABEL: spec.spec_hash()}, mounts=[{"Source": h, "Destination": i} for h, i, _ in spec.mounts])}
    d = run_checks(Snapshot(inv, {name: f}, {}, {name: NodeProbe(hf_token_file=True)}, plan))
    assert d.findings == []


def test_a_ring_cabled_out_of_order_is_a_wrong_cable_on_every_node_with_the_map():
    from pathlib import Path

    from sparkctl.facts.lldp import parse_lldp

    inv = inventory("three-sparks-ring.yaml")
    captures = Path(__file__).resolve().parents[1] / "fixtures" / "lldp"
    facts = {}
    for i in (1, 2, 3):
        facts[f"spark{i}"] = spark_facts(f"spark{i}", up_ports=(0, 1))
        facts[f"spark{i}"].lldp = parse_lldp((captures / f"ring3-order132.spark{i}.json").read_text())
    s = Snapshot(inv, facts, {}, {}, None)
    d = diagnose(s)
    wrong = [f for f in d.errors if f.id == "fabric.cable_wrong"]
    assert sorted((f.node, f.evidence.split(":")[0]) for f in wrong) == [
        (f"spark{i}", f"spark{i} port {p} ({t})") for i in (1, 2, 3) for p, t in ((0, "enp1s0f0np0"),
                                                                                  (1, "enp1s0f1np1"))]
    assert all("inventory init" in f.fix for f in wrong)
    assert len(d.cabling.problems) == 6


def test_a_pair_that_could_not_be_checked_is_a_warning_not_a_broken_pair():
    """An overloaded sshd resets the handshake (MaxStartups): doctor says it could not check, not that it broke."""
    s = healthy_snapshot()
    reset = "kex_exchange_identification: read: Connection reset by peer"
    s.probes["spark1"].ssh[0] = SshProbe("spark2", "192.168.100.11", False, reset, "unknown")
    s.probes["spark2"].container_ssh[0] = SshProbe("spark1", "root@192.168.100.10", False, reset, "unknown")
    d = diagnose(s)
    assert d.errors == [] and d.healthy
    warnings = {(f.id, f.node) for f in d.findings if f.severity == "warning"}
    assert {("ssh.mesh_unchecked", "spark1"), ("container.ssh_unchecked", "spark2")} <= warnings
    assert all("not known to be broken" in f.evidence for f in d.findings if f.id.endswith("_unchecked"))


def test_a_container_docker_did_not_report_is_unread_not_missing():
    s = healthy_snapshot()
    s.facts["spark2"].containers["trtllm-multinode"] = dataclasses.replace(
        s.facts["spark2"].containers["trtllm-multinode"], exists=False, running=False, status="unknown")
    d = diagnose(s)
    assert d.errors == [], [(f.id, f.node) for f in d.errors]
    assert ("container.unread", "spark2", "warning") in {(f.id, f.node, f.severity) for f in d.findings}


def test_a_run_holding_the_lock_while_doctor_looked_is_said():
    from sparkctl.doctor.checks.node import check_busy

    s = healthy_snapshot()
    assert check_busy(s) == []
    s.busy = "bootstrap by nvidia@ctl (pid 42) since 2026-01-02 03:04:05Z (12 s ago)"
    [finding] = check_busy(s)
    assert finding.id == "doctor.run_in_progress" and finding.severity == "warning" and "pid 42" in finding.evidence


def test_printed_fix_commands_quote_the_hf_cache_and_the_inventory_path():
    """A fix line is pasted into a shell: a path read from a node or given on the command line is one word there
    (the glob stays outside the quotes)."""
    import shlex

    s = healthy_snapshot()
    s.facts["spark2"].hf_cache = "/data/hf cache;reboot"
    s.facts["spark2"].hf_cache_free_bytes = 5 * 10**9
    s.inventory = s.inventory.model_copy(deep=True)
    s.inventory._source = "/tmp/my inventory;reboot.yaml"
    low = next(f for f in diagnose(s).findings if f.id == "disk.hf_cache_low")
    assert "`du -sh '/data/hf cache;reboot'/hub/*`" in low.fix
    assert shlex.split(s.bootstrap("verify.fabric"))[3] == "/tmp/my inventory;reboot.yaml"


def test_a_gateway_that_runs_but_left_an_address_is_named_with_what_it_listens_on():
    s = healthy_snapshot()
    s.probes["spark1"].gateway_ss = "LISTEN 0 511 127.0.0.1:8355 0.0.0.0:*\n"
    (found,) = diagnose(s).errors
    assert (found.id, found.node) == ("serve.gateway_down", "spark1") and "10.0.0.11:8355" in found.summary
    assert "127.0.0.1" in found.evidence and "bootstrap" in found.fix
    s.probes["spark1"].gateway = "absent"
    (found,) = diagnose(s).errors
    assert found.summary == "the gateway in front of the engine is absent"
