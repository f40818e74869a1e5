"""Several models on one cluster (serve.models), on a lab of three: a TP=2 vLLM world on spark1 and spark2 and a
one-node world on spark3, one endpoint, one key. Each model answers by its name through the head's gateway (real
NGINX and njs), which reaches the world off the head over the fabric; /v1/models lists both; a name served by
neither gets the OpenAI-style 404 naming them. Each world has its own units, dir and engine port; serve status
and top show each, doctor reads each (a world's server down is found on its node, named by its model); a rerun changes
nothing. Switching the one-node model by bootstrap, under a steady request loop against
the TP=2 one, loses none of its requests and leaves its servers running; serve stop ends every world, a bootstrap
serves them again; serve rollback puts the one-node model back, the TP=2 world untouched; cluster down removes
every world's unit.
"""

from __future__ import annotations

import os
import threading

import pytest
import yaml

from sparkctl.cli.json_schema import validate_line
from sparkctl.plan.serve_unit import parse_show, show_command
from tests.lab.doctor_kit import doctor, problems
from tests.lab.lab_kit import HF_TOKEN, changed, sh, sparkctl
from tests.lab.ranks_kit import engine_inventory, run
from tests.lab.serve_kit import ask, chat

pytestmark = pytest.mark.lab

CONTAINER = "vllm-multinode"
FIRST = {"preset": "llama-3.3-70b-vllm", "name": "llama", "nodes": ["spark1", "spark2"], "fit_check": "warn",
         "ready_timeout": 300}
SECOND = {"model": "openai/gpt-oss-120b", "engine": "vllm", "name": "oss", "nodes": ["spark3"], "ready_timeout": 300}
SWITCHED = {"model": "nvidia/Llama-3.1-8B-Instruct-FP4", "engine": "vllm", "name": "small", "nodes": ["spark3"],
            "ready_timeout": 300}


def inventory_of(lab, path, *models: dict) -> str:
    return engine_inventory(lab, path, {"models": list(models)})


@pytest.fixture(scope="module")
def served(lab_factory, tmp_path_factory):
    lab = lab_factory(3, "ring")
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


def test_each_world_has_its_own_units_and_the_one_off_the_head_answers_on_the_fabric(served):
    lab = served["lab"]
    # the TP=2 world: a unit per rank on spark1 and spark2; the one-node world's on spark3; no node has another's
    for node in ("spark1", "spark2"):
        assert unit(served, node)["ActiveState"] == "active"
        assert unit(served, node, "oss")["LoadState"] == "not-found"
    assert unit(served, "spark3", "oss")["ActiveState"] == "active"
    assert unit(served, "spark3")["LoadState"] == "not-found"
    # the off-head engine listens on spark3's fabric address alone (the gateway reaches it there)
    listening = sh(lab, "spark3", "ss -ltnH 'sport = :18357'")
    fabric = sh(lab, "spark3", "ip -4 -o addr show | awk '$2 != \"lo\" {print $4}'").split()
    assert listening.strip() and lab.nodes[2].mgmt_ip not in listening, listening
    assert any(address.split("/")[0] in listening for address in fabric), (listening, fabric)


def test_serve_status_shows_each_world_and_chat_bench_and_logs_take_the_model_named(served):
    code, _events, output = sparkctl(["serve", "status", served["inventory"]], served["env"])
    assert code == 0, output
    assert "model llama  on spark1, spark2: 200 OK; unit " in output, output
    assert "model oss    on spark3: 200 OK; unit sparkctl-serve-" in output, output
    code, _events, output = sparkctl(["serve", "chat", "--model", "oss", served["inventory"], "hello"], served["env"])
    assert code == 0 and output.strip(), output
    code, _events, output = sparkctl(["serve", "chat", "--model", "nope", served["inventory"], "hello"], served["env"])
    assert code == 2 and "--model nope: no model of the inventory answers to that name (served are llama, oss)" \
        in output, output
    code, _events, output = sparkctl(["serve", "logs", "--model", "oss", "-n", "5", served["inventory"]], served["env"])
    assert code == 0 and output.strip(), output
    code, events, output = sparkctl(["serve", "bench", "--model", "oss", "--concurrency", "2", "--requests", "4",
                                     "--max-tokens", "8", served["inventory"], "--json"], served["env"])
    assert code == 0, output
    (report,) = [e for e in events if e.get("report") == "serve bench"]
    assert (report["name"], report["model"]) == ("oss", "openai/gpt-oss-120b")
    assert report["levels"][0]["requests"] == 4 and report["levels"][0]["failed"] == 0, report


def test_top_shows_each_world_s_figures(served):
    code, events, output = sparkctl(["top", served["inventory"], "--once", "--json", "--interval", "1"], served["env"])
    assert code == 0, output[-2000:]
    (frame,) = [e for e in events if e["event"] == "top"]
    validate_line(frame)
    assert [(w["model"], w["metrics_status"]) for w in frame["worlds"]] == [("llama", 200), ("oss", 200)], frame
    assert frame["serving"]["metrics_status"] == 200 and "model" not in frame["serving"]


def test_doctor_names_the_world_whose_server_is_down_and_bootstrap_starts_it_again(served):
    """doctor reads every world on its nodes: healthy, no serving finding; the one-node world's unit stopped by hand
    on spark3 is found there, named by its model, and the next bootstrap starts it again."""
    report = doctor(served["lab"], env=served["env"], inventory=served["inventory"])
    assert not {f for f in problems(report) if f[0].startswith("serve.")}, report["findings"]
    sh(served["lab"], "spark3", f"systemctl stop sparkctl-serve-{served['cluster']}--oss.service")
    report = doctor(served["lab"], env=served["env"], inventory=served["inventory"])
    down = [f for f in report["findings"] if f["id"].startswith("serve.") and f["severity"] == "error"]
    assert down and all(f["node"] == "spark3" and f["summary"].startswith("oss: ") for f in down), down
    events = run(served["inventory"], served["env"], "cluster", "bootstrap")
    assert ("serve.launch", None) in changed(events)
    assert chat(served, "oss")[0] == 200


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
    assert not {node for task, node in changed(events) if task == "serve.unit"} & {"spark1", "spark2"}, \
        changed(events)
    assert unit(served, "spark3", "oss")["LoadState"] == "not-found"
    assert unit(served, "spark3", "small")["ActiveState"] == "active"
    status, answer = chat(served, "small")
    assert status == 200 and answer["model"] == "small", answer
    assert changed(run(switched, served["env"], "cluster", "bootstrap")) == set()
    served["inventory"] = switched


def test_serve_stop_ends_every_world_and_bootstrap_serves_them_again(served):
    code, _events, output = sparkctl(["serve", "stop", served["inventory"]], served["env"])
    assert code == 0, output
    assert unit(served, "spark1")["ActiveState"] == "inactive"
    assert unit(served, "spark3", "small")["ActiveState"] == "inactive"
    assert chat(served, "small")[0] == 502
    run(served["inventory"], served["env"], "cluster", "bootstrap")
    assert chat(served, "small")[0] == chat(served, "llama")[0] == 200


def test_serve_rollback_puts_the_second_model_back_and_leaves_the_first_running(served):
    """The deployment kept before the switch: its one-node model comes back on spark3, the TP=2 world's servers keep
    their PIDs (its launch is the same in both)."""
    before = server_pid(served, "spark1")
    code, _events, output = sparkctl(["serve", "rollback", served["inventory"], "--json"], served["env"], timeout=900)
    assert code == 0, output[-3000:]
    assert unit(served, "spark3", "oss")["ActiveState"] == "active"
    assert unit(served, "spark3", "small")["LoadState"] == "not-found"
    assert chat(served, "oss")[0] == 200 and chat(served, "small")[0] == 404
    assert server_pid(served, "spark1") == before


def test_cluster_down_removes_every_world_s_unit(served):
    run(served["inventory"], served["env"], "cluster", "down")
    for node in ("spark1", "spark2"):
        assert unit(served, node)["LoadState"] == "not-found"
    for key in ("oss", "small"):
        assert unit(served, "spark3", key)["LoadState"] == "not-found"
