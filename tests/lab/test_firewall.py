"""sparkctl's firewall on a serving lab pair (TensorRT-LLM's stand-in under mpirun): from the management network
(this machine, on the lab's management bridge and no node) a TCP scan of every port of every node finds sshd and, on
the head, the endpoint, while mpirun, its ranks and trtllm-serve still listen on every address; serving, the
fabric and the rerun all still pass. Drift in the live table is repaired exactly; rules that would cut the
controller's way in are put back by the node itself and the run says so; `firewall: off` leaves the nodes open
again, and warns; a reboot loads the table before the network; `cluster down` removes it."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
import yaml

from sparkctl.tasks.network.firewall import listing_hash
from tests.lab.conftest import poll
from tests.lab.doctor_kit import doctor
from tests.lab.firewall_kit import answering, wildcard_listeners
from tests.lab.lab_kit import HF_TOKEN, changed, failures, reboot, sh, sparkctl, write_inventory
from tests.lab.network_kit import port_open
from tests.lab.serve_kit import SERVE

pytestmark = pytest.mark.lab

TABLE = "nft list table inet sparkctl"


@pytest.fixture(scope="module")
def served(lab_factory, tmp_path_factory):
    lab = lab_factory(2, "pair")
    env = {**os.environ, "HF_TOKEN": HF_TOKEN, "XDG_STATE_HOME": str(tmp_path_factory.mktemp("fw-state"))}
    inventory = write_inventory(lab, tmp_path_factory.mktemp("inv") / "fw.yaml", SERVE)
    code, events, output = sparkctl(["cluster", "bootstrap", inventory, "--json"], env)
    assert code == 0, output[-3000:]
    assert {("network.firewall", "spark1"), ("network.firewall", "spark2")} <= changed(events)
    yield {"lab": lab, "env": env, "inventory": inventory}
    lab.down()


def run(served, *args: str, inventory: str | None = None) -> tuple[int, list[dict], str]:
    return sparkctl([*args, inventory or served["inventory"], "--json"], served["env"])


def test_from_the_management_network_only_sshd_and_the_endpoint_answer(served):
    lab = served["lab"]
    head, worker = (n.mgmt_ip for n in lab.nodes)
    # what the engines listen on at every address, the management network's included: mpirun's and orted's
    # out-of-band ports, trtllm-serve's MPI port
    for node in ("spark1", "spark2"):
        assert wildcard_listeners(lab, node) - {22}, sh(lab, node, "ss -ltnH")
    assert answering(lab, full_scan=True) == {head: {22, 8355}, worker: {22}}
    code, _events, output = sparkctl(["serve", "chat", served["inventory"], "hello"], served["env"])
    assert code == 0 and output.strip(), output
    code, _events, output = sparkctl(["serve", "bench", served["inventory"], "--concurrency", "1", "--requests",
                                      "2", "--max-tokens", "8"], served["env"])
    assert code == 0, output[-2000:]


def test_a_rerun_changes_nothing(served):
    code, events, output = run(served, "cluster", "bootstrap")
    assert code == 0 and changed(events) == set(), changed(events)


def test_a_rule_added_by_hand_is_found_and_the_table_loaded_again(served):
    lab = served["lab"]
    sh(lab, "spark2", "nft add rule inet sparkctl input tcp dport 1024 accept")
    code, events, output = run(served, "cluster", "bootstrap")
    assert code == 0, output[-2000:]
    assert changed(events) == {("network.firewall", "spark2")}
    assert "1024" not in sh(lab, "spark2", TABLE)
    assert listing_hash(sh(lab, "spark2", TABLE)) == sh(lab, "spark2", "cat /etc/sparkctl/firewall.listed").strip()
    assert changed(run(served, "cluster", "bootstrap")[1]) == set()


def test_rules_that_would_cut_the_controller_out_are_put_back_by_the_node_and_the_run_says_so(served, tmp_path):
    lab = served["lab"]
    before = {n: sh(lab, n, TABLE) for n in ("spark1", "spark2")}
    document = yaml.safe_load(Path(served["inventory"]).read_text())
    document["firewall"] = {"ssh_from": ["192.0.2.0/24"]}  # not this machine's network
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(document, sort_keys=False))
    started = time.monotonic()
    code, events, output = sparkctl(["cluster", "bootstrap", str(bad), "--json", "--revert-after", "15"],
                                    served["env"])
    assert code != 0
    failed = {e["node"]: e["message"] for e in failures(events) if e["task"] == "network.firewall"}
    assert set(failed) == {"spark1", "spark2"}, failures(events)
    assert all("could not be reached over a new management connection" in m and "previous firewall back" in m
               for m in failed.values()), failed
    # the node puts its previous rules back by itself: the controller's way in is open again
    for node in ("spark1", "spark2"):
        assert poll(lambda node=node: sh(lab, node, TABLE) == before[node], timeout=60, interval=1)
        assert "192.0.2.0" not in sh(lab, node, "cat /etc/sparkctl/firewall.nft")
    assert all(port_open(n.mgmt_ip) for n in lab.nodes) and time.monotonic() - started < 120
    assert changed(run(served, "cluster", "bootstrap")[1]) == set()


def exposed(served, inventory: str) -> set[tuple[str, str]]:
    """doctor's exposed ports: (node, summary)."""
    report = doctor(served["lab"], env=served["env"], inventory=inventory)
    return {(f["node"], f["summary"]) for f in report["findings"] if f["id"] == "node.exposed_port"}


def test_off_leaves_the_nodes_open_and_says_so_and_doctor_finds_what_answers(served, tmp_path):
    """`firewall: off`: sparkctl's table goes, every run warns; a server a person started on 0.0.0.0 and the
    engines' own ports answer from the other node, and doctor names each with its process; back on, they do not."""
    lab = served["lab"]
    document = yaml.safe_load(Path(served["inventory"]).read_text())
    document["firewall"] = False  # `firewall: off` as YAML reads it
    off = tmp_path / "off.yaml"
    off.write_text(yaml.safe_dump(document, sort_keys=False))
    code, events, output = sparkctl(["cluster", "bootstrap", str(off)], served["env"])
    assert code == 0 and "warning: " in output and "firewall: off: the nodes' own rules are left alone" in output
    assert "table inet sparkctl" not in sh(lab, "spark2", "nft list ruleset")
    worker = lab.nodes[1].mgmt_ip
    opened = wildcard_listeners(lab, "spark2") - {22}
    assert port_open(worker, min(opened))  # what the firewall closed answers again
    sh(lab, "spark2", "setsid nohup python3 -m http.server 8765 --bind 0.0.0.0 >/dev/null 2>&1 < /dev/null &")
    try:
        assert poll(lambda: 8765 in wildcard_listeners(lab, "spark2"), timeout=20)
        found = exposed(served, str(off))
        assert ("spark2", "port 8765 (python3) answers on spark2's management network") in found, found
        assert {node for node, _ in found} >= {"spark1", "spark2"}  # mpirun's, orted's and trtllm-serve's too
        code, events, output = run(served, "cluster", "bootstrap")
        assert code == 0 and ("network.firewall", "spark2") in changed(events)
        assert not port_open(worker, min(opened)) and not port_open(worker, 8765)
        assert exposed(served, served["inventory"]) == set()
    finally:
        sh(lab, "spark2", "pkill -f 'http[.]server 8765'; true")


def test_a_reboot_loads_the_table_before_the_network(served):
    lab = served["lab"]
    loaded = sh(lab, "spark2", TABLE)
    reboot(lab, "spark2")
    assert sh(lab, "spark2", TABLE) == loaded
    assert sh(lab, "spark2", "systemctl is-active sparkctl-firewall.service").strip() == "active"


def test_cluster_down_removes_it(served):
    lab = served["lab"]
    code, events, output = run(served, "cluster", "down")
    assert code == 0, output[-2000:]
    assert ("network.firewall_remove", "spark1") in changed(events)
    for node in ("spark1", "spark2"):
        assert "table inet sparkctl" not in sh(lab, node, "nft list ruleset")
        assert sh(lab, node, "ls /etc/sparkctl/firewall.nft /etc/systemd/system/sparkctl-firewall.service "
                             "2>/dev/null; true").strip() == ""
