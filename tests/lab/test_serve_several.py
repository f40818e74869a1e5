"""Several models on one cluster (serve.models), on the lab's pair: one vLLM world per node, one endpoint, one key.
Each model answers by its name through the head's gateway (real NGINX and njs), which reaches the world off the head
over the fabric; /v1/models lists both; a name served by neither gets the OpenAI-style 404 naming them. Each world
has its own unit, dir and engine port; a rerun changes nothing. Switching the second model by bootstrap, under a
steady request loop against the first, loses none of the first's requests and leaves its server running; cluster
down removes every world's unit.
"""

from __future__ import annotations

import json
import os
import threading
import urllib.error
import urllib.request

import pytest
import yaml

from sparkctl.plan.serve_unit import parse_show, show_command
from tests.lab.lab_kit import HF_TOKEN, changed, sh, sparkctl
from tests.lab.ranks_kit import engine_inventory, run

pytestmark = pytest.mark.lab

CONTAINER = "vllm-multinode"
FIRST = {"preset": "llama-3.3-70b-vllm", "name": "llama", "tp_size": 1, "nodes": ["spark1"], "fit_check": "warn",
         "ready_timeout": 300}
SECOND = {"model": "openai/gpt-oss-120b", "engine": "vllm", "name": "oss", "nodes": ["spark2"], "ready_timeout": 300}
SWITCHED = {"model": "nvidia/Llama-3.1-8B-Instruct-FP4", "engine": "vllm", "name": "small", "nodes": ["spark2"],
            "ready_timeout": 300}


def inventory_of(lab, path, *models: dict) -> str:
    return engine_inventory(lab, path, {"models": list(models)})


@pytest.fixture(scope="module")
def served(lab_factory, tmp_path_factory):
    lab = lab_factory(2, "pair", port=1)
    env = {**os.environ, "HF_TOKEN": HF_TOKEN, "XDG_STATE_HOME": str(tmp_path_factory.mktemp("several-state"))}
    folder = tmp_path_factory.mktemp("inv")
    inventory = inventory_of(lab, folder / "two.yaml", FIRST, SECOND)
    code, events, output = sparkctl(["cluster", "bootstrap", inventory, "--json"], env, timeout=900)
    assert code == 0, output[-3000:]
    key = sparkctl(["serve", "key", inventory], env)[2].strip().splitlines()[-1]
    cluster = yaml.safe_load(lab.inventory_path.read_text())["cluster"]["name"]
    yield {"lab": lab, "env": env, "inventory": inventory, "events": events, "cluster": cluster, "key": key,
           "folder": folder, "endpoint": f"http://{lab.nodes[0].mgmt_ip}:8355"}
    lab.down()


def ask(served, path: str, body: dict | None = None) -> tuple[int, dict]:
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(served["endpoint"] + path, data=data, headers={
        "Content-Type": "application/json", "Authorization": f"Bearer {served['key']}"})
    try:
        with urllib.request.urlopen(request, timeout=30) as answer:
            return answer.status, json.load(answer)
    except urllib.error.HTTPError as error:
        return error.code, json.load(error)


def chat(served, model: str) -> tuple[int, dict]:
    return ask(served, "/v1/chat/completions", {"model": model, "max_tokens": 2,
                                                 "messages": [{"role": "user", "content": "who?"}]})


def unit(served, node: str, key: str = "") -> dict[str, str]:
    return parse_show(sh(served["lab"], node, show_command(served["cluster"], key)))


def server_pid(served, node: str, key: str = "") -> str:
    folder = f"serve--{key}" if key else "serve"
    return sh(served["lab"], node, f"docker exec {CONTAINER} cat /sparkctl/{folder}/serve.pid").strip()


def test_each_model_answers_by_its_name_at_the_one_endpoint(served):
    for name in ("llama", "oss"):
        status, answer = chat(served, name)
        assert status == 200 and answer["model"] == name, answer
    status, listed = ask(served, "/v1/models")
    assert status == 200 and sorted(m["id"] for m in listed["data"]) == ["llama", "oss"], listed
    status, answer = chat(served, "openai/gpt-oss-120b")
    assert status == 404 and answer["error"]["code"] == "model_not_found", answer
    assert answer["error"]["message"].endswith("served are llama, oss"), answer
    smoke = [e["smoke"]["name"] for e in served["events"] if e.get("task") == "serve.smoke" and "smoke" in e]
    assert smoke == ["llama", "oss"], smoke
    recap = served["events"][-1]
    assert recap["event"] == "recap" and recap["smoke"]["name"] == "llama", recap


def test_each_world_has_its_own_unit_and_the_one_off_the_head_answers_on_the_fabric(served):
    lab = served["lab"]
    assert unit(served, "spark1")["ActiveState"] == "active"
    assert unit(served, "spark2", "oss")["ActiveState"] == "active"
    # neither node has the other's unit
    assert unit(served, "spark2")["LoadState"] == "not-found"
    assert unit(served, "spark1", "oss")["LoadState"] == "not-found"
    # the off-head engine listens on spark2's fabric address alone (the gateway reaches it there)
    listening = sh(lab, "spark2", "ss -ltnH 'sport = :18357'")
    fabric = sh(lab, "spark2", "ip -4 -o addr show | awk '$2 != \"lo\" {print $4}'").split()
    assert listening.strip() and lab.nodes[1].mgmt_ip not in listening, listening
    assert any(address.split("/")[0] in listening for address in fabric), (listening, fabric)


def test_a_rerun_changes_nothing(served):
    events = run(served["inventory"], served["env"], "cluster", "bootstrap")
    assert changed(events) == set(), changed(events)


def test_switching_the_second_model_keeps_the_first_serving_throughout(served):
    """Under a steady loop of requests to the first model, bootstrap replaces the second world (a new name: its
    old unit is removed, the new one started); not one request to the first fails and its server keeps its PID."""
    before = server_pid(served, "spark1")
    results: list[int] = []
    stop = threading.Event()

    def loop() -> None:
        while not stop.is_set():
            results.append(chat(served, "llama")[0])

    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    try:
        switched = inventory_of(served["lab"], served["folder"] / "switched.yaml", FIRST, SWITCHED)
        events = run(switched, served["env"], "cluster", "bootstrap")
    finally:
        stop.set()
        thread.join(timeout=60)
    assert results and set(results) == {200}, [r for r in results if r != 200][:5]
    assert server_pid(served, "spark1") == before
    assert ("serve.unit", "spark1") not in changed(events), changed(events)
    assert unit(served, "spark2", "oss")["LoadState"] == "not-found"
    assert unit(served, "spark2", "small")["ActiveState"] == "active"
    status, answer = chat(served, "small")
    assert status == 200 and answer["model"] == "small", answer
    assert changed(run(switched, served["env"], "cluster", "bootstrap")) == set()
    served["inventory"] = switched


def test_cluster_down_removes_every_world_s_unit(served):
    run(served["inventory"], served["env"], "cluster", "down")
    assert unit(served, "spark1")["LoadState"] == "not-found"
    assert unit(served, "spark2", "small")["LoadState"] == "not-found"
