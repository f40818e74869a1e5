"""The container mesh's proofs on record (tasks/container/proofs.py): a no-op rerun tries no container pair whose
fingerprint holds; a container recreated, a key or a file changed makes exactly its pairs tried again, from inside
the containers; a pair that fails leaves the record."""

from __future__ import annotations

import pytest

from sparkctl.taskgraph.task import TaskFailed
from sparkctl.tasks.container.proofs import CONTAINER_MESH
from sparkctl.tasks.container.ssh import ContainerSshTask, mesh_read_script
from sparkctl.tasks.context import RunOptions
from sparkctl.tasks.proof import pair_id
from sparkctl.transport.framing import Framing
from tests.taskkit import Records
from tests.unit.container_kit import PUBS, cluster, pair, running_like_plan, ssh_listing

TO_SPARK2 = pair_id("spark1", "spark2", "root@192.168.100.11")
TO_SPARK1 = pair_id("spark2", "spark1", "root@192.168.100.10")
VERDICTS = {"spark1": "ok spark2 root@192.168.100.11\n", "spark2": "ok spark1 root@192.168.100.10\n"}


def run(records, *, carried=True, pubs=PUBS, started=None, deny=frozenset(), options=None):
    """container.ssh over a converged pair; `carried`: the read tried the pairs (no record yet). Returns the
    context and the pairs tried from inside the containers (docker exec)."""
    inv, facts = pair()
    cctx, _ = cluster(inv, facts)
    for node in ("spark1", "spark2"):
        facts[node].containers["trtllm-multinode"] = running_like_plan(
            cctx, node, id=f"c-{node}", started_at=(started or {}).get(node, "2026-11-28T01:00:00Z"))
    inside = {"spark1": "fail spark2 root@192.168.100.11 Permission denied (publickey)\n" if TO_SPARK2 in deny
              else VERDICTS["spark1"], "spark2": VERDICTS["spark2"]}
    rules = {n: [(r":begin client@@", ssh_listing(inv, facts, n, pubs, VERDICTS[n] if carried else None)),
                 (r"^docker exec", inside[n])] for n in ("spark1", "spark2")}
    cctx, events = cluster(inv, facts, rules)
    cctx.records = records
    if options is not None:
        cctx.options = options
    assert ContainerSshTask().check(cctx) == []
    tried = {pair for node, pair in (("spark1", TO_SPARK2), ("spark2", TO_SPARK1))
             if any(c.startswith("docker exec") for c in cctx.nodes[node].transport.commands)}
    return cctx, tried, events


def test_a_rerun_takes_both_container_pairs_from_the_record_and_its_read_tries_none():
    records = Records()
    cctx, tried, _ = run(records)
    assert tried == set() and set(records[CONTAINER_MESH]) == {TO_SPARK1, TO_SPARK2}
    assert "ConnectTimeout=5" not in mesh_read_script(cctx, "spark1", Framing())  # the next read carries no tries
    cctx, tried, events = run(records, carried=False)
    assert tried == set()
    assert [e.message for e in events if e.event == "log"][-1].startswith(
        "2 of 2 container pair(s) taken from the record")


def test_a_recreated_container_makes_every_pair_it_is_in_tried_again_from_inside():
    records = Records()
    run(records)
    before = dict(records[CONTAINER_MESH])
    _, tried, _ = run(records, carried=False, started={"spark2": "2026-11-28T02:00:00Z"})
    assert tried == {TO_SPARK1, TO_SPARK2}
    assert records[CONTAINER_MESH][TO_SPARK1][0] != before[TO_SPARK1][0]


@pytest.mark.parametrize("node, which", [("spark2", 1), ("spark1", 0)])
def test_a_new_key_in_one_container_makes_every_pair_tried_again(node, which):
    """Every container's authorized_keys holds every client key and its known_hosts every host key: a new one
    changes what every pair's login reads."""
    records = Records()
    run(records)
    keys = list(PUBS[node])
    keys[which] = keys[which].replace(" h", "-new h").replace(" c@", "-new c@")
    pubs = dict(PUBS, **{node: tuple(keys)})
    _, tried, _ = run(records, carried=False, pubs=pubs)  # the files follow the key, as container.ssh writes them
    assert tried == {TO_SPARK1, TO_SPARK2}
    _, tried, _ = run(records, carried=False, pubs=pubs)
    assert tried == set()


def test_a_pair_refused_inside_the_containers_fails_and_leaves_the_record():
    records = Records()
    run(records)
    with pytest.raises(TaskFailed, match="container-to-container ssh"):
        run(records, carried=False, started={"spark2": "2026-11-28T03:00:00Z"}, deny={TO_SPARK2})
    assert set(records[CONTAINER_MESH]) == {TO_SPARK1}


def test_a_pair_the_read_found_failing_is_tried_again_though_its_proof_is_on_record():
    """The record missed what broke it: the read's own try (a pair of a node with another pair off the record)
    decides that it is tried again, from inside the containers."""
    records = Records()
    run(records)
    inv, facts = pair()
    cctx, _ = cluster(inv, facts)
    for node in ("spark1", "spark2"):
        facts[node].containers["trtllm-multinode"] = running_like_plan(cctx, node, id=f"c-{node}",
                                                                         started_at="2026-11-28T01:00:00Z")
    failing = {"spark1": "fail spark2 root@192.168.100.11 Permission denied (publickey)\n",
               "spark2": VERDICTS["spark2"]}
    rules = {n: [(r":begin client@@", ssh_listing(inv, facts, n, PUBS, failing[n])),
                 (r"^docker exec", failing[n])] for n in ("spark1", "spark2")}
    cctx, _ = cluster(inv, facts, rules)
    cctx.records = records
    with pytest.raises(TaskFailed, match="container-to-container ssh"):
        ContainerSshTask().check(cctx)
    assert any(c.startswith("docker exec") for c in cctx.nodes["spark1"].transport.commands)
    assert set(records[CONTAINER_MESH]) == {TO_SPARK1}


def test_reprove_tries_every_container_pair():
    records = Records()
    run(records)
    _, tried, _ = run(records, carried=False, options=RunOptions(reprove=True))
    assert tried == {TO_SPARK1, TO_SPARK2}
