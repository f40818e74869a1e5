"""The one large lab of the suite: a ring of eight, the largest ring sparkctl builds. Opposite nodes are four
hops apart, relayed by three nodes each way. It bootstraps through verify.fabric (every rank, across the relays),
and a rerun changes nothing. It renders netplan through NetworkManager (DGX OS's, the lab's default; the ring of
four in test_bootstrap_ring.py uses networkd), with preflight's LLDP cabling map judging every ring cable. Its
speed is measured in benchmarks/scale.py, not here."""

from __future__ import annotations

import pytest

from tests.lab.lab_kit import bootstrap, changed, failures

pytestmark = pytest.mark.lab

NODES = [f"spark{i}" for i in range(1, 9)]


@pytest.fixture(scope="module")
def ring8(lab_factory):
    lab = lab_factory(8, "ring", renderer="networkmanager")
    rc, events = bootstrap(lab)
    assert rc == 0, failures(events)
    return lab, events


def test_a_ring_of_eight_bootstraps_through_verify_and_reruns_with_nothing_changed(ring8):
    lab, events = ring8
    verify = [e for e in events if e["event"] == "task_result" and e["task"] in ("network.verify", "ssh.verify",
                                                                               "container.ssh", "verify.fabric")]
    assert sorted((e["task"], e["status"]) for e in verify) == [
        ("container.ssh", "changed"), ("network.verify", "ok"), ("ssh.verify", "ok"), ("verify.fabric", "ok")]
    probe = [e for e in events if e["event"] == "log" and e.get("task") == "verify.fabric"][-1]
    assert "8 rank(s), allreduce sum ok" in probe["message"]
    # spark5 is opposite spark1: a jumbo ping from spark1 crosses three relays (TTL 64 - 3)
    far = lab.exec("spark1", ["sh", "-c", "docker exec trtllm-multinode sed -n 5p /etc/openmpi-hostfile"]).stdout
    ping = lab.exec("spark1", ["ping", "-c", "1", "-W", "2", "-M", "do", "-s", "8972", far.strip()]).stdout
    assert "ttl=61" in ping, ping
    rc, again = bootstrap(lab)
    assert rc == 0, failures(again)
    assert changed(again) == set()
