"""The MPI proof on record (tasks/proof.py): mpirun is skipped on a no-op rerun only when nothing it depends on
changed since the last probe that passed."""

from __future__ import annotations

import time

import pytest

from sparkctl.facts import Address, Route
from sparkctl.runs.proofs import ProofFile
from sparkctl.taskgraph.events import Event
from sparkctl.taskgraph.task import TaskFailed
from sparkctl.tasks import proof
from sparkctl.tasks.mpi.hostfile import HostfileTask
from sparkctl.tasks.mpi.reads import hostfile_reads
from sparkctl.tasks.verify.fabric import FabricVerify
from sparkctl.transport.framing import Framing
from tests.taskkit import Records, framed
from tests.unit.container_kit import PUBS, cluster, pair, probe_line, running_like_plan, ssh_listing


def converged(rules=None, records=None):
    inv, facts = pair()
    cctx, _ = cluster(inv, facts)
    for node in ("spark1", "spark2"):
        facts[node].containers["trtllm-multinode"] = running_like_plan(cctx, node, id=f"c-{node}",
                                                                         started_at="2026-11-25T01:00:00Z")
    cctx, events = cluster(inv, facts, rules)
    cctx.records = Records() if records is None else records
    return cctx, facts, events


def probe_rules(cctx, env, result=None):
    hostfile = cctx.plan().hostfile
    return {"spark1": [(r"docker exec", framed([("container-hostfile", hostfile), ("probe", ""),
                                                ("probe-result", (result or probe_line(env)) + "\n"),
                                                ("nccl", "")]))],
            "spark2": [(r"docker exec", framed([("container-hostfile", hostfile), ("nccl", "")]))]}


def passed_once():
    """A cluster whose probe just passed (and so is on record); returns a fresh context over the same state."""
    cctx, facts, _ = converged()
    env = cctx.plan().nodes["spark1"].container.env
    cctx, facts, _ = converged(probe_rules(cctx, env))
    assert FabricVerify().check(cctx) == []
    assert proof.KEY in cctx.records
    records = cctx.records
    again, facts2, events = converged(probe_rules(cctx, env), records)
    return again, facts2, events


def ran_probe(cctx) -> bool:
    return any("mpi_probe" in c for n in cctx.nodes for c in cctx.nodes[n].transport.commands)


def test_a_noop_rerun_does_not_run_the_probe_again_and_says_so():
    cctx, _, events = passed_once()
    assert FabricVerify().check(cctx) == []
    assert not ran_probe(cctx)
    assert any("MPI probe not run again: nothing it depends on changed" in (e.message or "") for e in events)
    # and mpi.hostfile does not run `mpirun hostname` either
    head_inside = hostfile_reads(cctx, Framing("n"))["spark1"][1]
    assert "mpirun" not in head_inside


@pytest.mark.parametrize("change", [
    "container restarted", "container recreated", "env", "address", "mtu", "link down", "route", "forwarding",
    "firewall", "hostname"])
def test_anything_the_probe_depends_on_changing_makes_it_run_again(change):
    cctx, facts, _ = passed_once()
    f = facts["spark2"]
    info = f.containers["trtllm-multinode"]
    if change == "container restarted":
        info.started_at = "2026-11-25T02:00:00Z"
    elif change == "container recreated":
        info.id = "c-new"
    elif change == "env":
        info.env["NCCL_DEBUG"] = "INFO"
    elif change == "address":
        f.interfaces["enP2p1s0f1np1"].addresses.append(Address("192.168.101.99", 24, "inet", "global"))
    elif change == "mtu":
        f.interfaces["enp1s0f1np1"].mtu = 1500
    elif change == "link down":
        f.interfaces["enp1s0f1np1"].carrier = False
    elif change == "route":
        f.routes.append(Route("192.168.9.0/24", "192.168.100.10", "enp1s0f1np1"))
    elif change == "forwarding":
        f.ipv4_conf["enp1s0f1np1.forwarding"] = "1"
    elif change == "firewall":
        f.firewall = "#nft\ntable inet filter { chain input { tcp dport 2233 drop } }"
    elif change == "hostname":
        f.hostname = "spark2-renamed"
    assert proof.proven(cctx) is None


def test_not_relied_on_after_a_change_in_the_same_run_nor_when_old():
    cctx, _, _ = passed_once()
    cctx.note(Event("task_changes", task="container.ssh"))
    assert proof.proven(cctx) is None
    cctx, _, _ = passed_once()
    cctx.records[proof.KEY]["at"] = time.time() - proof.MAX_AGE_S - 1
    assert proof.proven(cctx) is None


def test_a_failed_probe_clears_the_record():
    cctx, facts, _ = passed_once()
    env = cctx.plan().nodes["spark1"].container.env
    facts["spark2"].containers["trtllm-multinode"].started_at = "2026-11-25T03:00:00Z"  # not proven: runs again
    records = cctx.records
    again, _, _ = converged(probe_rules(cctx, env, result="not json"), records)
    again.nodes["spark2"]._facts.containers["trtllm-multinode"].started_at = "2026-11-25T03:00:00Z"
    with pytest.raises(TaskFailed):
        FabricVerify().check(again)
    assert proof.KEY not in records


def test_hostfile_task_skips_mpirun_only_on_record():
    cctx, _, events = passed_once()
    HostfileTask()._verify(cctx, None)
    assert not any(c for n in cctx.nodes for c in cctx.nodes[n].transport.execs)
    assert any("mpirun hostname not run" in (e.message or "") for e in events)


def test_the_record_file_round_trips_and_a_broken_one_is_no_record(tmp_path):
    records = ProofFile("lab/x", tmp_path)
    assert records.get("mpi") is None
    records.put("mpi", {"fingerprint": "f", "at": 1.0})
    assert ProofFile("lab/x", tmp_path).get("mpi") == {"fingerprint": "f", "at": 1.0}
    records.put("mpi", None)
    assert records.get("mpi") is None
    records.path.write_text("{broken")
    assert records.get("mpi") is None
    assert records.path.parent == tmp_path and records.path.name == "lab_x.json"


def test_a_noop_run_proves_the_container_mesh_and_verifies_in_one_round_trip_per_node():
    """container.ssh's round trip carries mpi.hostfile's and verify.fabric's reads; with the MPI probe on record,
    the MPI and verify phases need no round trip of their own (and mpirun runs nowhere)."""
    from sparkctl.tasks.container.ssh import ContainerSshTask
    cctx, facts, _ = passed_once()
    inv = cctx.inventory
    good = cctx.plan().hostfile
    more = {"spark1": (("node-hostfile", good), ("container-hostfile", good), ("nccl", ""), ("exposure", "")),
            "spark2": (("node-hostfile", good), ("container-hostfile", good), ("nccl", ""), ("exposure", ""))}
    verdicts = {"spark1": "ok spark2 root@192.168.100.11\n", "spark2": "ok spark1 root@192.168.100.10\n"}
    rules = {n: [(r":begin client@@", ssh_listing(inv, facts, n, PUBS, verdicts[n], more[n]))]
             for n in ("spark1", "spark2")}
    records = cctx.records
    cctx, _, events = converged(rules, records)
    for node in ("spark1", "spark2"):
        cctx.nodes[node]._facts = facts[node]
    assert ContainerSshTask().check(cctx) == []
    assert HostfileTask().check(cctx) == []
    assert FabricVerify().check(cctx) == []
    assert [cctx.nodes[n].transport.round_trips for n in ("spark1", "spark2")] == [1, 1]
    assert not any("mpirun" in c for n in ("spark1", "spark2") for c in cctx.nodes[n].transport.commands)
    assert any("MPI probe not run again" in (e.message or "") for e in events)


def test_reprove_runs_the_probe_whatever_the_record_says():
    cctx, _, _ = passed_once()
    assert proof.proven(cctx) is not None
    cctx.options.reprove = True
    assert proof.proven(cctx) is None


def state_rules(cctx, facts):
    """container.state's read answered on both nodes as a converged pair's (its carried container.ssh read too)."""
    from sparkctl.plan.mpi import MPI_PROBE, probe_source
    inv = cctx.inventory
    good = cctx.plan().hostfile
    verdicts = {"spark1": "ok spark2 root@192.168.100.11\n", "spark2": "ok spark1 root@192.168.100.10\n"}
    state = (("file:entrypoint.sh", cctx.plan().entrypoint), (f"file:run/{MPI_PROBE}", probe_source()),
             ("have", "hf_cache\nrun\nkeydir\nclient\nhostkey"))

    def answer(node):
        listing = ssh_listing(inv, facts, node, PUBS, verdicts[node],
                               (("node-hostfile", good), ("container-hostfile", good), ("nccl", ""),
                                ("exposure", "")))
        reply = lambda script: framed(list(state))(script) + listing(script)  # noqa: E731
        reply.wants_script = True
        return reply

    return {n: [(r":begin file:", answer(n))] for n in ("spark1", "spark2")}


def test_a_noop_container_phase_mpi_and_verify_are_one_round_trip_per_node():
    """container.state's read carries container.ssh's (and so mpi.hostfile's and verify.fabric's): with the MPI
    probe on record, everything from container.state to verify.fabric is one round trip per node."""
    from sparkctl.tasks.container.ssh import ContainerSshTask
    from sparkctl.tasks.container.state import ContainerStateTask

    cctx, facts, _ = passed_once()
    records = cctx.records
    cctx, _, events = converged(state_rules(cctx, facts), records)
    for node in ("spark1", "spark2"):
        cctx.nodes[node]._facts = facts[node]
    for node in ("spark1", "spark2"):
        assert ContainerStateTask().check(cctx.nodes[node]) == []
    assert ContainerSshTask().check(cctx) == []
    assert HostfileTask().check(cctx) == []
    assert FabricVerify().check(cctx) == []
    assert [cctx.nodes[n].transport.round_trips for n in ("spark1", "spark2")] == [1, 1]
    assert not any("mpirun" in c for n in ("spark1", "spark2") for c in cctx.nodes[n].transport.commands)


def test_a_state_read_that_runs_mpirun_keeps_for_the_next_run_the_read_it_will_make():
    """Without an MPI proof on record the head's container.state read runs mpirun; the next run (the proof on
    record by then) renders it without, so that is what is kept for it to read ahead, not the one with mpirun
    (which it would run beside its facts for nothing)."""
    from sparkctl.tasks.container.state import ContainerStateTask
    from sparkctl.tasks.read_ahead import RECORD, ReadsAhead

    kept = {}
    for has_proof in (False, True):
        cctx, facts, _ = passed_once() if has_proof else converged()
        records = cctx.records
        cctx, _, _ = converged(state_rules(cctx, facts), records)
        cctx.reads_ahead = ReadsAhead(records)
        for node in ("spark1", "spark2"):
            cctx.nodes[node]._facts = facts[node]
            ContainerStateTask().check(cctx.nodes[node])
        assert ("mpirun" in cctx.nodes["spark1"].transport.commands[-1]) is not has_proof
        cctx.reads_ahead.save()
        kept[has_proof] = {n: tasks["container.state"][0] for n, tasks in records[RECORD].items()}
    assert "mpirun" not in kept[False]["spark1"]
    assert kept[False] == kept[True]  # exactly what a run with the proof on record sends


def test_verify_fabric_reports_a_container_sshd_that_answers_on_the_management_address():
    """The mesh belongs on the fabric: verify (not only doctor) says so when a node's management address accepts
    a connection to the container's ssh port."""
    from sparkctl.tasks.container.ssh import ContainerSshTask
    cctx, facts, _ = passed_once()
    inv = cctx.inventory
    good = cctx.plan().hostfile
    more = {"spark1": (("node-hostfile", good), ("container-hostfile", good), ("nccl", ""), ("exposure", "")),
            "spark2": (("node-hostfile", good), ("container-hostfile", good), ("nccl", ""),
                       ("exposure", "open 10.0.0.12\n"))}
    verdicts = {"spark1": "ok spark2 root@192.168.100.11\n", "spark2": "ok spark1 root@192.168.100.10\n"}
    rules = {n: [(r":begin client@@", ssh_listing(inv, facts, n, PUBS, verdicts[n], more[n]))]
             for n in ("spark1", "spark2")}
    cctx, _, _ = converged(rules, cctx.records)
    for node in ("spark1", "spark2"):
        cctx.nodes[node]._facts = facts[node]
    assert ContainerSshTask().check(cctx) == []
    with pytest.raises(TaskFailed) as failed:
        FabricVerify().check(cctx)
    text = str(failed.value) + " ".join(failed.value.details)
    assert "spark2" in text and f"10.0.0.12:{inv.container.ssh_port}" in text
    assert "answers on the management address (the mesh belongs on the fabric)" in text
