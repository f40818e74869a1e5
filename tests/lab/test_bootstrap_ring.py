"""A ring of four through verify.fabric: spark1 and spark3 (and spark2 and spark4) share no cable, so their traffic
is relayed by a neighbour. Converge (the MPI probe's allreduce crosses relays), rerun changes nothing and relies on
the MPI proof on record, and a single broken pair is found by doctor and repaired by bootstrap.

Node i's port 0 is cabled to node i+1's port 1, one /24 per cable twin, four fabric interfaces per node.
"""

from __future__ import annotations

import json
import os
import re

import pytest
from click.testing import CliRunner

from sparkctl.cli.main import cli
from tests.lab.lab_kit import CONTAINER, HF_TOKEN, bootstrap, changed, failures, sh, sparkctl, write_inventory

pytestmark = pytest.mark.lab

MPI_IFACE = "enp1s0f0np0"   # port 0 twin 1 on every node: Open MPI's one interface in a ring
TWINS = ("enp1s0f0np0", "enP2p1s0f0np0", "enp1s0f1np1", "enP2p1s0f1np1")
NODES = ("spark1", "spark2", "spark3", "spark4")


@pytest.fixture(scope="module")
def ring(lab_factory, tmp_path_factory, monkeypatch_module):
    # the MPI proof on record lives on the controller: this module's own, not the machine's
    monkeypatch_module.setenv("XDG_STATE_HOME", str(tmp_path_factory.mktemp("state")))
    lab = lab_factory(4, "ring")
    rc, events = bootstrap(lab)
    assert rc == 0, failures(events)
    return lab, events


@pytest.fixture(scope="module")
def monkeypatch_module():
    with pytest.MonkeyPatch.context() as patch:
        yield patch


def test_ring_of_four_converges_through_verify_fabric_across_relays(ring):
    lab, events = ring
    assert {("container.run", n) for n in NODES} <= changed(events)
    assert {("network.forwarding", n) for n in NODES} <= changed(events)
    verify = [e for e in events if e["event"] == "task_result" and e["task"] == "verify.fabric"]
    assert [e["status"] for e in verify] == ["ok"]
    probe = [e for e in events if e["event"] == "log" and e.get("task") == "verify.fabric"][-1]
    assert "4 rank(s), allreduce sum ok" in probe["message"]
    # the allreduce's bytes left every node by its twins; the management port carries only background traffic
    # (an ssh ACK, an LLDP frame: tens of bytes), below verify.fabric's floor of a quarter of the payload
    floor = float(re.search(r"([0-9.]+) MiB", probe["message"]).group(1)) * 2**20 / 4
    for node, moved in probe["probe"]["interfaces"].items():
        carried = {name for name, sent in moved.items() if sent >= floor}
        assert carried and carried <= set(TWINS), (node, moved)
    # no warning that a rank's bytes left by a routed twin: in a ring that is the path
    assert not [e for e in events if e["event"] == "warning" and e.get("task") == "verify.fabric"]


def test_non_neighbours_reach_each_other_through_a_relay_that_forwards_on_its_twins_only(ring):
    lab, _ = ring
    hostfile = sh(lab, "spark1", f"docker exec {CONTAINER} cat /etc/openmpi-hostfile").split()
    assert len(hostfile) == 4
    for i, node in enumerate(NODES):
        env = json.loads(sh(lab, node, f"docker inspect --format '{{{{json .Config.Env}}}}' {CONTAINER}"))
        assert f"OMPI_MCA_btl_tcp_if_include={MPI_IFACE}" in env
        assert f"NCCL_SOCKET_IFNAME={','.join(TWINS)}" in env
        assert hostfile[i] in sh(lab, node, f"ip -4 -o addr show dev {MPI_IFACE}")
        # forwarding on the four twins, never on the management port nor globally
        conf = sh(lab, node, "for f in ip_forward conf/enP7s7/forwarding " + " ".join(
            f"conf/{t}/forwarding conf/{t}/rp_filter" for t in TWINS) + "; do cat /proc/sys/net/ipv4/$f; done").split()
        assert conf == ["0", "0"] + ["1", "2"] * 4, (node, conf)
    # spark3 is two hops from spark1: a don't-fragment jumbo ping crosses the relay (TTL one less)
    far = hostfile[2]
    out = sh(lab, "spark1", f"ping -c 1 -W 2 -M do -s 8972 {far}")
    assert "ttl=63" in out, out
    assert sh(lab, "spark1", f"ip -4 route get {far}").split()[2] == sh(
        lab, "spark2", "ip -4 -o addr show dev enp1s0f1np1").split()[3].split("/")[0]


def test_a_second_run_changes_nothing_and_relies_on_the_mpi_proof(ring):
    lab, _ = ring
    rc, events = bootstrap(lab)
    assert rc == 0, failures(events)
    assert changed(events) == set()
    logs = [e.get("message", "") for e in events if e["event"] == "log"]
    assert any(m.startswith("MPI probe not run again: nothing it depends on changed since it passed") for m in logs)
    assert any(m.startswith("mpirun hostname not run") for m in logs)


def test_one_broken_pair_is_found_by_doctor_and_repaired(ring):
    """spark3's cluster key removed from spark1's authorized_keys (non-neighbours: the proof crosses a relay):
    doctor's mesh finds exactly that pair, a bootstrap repairs exactly that file and proves every pair again."""
    lab, _ = ring
    sh(lab, "spark1", "sed -i '/sparkctl-.*@spark3$/d' /home/nvidia/.ssh/authorized_keys")
    result = CliRunner().invoke(cli, ["doctor", str(lab.inventory_path), "--json"], catch_exceptions=False)
    findings = [e for e in map(json.loads, result.stdout.splitlines()) if e["event"] == "finding"]
    broken = {(f["id"], f["node"], f["summary"]) for f in findings if f["severity"] == "error"}
    assert broken == {("ssh.mesh_broken", "spark1", "ssh spark3 -> spark1 fails")}, findings
    rc, events = bootstrap(lab)
    assert rc == 0, failures(events)
    assert changed(events) == {("ssh.mesh", None)}
    diffs = [c for e in events if e["event"] == "task_changes" and e["task"] == "ssh.mesh" for c in e["changes"]]
    assert [c["summary"] for c in diffs] == ["spark1: update ~/.ssh/authorized_keys"]
    verify = [e for e in events if e["event"] == "task_result" and e["task"] == "ssh.verify"]
    assert [e["status"] for e in verify] == ["ok"]


def test_the_model_reaches_the_ring_as_a_tree_over_the_cables(ring, tmp_path):
    """serve.distribute: copy over four nodes: the head sends to a neighbour, then the head and that neighbour each
    send to a node they are cabled to, so one copy comes from a peer; every node ends with the head's bytes, verified,
    and the rerun changes nothing."""
    lab, _ = ring
    serve = {"preset": "qwen3-235b-eagle3", "tp_size": 4, "fit_check": "warn", "distribute": "copy"}
    inventory = write_inventory(lab, tmp_path / "ring-copy.yaml", serve)
    env = {**os.environ, "HF_TOKEN": HF_TOKEN}
    code, events, output = sparkctl(["cluster", "bootstrap", inventory, "--json", "--only", "model"], env)
    assert code == 0, output[-3000:]
    copies = [e for e in events if e["event"] == "log" and e.get("task") == "model.copy" and e.get("copy")]
    senders = {e["node"]: e["copy"]["from"] for e in copies if e["copy"]["repo"] == "nvidia/Qwen3-235B-A22B-FP4"}
    assert senders == {"spark2": "spark1", "spark4": "spark1", "spark3": "spark2"}, senders
    model_dir = "/home/nvidia/.cache/huggingface/hub/models--nvidia--Qwen3-235B-A22B-FP4"
    digest = f"cd {model_dir}/snapshots/$(cat {model_dir}/refs/main) && find -L . -type f -exec sha256sum {{}} + | sort"
    assert len({sh(lab, node, digest) for node in NODES}) == 1
    code, events, output = sparkctl(["cluster", "bootstrap", inventory, "--json", "--only", "model"], env)
    assert code == 0 and changed(events) == set(), changed(events)
