"""The cabling map from the wire, on a ring of three cabled out of order (`lab up --ring-order 1,3,2`) with real
lldpd in every node: preflight names each wrong cable before anything changes, doctor shows the map, `inventory
init` writes the order the cables really follow (and a bootstrap with it converges, the example's TP=2 serve section
answering on it), and without lldpd the map says it is inferred."""

from __future__ import annotations

import json

import pytest
import yaml
from click.testing import CliRunner

from sparkctl.cli.main import cli
from sparkctl.exitcodes import ExitStatus
from tests.lab.conftest import poll
from tests.lab.fault_kit import Controller, cut_link, restore_link
from tests.lab.lab_kit import bootstrap, changed, failures, sh
from tests.taskkit import doctor_report

pytestmark = pytest.mark.lab

NODES = ("spark1", "spark2", "spark3")
FABRIC = ("enp1s0f0np0", "enP2p1s0f0np0", "enp1s0f1np1", "enP2p1s0f1np1")


def neighbours(lab, node: str) -> int:
    out = lab.exec(node, ["lldpcli", "show", "neighbors", "-f", "json"]).stdout
    interfaces = (json.loads(out).get("lldp") or {}).get("interface") or []
    return len(interfaces) if isinstance(interfaces, list) else 1


def untouched(lab, node: str) -> str:
    """What preflight must not have changed: fabric addresses, netplan files, ssh keys, containers."""
    return sh(lab, node, "ip -br addr show | grep -v '^lo\\|enP7s7' || true; ls /etc/netplan; "
                         "ls /home/nvidia/.ssh; docker ps -aq")


@pytest.fixture(scope="module")
def miscabled(lab_factory):
    lab = lab_factory(3, "ring", ring_order="1,3,2")
    # lldpd sends on start and every 30 s: a node that booted after its neighbour's first frame waits for the next
    assert poll(lambda: all(neighbours(lab, n) == 4 for n in NODES), timeout=75, interval=1), \
        {n: neighbours(lab, n) for n in NODES}
    return lab


def test_preflight_names_each_wrong_cable_before_changing_anything(miscabled):
    lab = miscabled
    before = {n: untouched(lab, n) for n in NODES}
    rc, events = bootstrap(lab)
    assert rc == 1
    assert len(failures(events)) == 1, failures(events)
    (failed,) = failures(events)
    assert failed["task"] == "preflight.cluster"
    details = "\n".join(failed.get("details") or [])
    assert ("spark1 port 0 (enp1s0f0np0): the inventory wants spark2 port 1 here (the ring in inventory order "
            "spark1 -> spark2 -> spark3 -> spark1, port 0 to the next node's port 1); LLDP sees spark3 port 1 "
            "(enp1s0f1np1, enP2p1s0f1np1)") in details, details
    assert "spark2 port 0 (enp1s0f0np0): the inventory wants spark3 port 1 here" in details
    assert "LLDP sees spark1 port 1 (enp1s0f1np1, enP2p1s0f1np1)" in details
    assert changed(events) == set()
    assert {n: untouched(lab, n) for n in NODES} == before


def test_with_a_node_cut_off_in_preflight_the_wrong_cables_still_stop_every_change(miscabled):
    """Issue 17 meets issue 13: a node lost mid-run is unreachable, its own cabling unknown (not called wrong), and
    preflight.cluster goes on without it (so healthy nodes are not held back by a lost one), judging what the
    others' lldpd see: here still a miscabled ring, so nothing changes anywhere."""
    lab = miscabled
    before = {n: untouched(lab, n) for n in NODES if n != "spark3"}
    run = Controller(lab)
    run.wait_for_start("preflight.node", "spark3")
    cut_link(lab, "spark3")
    try:
        code = run.finish()
    finally:
        restore_link(lab, "spark3")

    assert code == ExitStatus.TASK_FAILED, run.describe()  # a failure outranks the lost node (exit 3)
    assert "Traceback" not in run.stderr
    assert list(run.recap["lost"]) == ["spark3"], run.describe()
    assert [(r["task"], r.get("node")) for r in run.results("failed")] == [("preflight.cluster", None)]
    (failed,) = run.results("failed")
    details = "\n".join(failed.get("details") or [])
    assert ("spark1 port 0 (enp1s0f0np0): the inventory wants spark2 port 1 here (the ring in inventory order "
            "spark1 -> spark2 -> spark3 -> spark1, port 0 to the next node's port 1); LLDP sees spark3 port 1 "
            "(enp1s0f1np1, enP2p1s0f1np1)") in details, details
    assert "spark2 port 0 (enp1s0f0np0): the inventory wants spark3 port 1 here" in details
    assert not [d for d in failed["details"] if d.startswith("spark3 ")], details  # the lost node's ports: unknown
    assert not run.results("changed")
    for name in ("network.netplan", "ssh.keys", "container.image", "container.state"):
        for node in ("spark1", "spark2"):
            assert run.status_of(name, node) == "skipped", (name, node, run.describe())
    assert {n: untouched(lab, n) for n in before} == before


def test_doctor_shows_the_map_from_lldp_and_the_wrong_cables(miscabled):
    result = CliRunner().invoke(cli, ["doctor", str(miscabled.inventory_path), "--json"], catch_exceptions=False)
    report = doctor_report(result.stdout)
    wrong = {(f["node"], f["evidence"].split(":")[0]) for f in report["findings"] if f["id"] == "fabric.cable_wrong"}
    assert wrong == {(n, f"{n} port {p} ({t})") for n in NODES for p, t in ((0, FABRIC[0]), (1, FABRIC[2]))}
    cabling = report["cabling"]
    assert not cabling["inferred"] and cabling["lldp_unavailable"] == {}
    row = next(r for r in cabling["ports"] if (r["node"], r["port"]) == ("spark3", 0))
    assert (row["seen"], row["wanted"], row["source"]) == (
        "spark2 port 1 (enp1s0f1np1, enP2p1s0f1np1)", "spark1 port 1", "lldp (spark2, spark3)")
    text = CliRunner().invoke(cli, ["doctor", str(miscabled.inventory_path)], catch_exceptions=False).output
    assert "cabling (from LLDP)" in text
    assert "spark3 port 0 enp1s0f0np0/enP2p1s0f0np0 -> spark2 port 1" in text


def test_inventory_init_writes_the_cabled_order_and_a_bootstrap_with_it_converges(miscabled, tmp_path):
    lab = miscabled
    written = tmp_path / "inventory.yaml"
    hosts = [lab.state.node(n).mgmt_ip for n in NODES]
    result = CliRunner().invoke(cli, ["inventory", "init", *hosts, "-o", str(written), "--user", "nvidia",
                                      "--identity-file", str(lab.key_path), "--known-hosts",
                                      str(lab.known_hosts_path)], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    drafted = yaml.safe_load(written.read_text())
    assert [n["name"] for n in drafted["nodes"]] == ["spark1", "spark3", "spark2"]
    assert drafted["fabric"]["topology"] == "ring"
    assert "seen with LLDP: a ring, cabled in the order spark1 -> spark3 -> spark2 -> spark1" in result.output
    # the lab's own inventory (its ssh settings, its image) with the nodes in the order init wrote
    document = yaml.safe_load(lab.inventory_path.read_text())
    by_name = {n["name"]: n for n in document["nodes"]}
    document["nodes"] = [by_name[n["name"]] for n in drafted["nodes"]]
    lab.inventory_path.write_text(yaml.safe_dump(document, sort_keys=False))
    rc, events = bootstrap(lab, "--only", "preflight,network")
    assert rc == 0, failures(events)
    assert {("network.netplan", n) for n in NODES} <= changed(events)
    # the jumbo pings across every cable of the ring pass
    assert ("network.verify", None) in {(e["task"], e.get("node")) for e in events
                                        if e["event"] == "task_result" and e["status"] == "ok"}


def test_the_three_ring_example_serves_once_cabled_as_init_wrote(miscabled, tmp_path):
    """inventories/three-sparks-ring.yaml's serve section (the TP=2 Qwen3 preset) on this ring of three, its nodes in
    the order init wrote (spark1, spark3, spark2): the launch has tp_size x pp_size = 2 ranks on the first two nodes,
    the third is left out and said so (and gets no copy of the model), the endpoint answers, a rerun changes
    nothing."""
    import os
    import subprocess
    import urllib.request
    from pathlib import Path

    lab = miscabled
    document = yaml.safe_load(lab.inventory_path.read_text())
    assert [n["name"] for n in document["nodes"]] == ["spark1", "spark3", "spark2"]  # as the test above wrote it
    example = yaml.safe_load((Path(__file__).resolve().parents[2] / "inventories" / "three-sparks-ring.yaml")
                             .read_text())
    # a lab node has the machine's memory, far below a Spark's: the fit is a warning here, never a refusal
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
    assert said and said[0]["left_out"] == ["spark2"] and said[0]["serving_nodes"] == ["spark1", "spark3"]
    assert {("model.fetch", "spark1"), ("model.fetch", "spark3")} <= changed(events)
    assert ("model.fetch", "spark2") not in changed(events)
    recap = events[-1]
    assert recap["verified"] is True and recap["endpoint"].endswith(":8355") and recap["smoke"]["answer"]
    assert "sparkctl-models" not in sh(lab, "spark2", "ls /home/nvidia/.cache/huggingface/ 2>/dev/null || true")
    body = json.dumps({"messages": [{"role": "user", "content": "hello ring"}], "max_tokens": 8}).encode()
    key = subprocess.run(["sparkctl", "serve", "key", str(inventory)], capture_output=True, text=True, timeout=60,
                         env=env, check=True).stdout.strip()  # the endpoint wants it (docs/gateway.md)
    request = urllib.request.Request(f"{recap['endpoint']}/v1/chat/completions", data=body,
                                     headers={"Content-Type": "application/json", "Authorization": f"Bearer {key}"})
    with urllib.request.urlopen(request, timeout=60) as response:
        assert json.loads(response.read())["choices"][0]["message"]["content"].strip()
    rc, events, err = run()
    summaries = [c["summary"] for e in events if e["event"] == "task_result" for c in e.get("changes", [])]
    assert rc == 0 and changed(events) == set(), (why(events), summaries, err[-2000:])


def test_without_lldpd_the_map_says_it_is_inferred(miscabled, tmp_path):
    """On an inventory in the order the cables contradict (spark1, spark2, spark3), whatever order the tests above
    left the lab's own inventory in: with lldpd the wrong cables are named, without it nothing is called wrong."""
    lab = miscabled
    document = yaml.safe_load(lab.inventory_path.read_text())
    by_name = {n["name"]: n for n in document["nodes"]}
    document["nodes"] = [by_name[n] for n in NODES]
    contradicted = tmp_path / "contradicted.yaml"
    contradicted.write_text(yaml.safe_dump(document, sort_keys=False))
    seen = CliRunner().invoke(cli, ["doctor", str(contradicted), "--json"], catch_exceptions=False)
    assert any(f["id"] == "fabric.cable_wrong" for f in doctor_report(seen.stdout)["findings"])
    for node in NODES:
        lab.exec(node, ["systemctl", "stop", "lldpd"], check=True)
    try:
        result = CliRunner().invoke(cli, ["doctor", str(contradicted), "--json"], catch_exceptions=False)
        report = doctor_report(result.stdout)
        assert report["cabling"]["inferred"]
        assert set(report["cabling"]["lldp_unavailable"]) == set(NODES)
        assert {r["source"] for r in report["cabling"]["ports"]} == {"inferred"}
        notes = {(f["id"], f["node"], f["severity"]) for f in report["findings"] if f["id"].startswith("fabric.lldp")}
        assert notes == {("fabric.lldp_unavailable", n, "info") for n in NODES}
        assert not any(f["id"] == "fabric.cable_wrong" for f in report["findings"])
    finally:
        for node in NODES:
            lab.exec(node, ["systemctl", "start", "lldpd"])
