"""A ring of three through verify.fabric: converge (the MPI probe's allreduce crosses every cable), rerun is a no-op.

Node i's port 0 is cabled to node i+1's port 1, one /24 per cable twin, four fabric interfaces per node.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.lab.test_bootstrap_containers import CONTAINER, bootstrap, changed, failures, sh

MPI_IFACE = "enp1s0f0np0"   # port 0 twin 1 on every node: Open MPI's one interface in a ring


@pytest.fixture(scope="module")
def ring(lab_factory):
    lab = lab_factory(3, "ring")
    rc, events = bootstrap(lab)
    assert rc == 0, failures(events)
    return lab, events


def test_ring_converges_through_verify_fabric(ring):
    lab, events = ring
    assert {("container.run", f"spark{i}") for i in (1, 2, 3)} <= changed(events)
    verify = [e for e in events if e["event"] == "task_result" and e["task"] == "verify.fabric"]
    assert [e["status"] for e in verify] == ["ok"]
    probe = [e for e in events if e["event"] == "log" and e.get("task") == "verify.fabric"][-1]
    assert "3 rank(s), allreduce sum ok" in probe["message"]
    for node, moved in probe["probe"]["interfaces"].items():
        assert moved and set(moved) <= {"enp1s0f0np0", "enP2p1s0f0np0", "enp1s0f1np1", "enP2p1s0f1np1"}, node


def test_each_node_runs_open_mpi_on_one_interface_and_reaches_both_neighbours(ring):
    lab, _ = ring
    hostfile = sh(lab, "spark1", f"docker exec {CONTAINER} cat /etc/openmpi-hostfile").split()
    assert len(hostfile) == 3
    for i, node in enumerate(("spark1", "spark2", "spark3")):
        env = json.loads(sh(lab, node, f"docker inspect --format '{{{{json .Config.Env}}}}' {CONTAINER}"))
        assert f"OMPI_MCA_btl_tcp_if_include={MPI_IFACE}" in env
        assert f"OMPI_MCA_oob_tcp_if_include={MPI_IFACE}" in env
        assert hostfile[i] in sh(lab, node, f"ip -4 -o addr show dev {MPI_IFACE}")
        # the peers' MPI addresses on the far cable go out over the cable this node shares with their owner
        for j, peer_ip in enumerate(hostfile):
            if j == i:
                continue
            route = sh(lab, node, f"ip -4 route get {peer_ip}")
            assert " dev enp1s0f" in route or " dev enP2p1s0f" in route, (node, peer_ip, route)
    mpirun = sh(lab, "spark1", f"docker exec {CONTAINER} mpirun -np 3 --hostfile /etc/openmpi-hostfile "
                               "--map-by ppr:1:node --mca plm_rsh_pass_environ_mca_params 0 hostname")
    assert sorted(mpirun.split()) == ["spark1", "spark2", "spark3"]


def test_second_ring_run_changes_nothing(ring):
    lab, _ = ring
    rc, events = bootstrap(lab)
    assert rc == 0, failures(events)
    assert changed(events) == set()


def test_the_ring_serves_a_tp2_model_on_two_of_its_three_nodes(ring, tmp_path):
    """inventories/three-sparks-ring.yaml's serve section (the TP=2 Qwen3 preset) on the lab ring: the launch has
    tp_size x pp_size = 2 ranks on the first two nodes, spark3 is left out and said so, the endpoint answers."""
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
    assert said and said[0]["left_out"] == ["spark3"] and said[0]["serving_nodes"] == ["spark1", "spark2"]
    assert ("model.fetch", "spark3") not in changed(events)
    recap = events[-1]
    assert recap["verified"] is True and recap["endpoint"].endswith(":8355") and recap["smoke"]["answer"]
    launch = json.loads(sh(lab, "spark1", f"cat /home/nvidia/.local/state/sparkctl/{document['cluster']['name']}"
                                          "/run/serve/launch.json"))
    assert launch["command"].startswith("mpirun -np 2 --host ")
    assert "sparkctl-models" not in sh(lab, "spark3", "ls /home/nvidia/.cache/huggingface/ 2>/dev/null || true")
    body = json.dumps({"messages": [{"role": "user", "content": "hello ring"}], "max_tokens": 8}).encode()
    request = urllib.request.Request(f"{recap['endpoint']}/v1/chat/completions", data=body,
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=60) as response:
        assert json.loads(response.read())["choices"][0]["message"]["content"].strip()
    rc, events, err = run()
    summaries = [c["summary"] for e in events if e["event"] == "task_result" for c in e.get("changes", [])]
    assert rc == 0 and changed(events) == set(), (why(events), summaries, err[-2000:])
