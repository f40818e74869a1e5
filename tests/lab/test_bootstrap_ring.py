"""A ring of four through verify.fabric: spark1 and spark3 (and spark2 and spark4) share no cable, so their traffic
is relayed by a neighbour. Converge (the MPI probe's allreduce crosses relays), rerun changes nothing and relies on
the MPI proof on record, and a single broken pair is found by doctor and repaired by bootstrap.

Node i's port 0 is cabled to node i+1's port 1, one /24 per cable twin, four fabric interfaces per node.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from click.testing import CliRunner

from sparkctl.cli.main import cli
from tests.lab.test_bootstrap_containers import CONTAINER, bootstrap, changed, failures, sh

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


def test_the_ring_serves_a_tp2_model_on_its_first_two_nodes(ring, tmp_path):
    """inventories/three-sparks-ring.yaml's serve section (the TP=2 Qwen3 preset) on this module's ring of four:
    the launch has tp_size x pp_size = 2 ranks on the first two nodes, the others are left out and said so (and get
    no copy of the model), the endpoint answers, a rerun changes nothing."""
    import os
    import subprocess
    import urllib.request

    import yaml

    lab, _ = ring
    document = yaml.safe_load(lab.inventory_path.read_text())
    example = yaml.safe_load((Path(__file__).resolve().parents[2] / "inventories" / "three-sparks-ring.yaml")
                             .read_text())
    document["serve"] = {**example["serve"], "fit_check": "warn", "ready_timeout": 300}
    inventory = tmp_path / "ring-serve.yaml"
    inventory.write_text(yaml.safe_dump(document, sort_keys=False))
    env = {**os.environ, "HF_TOKEN": "hf_LabRingToken4f9c2a7d1e8b3c6a5f0d", "XDG_STATE_HOME": str(tmp_path)}

    def run() -> tuple[int, list[dict], str]:
        proc = subprocess.run(["sparkctl", "cluster", "bootstrap", str(inventory), "--json"], capture_output=True,
                              text=True, timeout=900, env=env)
        return proc.returncode, [json.loads(x) for x in proc.stdout.splitlines() if x.startswith("{")], proc.stderr

    def why(events) -> list:
        return [(e["task"], e.get("node"), e.get("message"), e.get("details")) for e in failures(events)]

    rc, events, err = run()
    assert rc == 0, (why(events), err[-2000:])
    said = [e for e in events if e["event"] == "log" and e.get("left_out")]
    assert said and said[0]["left_out"] == ["spark3", "spark4"] and said[0]["serving_nodes"] == ["spark1", "spark2"]
    assert {("model.fetch", "spark1"), ("model.fetch", "spark2")} <= changed(events)
    assert not {("model.fetch", "spark3"), ("model.fetch", "spark4")} & changed(events)
    recap = events[-1]
    assert recap["verified"] is True and recap["endpoint"].endswith(":8355") and recap["smoke"]["answer"]
    launch = json.loads(sh(lab, "spark1", f"cat /home/nvidia/.local/state/sparkctl/{document['cluster']['name']}"
                                          "/run/serve/launch.json"))
    assert launch["command"].startswith("mpirun -np 2 --host ")
    for node in ("spark3", "spark4"):
        assert "sparkctl-models" not in sh(lab, node, "ls /home/nvidia/.cache/huggingface/ 2>/dev/null || true")
    body = json.dumps({"messages": [{"role": "user", "content": "hello ring"}], "max_tokens": 8}).encode()
    request = urllib.request.Request(f"{recap['endpoint']}/v1/chat/completions", data=body,
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=60) as response:
        assert json.loads(response.read())["choices"][0]["message"]["content"].strip()
    rc, events, err = run()
    summaries = [c["summary"] for e in events if e["event"] == "task_result" for c in e.get("changes", [])]
    assert rc == 0 and changed(events) == set(), (why(events), summaries, err[-2000:])
