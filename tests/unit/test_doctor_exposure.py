"""doctor's exposure check: each node's management listeners asked from another node of the cluster (a lone
node's from this machine); what answers and is not meant to is a finding with its port, its process and the fix."""

from __future__ import annotations

import socket
import subprocess
import threading

from sparkctl.doctor.probes import answered_here, exposure_targets, management_listeners, probe_script
from sparkctl.shipped import shipped_text
from sparkctl.transport.base import q
from tests.taskkit import spark_facts
from tests.unit.doctor_snapshot_kit import diagnose, healthy_snapshot


def _listening(facts, ports: dict[int, tuple[str, str]]) -> None:
    """port -> (address, process) as `ss -ltnp` would have shown them."""
    facts.listening_addresses = {p: [address] for p, (address, _) in ports.items()}
    facts.listening_tcp = {p: process for p, (_, process) in ports.items()}


def test_each_node_is_asked_from_the_next_over_its_management_address():
    facts = {n: spark_facts(n, session_ip=ip) for n, ip in (("spark1", "10.0.0.11"), ("spark2", "10.0.0.12"))}
    _listening(facts["spark1"], {22: ("0.0.0.0", "sshd"), 18355: ("127.0.0.1", "trtllm-serve"),
                                 8355: ("10.0.0.11", "nginx")})
    _listening(facts["spark2"], {22: ("0.0.0.0", "sshd"), 1024: ("*", "trtllm-serve"),
                                 2233: ("192.168.100.11", "sshd")})
    assert management_listeners("spark2", facts["spark2"]) == [("spark2", "10.0.0.12", 22),
                                                                ("spark2", "10.0.0.12", 1024)]
    targets = exposure_targets(["spark1", "spark2"], facts)
    assert targets["spark1"] == (("spark2", "10.0.0.12", 22), ("spark2", "10.0.0.12", 1024))
    assert targets["spark2"] == (("spark1", "10.0.0.11", 22), ("spark1", "10.0.0.11", 8355))  # not loopback's
    assert exposure_targets(["spark1"], facts) == {}


def test_the_probe_asks_every_target_at_once_and_reads_what_accepted():
    s = healthy_snapshot()
    script = probe_script(s.inventory, s.plan, s.facts["spark1"], "spark1", ["spark1", "spark2"], nonce="N",
                          targets=(("spark2", "10.0.0.12", 1024),))
    assert "probe_answers 2 spark2 10.0.0.12 1024" in script


def test_the_asking_says_which_targets_accepted_and_runs_nothing_it_is_given(tmp_path):
    listener = socket.create_server(("127.0.0.1", 0))
    open_port = listener.getsockname()[1]
    closed = socket.create_server(("127.0.0.1", 0))
    closed_port = closed.getsockname()[1]
    closed.close()
    try:
        hostile = f"127.0.0.1/{open_port}; touch {tmp_path}/pwned #"
        script = (f"{shipped_text('probes.sh')}\nprobe_answers 2 spark2 127.0.0.1 {open_port} spark3 127.0.0.1 "
                  f"{closed_port} spark4 {q(hostile)} 1")
        out = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=30).stdout
    finally:
        listener.close()
    assert out.splitlines() == [f"open spark2 127.0.0.1 {open_port}"]
    assert not (tmp_path / "pwned").exists()


def test_an_engine_port_that_answers_is_a_finding_and_sshd_and_the_endpoint_are_not():
    s = healthy_snapshot()
    s.facts["spark2"].listening_tcp[1024] = "trtllm-serve"
    s.probes["spark1"].answered = [("spark2", "10.0.0.12", 22), ("spark2", "10.0.0.12", 1024)]
    s.probes["spark2"].answered = [("spark1", "10.0.0.11", 22), ("spark1", "10.0.0.11", 8355)]
    found = [f for f in diagnose(s).findings if f.id == "node.exposed_port"]
    assert [(f.node, f.summary) for f in found] == [
        ("spark2", "port 1024 (trtllm-serve) answers on spark2's management network")]
    assert found[0].evidence == ("a TCP connection from spark1 to 10.0.0.12:1024 is accepted; trtllm-serve listens "
                                 "there")
    assert "--only network.firewall" in found[0].fix and "firewall.allow" in found[0].fix
    assert found[0].severity == "error"  # sparkctl's firewall should have dropped it


def test_a_port_firewall_allow_lets_in_is_meant(tmp_path):
    s = healthy_snapshot()
    s.inventory.firewall.allow = ["9100-9110/tcp"]
    s.probes["spark1"].answered = [("spark2", "10.0.0.12", 9105)]
    assert not [f for f in diagnose(s).findings if f.id == "node.exposed_port"]


def test_with_the_firewall_off_the_fix_is_to_turn_it_on():
    s = healthy_snapshot()
    s.inventory.__dict__["firewall"] = "off"
    s.probes["spark1"].answered = [("spark2", "10.0.0.12", 8000)]
    (found,) = [f for f in diagnose(s).findings if f.id == "node.exposed_port"]
    assert found.fix.startswith("remove `firewall: off` and rerun bootstrap") and found.severity == "warning"
    assert "a process sparkctl could not name" in found.summary


def test_a_lone_node_is_asked_from_this_machine():
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        threading.Thread(target=lambda: listener.accept()[0].close(), daemon=True).start()
        with socket.socket() as closed:
            closed.bind(("127.0.0.1", 0))
            shut = closed.getsockname()[1]
        targets = [("spark1", "127.0.0.1", port), ("spark1", "127.0.0.1", shut)]
        assert answered_here(targets) == [("spark1", "127.0.0.1", port)]
