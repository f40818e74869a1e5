"""A ring of three through verify.fabric: converge (the MPI probe's allreduce crosses every cable), rerun is a no-op.

Node i's port 0 is cabled to node i+1's port 1, one /24 per cable twin, four fabric interfaces per node.
"""

from __future__ import annotations

import json

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
