"""Bootstrap through verify.fabric on a lab pair: converge, rerun changes nothing, each drift repaired exactly."""

from __future__ import annotations

import json
import re
import shlex
import socket

import pytest
import yaml
from click.testing import CliRunner

from sparkctl.cli.main import cli
from sparkctl.inventory import load_inventory
from sparkctl.plan import plan_cluster
from tests.lab.lab_kit import CONTAINER, bootstrap, changed, failures, reboot, sh, sparkctl
from tests.taskkit import doctor_report

pytestmark = pytest.mark.lab

FABRIC = "enp1s0f1np1,enP2p1s0f1np1"


@pytest.fixture(scope="module")
def converged(lab_pair):
    rc, events = bootstrap(lab_pair)
    assert rc == 0, failures(events)
    return lab_pair, events


def test_the_container_mesh_answers_on_the_fabric_only(converged):
    """Its sshd listens on the fabric addresses: not from this machine, not on the node's management address,
    and keys are accepted only from the fabric subnets; mpirun over the mesh still works (verify ran it)."""
    lab, events = converged
    for record in lab.state.nodes:
        with pytest.raises(OSError):
            socket.create_connection((record.mgmt_ip, 2233), timeout=3).close()
        listening = sh(lab, record.name, "ss -ltnH 'sport = :2233'")
        assert listening.strip() and "0.0.0.0:2233" not in listening and "*:2233" not in listening, listening
        keys = sh(lab, record.name, f"docker exec {CONTAINER} cat /root/.ssh/authorized_keys")
        assert keys.strip() and all(line.startswith('from="192.168.100.0/24,192.168.101.0/24" ')
                                    for line in keys.splitlines())
    assert not failures(events)


def test_first_run_starts_one_container_per_node_with_its_own_settings(converged):
    lab, events = converged
    assert {("container.run", "spark1"), ("container.run", "spark2")} <= changed(events)
    for node in ("spark1", "spark2"):
        runs = [json.loads(line)["argv"] for line in sh(lab, node, "cat /run/lab/docker.log").splitlines()
                if json.loads(line)["argv"][:2] == ["run", "-d"]]
        assert runs, f"no docker run logged on {node}"
        argv = runs[-1]
        assert f"NCCL_SOCKET_IFNAME={FABRIC}" in argv and "NCCL_IB_HCA=rocep1s0f1,roceP2p1s0f1" in argv
        assert f"OMPI_MCA_oob_tcp_if_include={FABRIC}" in argv and "--network" in argv
        assert not any("/.ssh:/tmp/.ssh" in a for a in argv), "the user's ~/.ssh must never be mounted"
    mpi = [e for e in events if e["event"] == "log" and e.get("task") == "verify.fabric"]
    assert mpi and "allreduce sum ok" in mpi[-1]["message"]
    moved = mpi[-1]["probe"]["interfaces"]["spark2"]
    # the allreduce's bytes left by the twins; the management port may carry background traffic only (an ssh ACK
    # of sparkctl's own session: tens of bytes), below verify.fabric's floor of a quarter of the payload
    floor = float(re.search(r"([0-9.]+) MiB", mpi[-1]["message"]).group(1)) * 2**20 / 4
    carried = {name for name, sent in moved.items() if sent >= floor}
    assert carried and carried <= {"enp1s0f1np1", "enP2p1s0f1np1"}, moved


def test_second_run_changes_nothing(converged):
    lab, _ = converged
    rc, events = bootstrap(lab)
    assert rc == 0 and changed(events) == set()


def test_only_mpi_after_the_containers_are_gone_runs_what_mpi_needs(converged):
    """What doctor suggests after `cluster down`: --only pulls in the tasks it needs (the containers), and the
    closing line does not claim a verification that did not run."""
    lab, _ = converged
    for node in ("spark1", "spark2"):
        sh(lab, node, f"docker rm -f {CONTAINER}")
    rc, events = bootstrap(lab, "--only", "mpi")
    assert rc == 0, failures(events)
    assert {("container.run", "spark1"), ("container.run", "spark2"), ("mpi.hostfile", None)} <= changed(events)
    start = next(e for e in events if e["event"] == "run_start")
    assert {"preflight.node", "container.run", "container.ssh"} <= set(start["added_needs"])
    recap = events[-1]
    assert recap["event"] == "recap" and recap["verified"] is False
    assert recap["not_verified"] == "verify.fabric was not selected"
    rc, events = bootstrap(lab)
    assert rc == 0 and changed(events) == set() and events[-1]["verified"] is True


def test_stopped_container_is_started(converged):
    lab, _ = converged
    sh(lab, "spark2", f"docker stop -t 0 {CONTAINER}")
    rc, events = bootstrap(lab)
    assert rc == 0, failures(events)
    assert changed(events) == {("container.run", "spark2")}


def test_hand_started_container_with_wrong_ifname_is_recreated(converged):
    lab, _ = converged
    inv = load_inventory(lab.inventory_path)
    sh(lab, "spark1", f"docker rm -f {CONTAINER} && docker run -d --name {CONTAINER} --network host "
                      f"-e NCCL_SOCKET_IFNAME=enP7s7 {shlex.quote(inv.container.image)} sleep infinity")
    rc, events = bootstrap(lab)
    assert rc == 0, failures(events)
    assert ("container.run", "spark1") in changed(events)
    result = next(e for e in events if e["event"] == "task_changes" and e["task"] == "container.run")
    assert "NCCL_SOCKET_IFNAME: enP7s7 -> " + FABRIC in json.dumps(result)
    env = sh(lab, "spark1", f"docker inspect --format '{{{{json .Config.Env}}}}' {CONTAINER}")
    assert f"NCCL_SOCKET_IFNAME={FABRIC}" in env


def test_wrong_hostfile_in_one_container_is_rewritten(converged):
    lab, _ = converged
    sh(lab, "spark2", f"docker exec {CONTAINER} sh -c 'echo 10.9.9.9 > /etc/openmpi-hostfile'")
    rc, events = bootstrap(lab)
    assert rc == 0, failures(events)
    assert changed(events) == {("mpi.hostfile", None)}
    assert "10.9.9.9" not in sh(lab, "spark2", f"docker exec {CONTAINER} cat /etc/openmpi-hostfile")


def test_removed_peer_key_is_restored(converged):
    lab, _ = converged
    sh(lab, "spark1", f"docker exec {CONTAINER} sh -c \"sed -i '/@spark2/d' /root/.ssh/authorized_keys\"")
    rc, events = bootstrap(lab)
    assert rc == 0, failures(events)
    assert changed(events) == {("container.ssh", None)}
    assert "@spark2" in sh(lab, "spark1", f"docker exec {CONTAINER} cat /root/.ssh/authorized_keys")


def mesh_logs(events: list[dict]) -> dict[str, str]:
    """What ssh.verify and container.ssh said of their pairs (proofs on record)."""
    return {e["task"]: e["message"] for e in events if e["event"] == "log" and e.get("task") in
            ("ssh.verify", "container.ssh") and "pair(s)" in e["message"]}


def test_a_noop_rerun_takes_every_mesh_pair_from_the_record_and_reprove_tries_them_all(converged):
    lab, _ = converged
    rc, events = bootstrap(lab)
    assert rc == 0 and changed(events) == set(), failures(events)
    said = mesh_logs(events)
    assert said["ssh.verify"].startswith("2 of 2 pair(s) taken from the record"), said
    assert said["container.ssh"].startswith("2 of 2 container pair(s) taken from the record"), said
    rc, events = bootstrap(lab, "--reprove")
    assert rc == 0 and changed(events) == set(), failures(events)
    said = mesh_logs(events)
    assert said["ssh.verify"].startswith("0 of 2 pair(s) taken"), said
    assert said["container.ssh"].startswith("0 of 2 container pair(s) taken"), said


def test_the_cluster_key_taken_out_of_a_nodes_authorized_keys_is_restored_and_its_pairs_proven(converged):
    lab, _ = converged
    user = yaml.safe_load(lab.inventory_path.read_text())["user"]
    keys = f"/home/{user}/.ssh/authorized_keys"
    sh(lab, "spark1", f"grep -v '@spark2$' {keys} > {keys}.new; cat {keys}.new > {keys}; rm {keys}.new")
    rc, events = bootstrap(lab)
    assert rc == 0, failures(events)
    assert changed(events) == {("ssh.mesh", None)}
    assert "@spark2" in sh(lab, "spark1", f"cat {keys}")
    assert mesh_logs(events)["ssh.verify"].endswith("2 tried now"), mesh_logs(events)


def test_an_sshd_drop_in_refusing_keys_from_the_fabric_is_seen_by_a_noop_rerun_with_its_file_and_line(converged):
    """Nothing sparkctl wrote changed, only what the peer's sshd applies to logins from the fabric: the pair's
    fingerprint (sshd -T for each source, once a Match block exists) makes the rerun try it."""
    lab, _ = converged
    dropin = "/etc/ssh/sshd_config.d/60-fabric.conf"
    sh(lab, "spark2", f"printf 'Match Address 192.168.100.0/24,192.168.101.0/24\\n    PubkeyAuthentication no\\n' "
                      f"> {dropin} && systemctl reload ssh")
    try:
        rc, events = bootstrap(lab)
        assert rc == 1
        failed = [f for f in failures(events) if f["task"] == "ssh.verify"]
        assert failed and failed[0]["message"] == "1 node-to-node ssh connection(s) failed", failures(events)
        assert any(d.startswith(f"spark2: {dropin}:2: PubkeyAuthentication no (in `Match Address ")
                   for d in failed[0]["details"]), failed[0]["details"]
        assert "systemctl reload ssh" in failed[0]["hint"]
    finally:
        sh(lab, "spark2", f"rm -f {dropin} && systemctl reload ssh")
    rc, events = bootstrap(lab)
    assert rc == 0 and changed(events) == set(), failures(events)


def test_port_taken_names_the_process_then_converges(converged):
    lab, _ = converged
    sh(lab, "spark2", f"docker rm -f {CONTAINER}")
    pid = sh(lab, "spark2", "setsid python3 -m http.server 2233 >/dev/null 2>&1 </dev/null & echo $!").strip()
    try:
        sh(lab, "spark2", "for i in $(seq 600); do ss -ltnH 'sport = :2233' | grep -q . && exit 0; sleep 0.1; done;"
                          " exit 1")
        rc, events = bootstrap(lab)
        assert rc == 1
        failed = failures(events)
        assert failed[0]["task"] == "container.run" and failed[0]["node"] == "spark2"
        assert "2233" in failed[0]["message"] and f"pid {pid}" in failed[0]["message"]
        assert "python" in failed[0]["message"]
    finally:
        sh(lab, "spark2", f"kill {int(pid)}", check=False)
    rc, events = bootstrap(lab)
    assert rc == 0, failures(events)


def test_a_seeded_missing_hca_is_found_and_only_verify_fabric_s_needs_repair_it(converged):
    """A container started by hand with an NCCL_IB_HCA that names a device the node does not have: doctor (which
    judges with verify.fabric's rules) names it on spark2 alone; `--only verify.fabric` runs what verify needs
    (issue 18: --only respects needs), so container.run recreates spark2's container, and verify then passes."""
    lab, _ = converged
    inv = load_inventory(lab.inventory_path)
    spec = plan_cluster(inv).nodes["spark2"].container
    argv = [a if not a.startswith("NCCL_IB_HCA=") else "NCCL_IB_HCA=rocep1s0f1,roceP2p1s0f9"
            for a in spec.run_argv()]
    sh(lab, "spark2", f"docker rm -f {CONTAINER} && {shlex.join(argv)}")
    result = CliRunner().invoke(cli, ["doctor", str(lab.inventory_path), "--json"], catch_exceptions=False)
    findings = doctor_report(result.stdout)["findings"]
    found = [f for f in findings if f["id"] == "nccl.ib_hca_missing"]
    assert [f["node"] for f in found] == ["spark2"], findings
    assert "roceP2p1s0f9" in found[0]["summary"] + (found[0].get("evidence") or ""), found
    rc, events = bootstrap(lab, "--only", "verify.fabric")
    assert rc == 0, failures(events)
    assert {(t, n) for t, n in changed(events) if t == "container.run"} == {("container.run", "spark2")}
    assert [e["status"] for e in events if e["event"] == "task_result" and e["task"] == "verify.fabric"] == ["ok"]
    rc, events = bootstrap(lab)
    assert rc == 0 and changed(events) == set()


def test_a_container_stopped_by_hand_stays_stopped_through_a_reboot_until_bootstrap(converged):
    """unless-stopped means what Docker says: a container someone stopped is not started at boot; the next
    bootstrap starts it (container.run's repair of a stopped container). That the containers come back by
    themselves after a reboot or a power cut: tests/lab/test_bootstrap_serve.py, with the endpoint."""
    lab, _ = converged
    sh(lab, "spark2", f"docker stop -t 0 {CONTAINER} >/dev/null")
    reboot(lab, "spark2")
    assert "false" in sh(lab, "spark2", f"docker inspect -f '{{{{.State.Running}}}}' {CONTAINER}")
    rc, events = bootstrap(lab)
    assert rc == 0 and ("container.run", "spark2") in changed(events), failures(events)
    rc, events = bootstrap(lab)
    assert rc == 0 and changed(events) == set()


def test_with_the_image_relayed_no_peer_pulls_and_every_node_runs_the_head_s_image_id(converged, tmp_path):
    """container.distribute: relay: an image only the head holds and no registry serves (the lab reaches none)
    reaches the peer over the fabric, `docker save | ssh | docker load`; both containers run the same image ID; the
    peer never runs `docker pull`; a rerun changes nothing."""
    lab, _ = converged
    relayed = "localhost/sparkctl-relay-test:1"
    sh(lab, "spark1", f"docker commit {CONTAINER} {relayed} >/dev/null")
    head_id = sh(lab, "spark1", f"docker image inspect --format '{{{{.Id}}}}' {relayed}").strip()
    document = yaml.safe_load(lab.inventory_path.read_text())
    document["container"] = {**document.get("container", {}), "image": relayed, "distribute": "relay"}
    inventory = tmp_path / "relay.yaml"
    inventory.write_text(yaml.safe_dump(document, sort_keys=False))
    pulls_before = sh(lab, "spark2", "grep -c '\"pull\"' /run/lab/docker.log || true").strip()
    try:
        code, events, output = sparkctl(["cluster", "bootstrap", str(inventory), "--json"])
        assert code == 0, output[-3000:]
        assert ("container.relay", None) in changed(events) and ("container.image", "spark2") not in changed(events)
        relayed_lines = [e["message"] for e in events if e["event"] == "log" and e.get("task") == "container.relay"
                         and e["message"].startswith("relayed")]
        assert relayed_lines and "192.168.100.11" in relayed_lines[0], relayed_lines  # over the fabric
        for node in ("spark1", "spark2"):
            running = sh(lab, node, f"docker inspect --format '{{{{.Image}}}}' {CONTAINER}").strip()
            assert running.removeprefix("sha256:") == head_id.removeprefix("sha256:"), node
        assert sh(lab, "spark2", "grep -c '\"pull\"' /run/lab/docker.log || true").strip() == pulls_before
        code, events, output = sparkctl(["cluster", "bootstrap", str(inventory), "--json"])
        assert code == 0 and changed(events) == set(), changed(events)
    finally:
        rc, events = bootstrap(lab)
        assert rc == 0, failures(events)
