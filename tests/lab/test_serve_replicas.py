"""Replicas behind one name, on a lab of four: a TP=2 vLLM world on spark1 and spark2, and two replicas of a one-node
model that sparkctl places on spark3 and spark4 (where the most memory is left). Both replicas answer to the one
name through the head's gateway, and under a load of concurrent requests both receive some (NGINX's least_conn);
a rerun changes nothing.
"""

from __future__ import annotations

import json
import os
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from sparkctl.plan.serve_unit import parse_show, show_command
from tests.lab.lab_kit import HF_TOKEN, changed, sh, sparkctl
from tests.lab.ranks_kit import engine_inventory, run

pytestmark = pytest.mark.lab

CONTAINER = "vllm-multinode"
SERVE = {"models": [
    {"preset": "llama-3.3-70b-vllm", "name": "llama", "nodes": ["spark1", "spark2"], "fit_check": "warn",
     "ready_timeout": 300},
    {"model": "openai/gpt-oss-120b", "engine": "vllm", "name": "oss", "replicas": 2, "ready_timeout": 300}]}
#: the second model's engine port (serve.port's engine port, moved by one entry's stride)
REPLICA_PORT = 18357


@pytest.fixture(scope="module")
def served(lab_factory, tmp_path_factory):
    lab = lab_factory(4, "ring")
    env = {**os.environ, "HF_TOKEN": HF_TOKEN, "XDG_STATE_HOME": str(tmp_path_factory.mktemp("replicas-state"))}
    inventory = engine_inventory(lab, tmp_path_factory.mktemp("inv") / "replicas.yaml", SERVE)
    code, events, output = sparkctl(["cluster", "bootstrap", inventory, "--json"], env, timeout=900)
    assert code == 0, output[-3000:]
    key = sparkctl(["serve", "key", inventory], env)[2].strip().splitlines()[-1]
    cluster = yaml.safe_load(lab.inventory_path.read_text())["cluster"]["name"]
    yield {"lab": lab, "env": env, "inventory": inventory, "cluster": cluster, "key": key,
           "endpoint": f"http://{lab.nodes[0].mgmt_ip}:8355"}
    lab.down()


def chat(served, model: str) -> int:
    body = json.dumps({"model": model, "max_tokens": 2, "messages": [{"role": "user", "content": "who?"}]}).encode()
    request = urllib.request.Request(served["endpoint"] + "/v1/chat/completions", data=body, headers={
        "Content-Type": "application/json", "Authorization": f"Bearer {served['key']}"})
    with urllib.request.urlopen(request, timeout=60) as answer:
        return answer.status


def requests_served(served, node: str) -> float:
    """The replica's own count of requests served, asked on its node where it answers (its fabric address)."""
    listening = sh(served["lab"], node, f"ss -ltnH 'sport = :{REPLICA_PORT}'").split()
    address = listening[3].rsplit(":", 1)[0]
    text = sh(served["lab"], node, f"docker exec {CONTAINER} python3 -c \"import urllib.request; print(urllib."
                                   f"request.urlopen('http://{address}:{REPLICA_PORT}/metrics').read().decode())\"")
    for family in text_string_to_metric_families(text):
        if family.name == "vllm:request_success":
            return sum(sample.value for sample in family.samples if sample.name.endswith("_total"))
    raise AssertionError(f"no vllm:request_success on {node}")


def test_the_replicas_are_placed_each_on_a_node_of_its_own_with_a_unit_each(served):
    for node, key in (("spark3", "oss"), ("spark4", "oss-2")):
        assert parse_show(sh(served["lab"], node, show_command(served["cluster"], key)))["ActiveState"] == "active"


def test_both_replicas_receive_requests_under_load(served):
    before = {node: requests_served(served, node) for node in ("spark3", "spark4")}
    with ThreadPoolExecutor(8) as pool:
        statuses = list(pool.map(lambda _i: chat(served, "oss"), range(48)))
    assert set(statuses) == {200}
    got = {node: requests_served(served, node) - before[node] for node in before}
    assert sum(got.values()) == 48 and all(count > 0 for count in got.values()), got
    # the TP=2 model answers beside them
    assert chat(served, "llama") == 200


def test_a_rerun_changes_nothing(served):
    assert changed(run(served["inventory"], served["env"], "cluster", "bootstrap")) == set()
