"""doctor's probes: the one-round-trip script (valid bash, values quoted) and the parser of its output."""

from __future__ import annotations

import subprocess

from sparkctl.doctor.probes import parse_probe, probe_script
from sparkctl.transport.framing import MARKER
from tests.unit.doctor_snapshot_kit import healthy_snapshot

NONCE = "abc123"


def section(name: str, body: str, rc: int = 0) -> str:
    return f"{MARKER}:{NONCE}:begin {name}@@\n{body}\n{MARKER}:{NONCE}:end {name} {rc}@@\n"


def test_the_script_is_valid_bash_and_quotes_what_the_node_reported():
    s = healthy_snapshot()
    s.facts["spark1"].hf_cache = "/home/nvidia/it's; touch /tmp/pwned"
    script = probe_script(s.inventory, s.plan, s.facts["spark1"], "spark1", ["spark1", "spark2"], nonce=NONCE)
    assert subprocess.run(["bash", "-n"], input=script, text=True, capture_output=True).returncode == 0
    assert "'/home/nvidia/it'\"'\"'s; touch /tmp/pwned/token'" in script
    # pings on both twins with don't-fragment at MTU-28, ssh to the peer, ssh from inside the container
    assert 'ping -c 1 -W 1 -M \'do\' -s "$_s" -I "$_i" "$_a"' in script
    assert "ping -c 1 -W 1 -M 'do' -s 8972 -I enp1s0f1np1 192.168.100.11 >/dev/null 2>&1 &" in script
    assert "_ping enp1s0f1np1 spark2 192.168.100.11 8972 1 &" in script  # not answered: tried again, then told
    assert "ping -c 1 -W 1 -M 'do' -s 8972 -I enP2p1s0f1np1 192.168.101.11 >/dev/null 2>&1 &" in script
    assert "_ping enP2p1s0f1np1 spark2 192.168.101.11 8972 1 &" in script  # not answered: tried again, then told
    assert "BatchMode=yes" in script and "docker exec trtllm-multinode sh -c" in script
    assert "/health" in script  # the head probes the server
    assert "systemctl show --timestamp=unix -p LoadState," in script and "sparkctl-serve-" in script  # and its unit


def test_a_worker_does_not_probe_the_server_and_a_stopped_container_gives_its_logs():
    s = healthy_snapshot()
    info = s.facts["spark2"].containers["trtllm-multinode"]
    info.running, info.status = False, "exited"
    script = probe_script(s.inventory, s.plan, s.facts["spark2"], "spark2", ["spark1", "spark2"], nonce=NONCE)
    assert "/health" not in script
    assert "docker logs --tail 20 trtllm-multinode" in script
    assert "docker exec" not in script


def test_parse_probe_reads_every_section():
    out = "".join([
        section("ports", "LISTEN 0 128 0.0.0.0:2233 0.0.0.0:* users:((\"python3\",pid=991,fd=3))"),
        section("ping", "ok enp1s0f1np1 spark2 192.168.100.11\nmtu enP2p1s0f1np1 spark2 192.168.101.11"),
        section("ssh", "fail spark2 192.168.100.11 nvidia@192.168.100.11: Permission denied (publickey)."),
        section("c-logs", "sshd: Bind to port 2233 failed"),
        section("hf-token", "no"),
        section("models", "complete nvidia/A\nincomplete nvidia/B partial download in /x\nabsent nvidia/C"),
        section("serve-log", "Application startup complete."),
        section("nccl", "NCCL INFO Using network Socket"),
        section("health", "200"),
        section("completion", '200\n{"choices": [{"message": {"content": "!!!!"}}]}'),
        section("c-hostfile", "192.168.100.10\n192.168.100.11"),
        section("c-authkeys", "ssh-ed25519 AAAA x"),
        section("c-ssh", "ok spark2 root@192.168.100.11\nfail spark2 root@192.168.101.11 Connection refused"),
        section("unit", "LoadState=loaded\nActiveState=activating\nSubState=auto-restart\nNRestarts=2"),
        section("unit-exits", "2026-11-27T20:33:39Z 1795811619 exit-code exited 1 95"),
    ])
    p = parse_probe(out, NONCE)
    assert p.port_owners == {2233: "python3 (pid 991)"}
    assert [(x.interface, x.verdict) for x in p.pings] == [("enp1s0f1np1", "ok"), ("enP2p1s0f1np1", "mtu")]
    assert not p.ssh[0].ok and "Permission denied" in p.ssh[0].error and p.ssh[0].target == "192.168.100.11"
    assert p.container_logs == "sshd: Bind to port 2233 failed"
    assert p.hf_token_file is False
    assert [(m.repo, m.state) for m in p.models] == [("nvidia/A", "complete"), ("nvidia/B", "incomplete"),
                                                    ("nvidia/C", "absent")]
    assert p.serve_log_exists and p.nccl_log.strip() == "NCCL INFO Using network Socket"
    assert p.health_status == 200 and p.completion == "!!!!"
    assert p.container_hostfile.split() == ["192.168.100.10", "192.168.100.11"]
    assert [c.ok for c in p.container_ssh] == [True, False]
    assert p.unit == {"LoadState": "loaded", "ActiveState": "activating", "SubState": "auto-restart", "NRestarts": "2"}
    assert p.unit_exits.startswith("2026-11-27T20:33:39Z")


def test_a_missing_serve_log_and_an_unanswered_health_check():
    p = parse_probe(section("serve-log", "", rc=3) + section("health", "000"), NONCE)
    assert not p.serve_log_exists and p.serve_log_tail == ""
    assert p.health_status == 0 and p.completion is None


STUBS = {
    "ping": "echo stub-ping",
    "ssh": "echo 'Permission denied (publickey).' >&2; exit 255",
    "ss": "echo 'LISTEN 0 128 0.0.0.0:2233 0.0.0.0:* users:((\"sshd\",pid=7,fd=3))'",
    # the in-container HTTP client (templates/node-http.py): the request body must come on stdin
    "python3": "case \"$*\" in *health*) printf '200\\n' ;; "
               "*) if grep -q '\"messages\"'; then "
               "printf '200\\n{\"choices\":[{\"message\":{\"content\":\"Waves roll.\"}}]}'; "
               "else printf '400\\nno body on stdin'; fi ;; esac",
    # docker exec runs the inner script here, where cat finds no hostfile: the sections must still come back
    "docker": "if [ \"$1\" = exec ]; then shift; [ \"$1\" = -i ] && shift; shift; \"$@\"; else echo stub-docker; fi",
}


def test_the_whole_script_runs_to_the_end_with_stubbed_commands(tmp_path):
    """Every command that would touch the network is a stub; a missing serve log must not end the script."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, body in STUBS.items():
        (bin_dir / name).write_text(f"#!/bin/sh\n{body}\n")
        (bin_dir / name).chmod(0o755)
    s = healthy_snapshot()
    s.facts["spark1"].hf_cache = str(tmp_path / "hf")
    script = probe_script(s.inventory, s.plan, s.facts["spark1"], "spark1", ["spark1", "spark2"], nonce=NONCE)
    result = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=30,
                            env={"PATH": f"{bin_dir}:/usr/bin:/bin", "HOME": str(tmp_path)})
    p = parse_probe(result.stdout, NONCE)
    assert not p.serve_log_exists
    assert p.health_status == 200 and p.completion == "Waves roll."
    assert p.port_owners == {2233: "sshd (pid 7)"}
    assert [x.verdict for x in p.pings] == ["ok", "ok"]
    assert [(x.peer, x.ok) for x in p.ssh] == [("spark2", False)] and "Permission denied" in p.ssh[0].error
    # one try per ordered pair of containers, at the address the pair shares first (the one mpirun uses)
    assert p.container_hostfile == "" and [c.target for c in p.container_ssh] == ["root@192.168.100.11"]
    assert p.hf_token_file is False and [m.state for m in p.models] == ["absent", "absent"]


def test_a_pair_the_probe_never_reached_is_not_checked_never_silently_fine():
    """The probe round trip cut short (its time limit, a lost node): every pair without a verdict comes back as
    not checked, so doctor says so instead of passing it."""
    from sparkctl.doctor.probes import probe_node, probe_timeout
    from sparkctl.transport.base import CommandResult

    class Cut:
        node = "spark1"

        def run(self, script, *, timeout=60.0, sudo=False, input=None):
            return CommandResult(script, -1, "", "", timed_out=True)

    s = healthy_snapshot()
    probe = probe_node(Cut(), s.inventory, s.plan, s.facts["spark1"], ["spark1", "spark2"], timeout=1)
    assert [(p.peer, p.state) for p in probe.ssh] == [("spark2", "unknown")]
    assert [(p.peer, p.state) for p in probe.container_ssh] == [("spark2", "unknown")]
    assert "timed out" in probe.ssh[0].error
    assert probe_timeout(16) > probe_timeout(2) >= 60


def test_a_node_lost_during_its_probe_is_told_by_the_error_s_kind_not_its_words():
    """The transport's own words for a lost node ("stopped answering", "closed the connection") never said
    "connection lost", which doctor looked for: the node then passed as reachable with every probe failed."""
    from sparkctl.doctor.probes import probe_node
    from sparkctl.errors import Unreachable

    class Gone:
        node = "spark2"

        def __init__(self, error):
            self.error = error

        def run(self, script, *, timeout=60.0, sudo=False, input=None):
            raise self.error

    s = healthy_snapshot()
    for error in (Unreachable("spark2 (10.0.0.12): stopped answering (keepalive)", kind="lost", node="spark2"),
                  Unreachable("spark2 (10.0.0.12): the node closed the connection", node="spark2", closed=True)):
        probe = probe_node(Gone(error), s.inventory, s.plan, s.facts["spark2"], ["spark1", "spark2"], timeout=1)
        assert probe.lost and str(error) in probe.error
    probe = probe_node(Gone(ValueError("a bug")), s.inventory, s.plan, s.facts["spark2"], ["spark1", "spark2"])
    assert not probe.lost and probe.error == "a bug"
