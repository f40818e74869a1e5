"""Only what must answer on the management network answers, on a serving lab pair (TensorRT-LLM's stand-in under
mpirun).

sparkctl's firewall: from the management network (this machine, on the lab's management bridge and no node) a TCP
scan of every port of every node finds sshd and, on the head, the endpoint, while mpirun, its ranks and trtllm-serve
still listen on every address; serving, the fabric and the rerun all still pass. Drift in the live table is repaired
exactly; rules that would cut the controller's way in are put back by the node itself and the run says so;
`firewall: off` leaves the nodes open again, and warns, and doctor names what answers; a reboot loads the table
before the network; `cluster down` removes it.

The endpoint over HTTPS with a certificate made for the test (serve.tls): `serve chat` works and checks it, plain
HTTP to the management address is refused, the certificate's key is in no output, plan, journal, bundle or node log;
doctor finds the head serving another certificate and --fix puts the right one back; `cluster down` removes the
gateway's files."""

from __future__ import annotations

import base64
import http.client
import os
import re
import socket
import ssl
import time
from pathlib import Path

import pytest
import yaml

from sparkctl.knowledge.certificates import leaf_fingerprint
from sparkctl.tasks.network.firewall import listing_hash
from tests.certificates_kit import issue
from tests.lab.conftest import poll
from tests.lab.doctor_kit import doctor, errors
from tests.lab.firewall_kit import answering, wildcard_listeners
from tests.lab.lab_kit import HF_TOKEN, changed, failures, reboot, sh, sparkctl, write_inventory
from tests.lab.network_kit import port_open
from tests.lab.serve_kit import SERVE, written_places

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


def with_tls(served, tmp_path: Path, issued) -> str:
    document = yaml.safe_load(Path(served["inventory"]).read_text())
    document["serve"]["tls"] = {"certificate": str(issued.certificate), "key": str(issued.key),
                                "ca": str(issued.ca)}
    path = tmp_path / "tls.yaml"
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    return str(path)


@pytest.fixture(scope="module")
def tls(served, tmp_path_factory):
    """The pair serving over HTTPS: its inventory, the certificate made for it, and what the first run printed."""
    folder = tmp_path_factory.mktemp("tls")
    issued = issue(folder / "pki", [served["lab"].nodes[0].mgmt_ip])
    inventory = with_tls(served, folder, issued)
    code, events, output = run(served, "cluster", "bootstrap", inventory=inventory)
    assert code == 0, output[-3000:]
    return {"inventory": inventory, "issued": issued, "events": events, "outputs": [output]}


def plain_http(address: str, port: int) -> tuple[int, bytes]:
    connection = http.client.HTTPConnection(address, port, timeout=10)
    connection.request("GET", "/v1/models")
    response = connection.getresponse()
    return response.status, response.read()


def test_with_tls_the_endpoint_answers_https_only_and_sparkctl_s_clients_check_it(served, tls):
    head = served["lab"].nodes[0].mgmt_ip
    # the gateway, and the deployment's record (it keeps serve: as written); the world is left running
    assert {task for task, _node in changed(tls["events"])} == {"serve.gateway", "serve.record"}
    (recap,) = [e for e in tls["events"] if e["event"] == "recap"]
    # asked on the head through the gateway's HTTPS, and from here: both checked the certificate
    assert recap["endpoint"] == f"https://{head}:8355" and recap["smoke"]["reachable_from_here"] is True
    code, _events, output = sparkctl(["serve", "chat", tls["inventory"], "hello"], served["env"])
    tls["outputs"].append(output)
    # straight from this machine over HTTPS, not round through the head
    assert code == 0 and output.strip() and "not reachable from here" not in output, output
    code, _events, output = sparkctl(["serve", "status", tls["inventory"]], served["env"])
    tls["outputs"].append(output)
    # the certificate the inventory names, and the endpoint reached from here with it checked
    assert code == 0 and f"CN={head}" in output and "trusted through" in output, output
    assert re.search(r"from here\s+reachable", output), output
    status, body = plain_http(head, 8355)
    assert status == 400 and b"plain HTTP request was sent to HTTPS port" in body
    # a client that does not trust the test's CA refuses the endpoint
    with pytest.raises(ssl.SSLCertVerificationError):
        socket_ = socket.create_connection((head, 8355), timeout=10)
        ssl.create_default_context().wrap_socket(socket_, server_hostname=head)
    code, events, output = run(served, "cluster", "bootstrap", inventory=tls["inventory"])
    tls["outputs"].append(output)
    assert code == 0 and changed(events) == set(), changed(events)


def test_the_certificate_s_key_is_in_no_output_plan_journal_bundle_or_node_log(served, tls, tmp_path):
    lab, env = served["lab"], served["env"]
    places = written_places(lab, env, tls["inventory"], tls["outputs"], tmp_path / "bundle.tgz")
    lines = tls["issued"].key_lines()
    assert [where for where, text in places.items() if any(line in text for line in lines)] == []
    # where it is: beside the gateway's config on the head, readable by its owner only
    key = f"{gateway_folder(lab)}/tls-key.pem"
    assert sh(lab, "spark1", f"stat -c %a {key}").strip() == "600"
    assert lines[0] in sh(lab, "spark1", f"cat {key}")


def gateway_folder(lab) -> str:
    cluster = yaml.safe_load(lab.inventory_path.read_text())["cluster"]["name"]
    return f"/home/nvidia/.local/state/sparkctl/{cluster}/gateway"


def test_doctor_finds_the_head_serving_another_certificate_and_fix_puts_it_back(served, tls, tmp_path):
    """What the gateway really shows a client: another certificate and key written by hand and NGINX reloaded."""
    lab, env = served["lab"], served["env"]
    other = issue(tmp_path / "other", [lab.nodes[0].mgmt_ip], prefix="other")
    folder = gateway_folder(lab)
    for path, name in ((other.certificate, "tls-certificate.pem"), (other.key, "tls-key.pem")):
        encoded = base64.b64encode(path.read_bytes()).decode()
        sh(lab, "spark1", f"echo {encoded} | base64 -d > {folder}/{name}")
    sh(lab, "spark1", "docker exec sparkctl-gateway nginx -c /etc/sparkctl-gateway/nginx.conf -s reload")
    assert poll(lambda: served_fingerprint(lab) == leaf_fingerprint(other.certificate.read_bytes()), timeout=20)
    report = doctor(lab, env=env, inventory=tls["inventory"])
    assert errors(report) == {("serve.tls_stale", "spark1")}, report["findings"]
    fixed = doctor(lab, "--fix", env=env, inventory=tls["inventory"])
    assert fixed["fix"]["ran"] and fixed["fix"]["exit_status"] == 0, fixed["fix"]
    # healthy (the lab's 10 Gb/s veths keep their speed warning), the certificate served the inventory's
    assert fixed["healthy"] and errors(fixed) == set(), fixed["findings"]
    assert [f for f in fixed["findings"] if f["id"].startswith("serve.tls")] == [], fixed["findings"]
    assert served_fingerprint(lab) == leaf_fingerprint(tls["issued"].certificate.read_bytes())
    code, events, output = run(served, "cluster", "bootstrap", inventory=tls["inventory"])
    assert code == 0 and changed(events) == set(), changed(events)


def served_fingerprint(lab) -> str:
    """The certificate the gateway shows a client at the head's management address (asked from this machine)."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
    with socket.create_connection((lab.nodes[0].mgmt_ip, 8355), timeout=10) as raw, \
            context.wrap_socket(raw) as wrapped:
        return leaf_fingerprint(ssl.DER_cert_to_PEM_cert(wrapped.getpeercert(True)).encode())


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
    # the gateway's files (the API key in its config, serve.tls's key) go with it
    assert sh(lab, "spark1", f"test -e {gateway_folder(lab)} && echo there || echo gone").strip() == "gone"
