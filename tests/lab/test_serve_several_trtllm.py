"""Several TensorRT-LLM models on one cluster, on a lab of three (the TensorRT-LLM stand-in of the lab image, real
OpenMPI, real NGINX): a TP=2 world on spark1 and spark2 and a one-node world on spark3, one endpoint, one key. Each
world's mpirun runs in its head's container on its own nodes; each world has its figures collector on its head,
beside its engine (trtllm-serve's /metrics empties on read): the one on spark3 on spark3's fabric address, where its
watchdog, top and the gateway read it. fabric bench measures the cluster's fabric beside them. doctor finds the
one-node world's collector stopped, named by its model, and bootstrap starts it again; a rerun changes nothing;
switching the one-node model under a request loop to the TP=2 one loses none of those requests and leaves the TP=2
world's ranks running; cluster down removes every world's unit and collector.
"""

from __future__ import annotations

import os
import re
import threading
from pathlib import Path

import pytest
import yaml

from sparkctl.cli.json_schema import validate_line
from sparkctl.lab.image import image_ref
from tests.lab.doctor_kit import doctor, problems
from tests.lab.lab_kit import HF_TOKEN, changed, sh, sparkctl
from tests.lab.ranks_kit import engine_inventory, run
from tests.lab.serve_kit import ask, chat, exporter_samples

pytestmark = pytest.mark.lab

CONTAINER = "trtllm-multinode"
FIRST = {"preset": "qwen3-235b-eagle3", "name": "qwen", "nodes": ["spark1", "spark2"], "fit_check": "warn",
         "ready_timeout": 300}
SECOND = {"preset": "gpt-oss-120b-eagle3", "name": "oss", "nodes": ["spark3"], "fit_check": "warn",
          "ready_timeout": 300}
SWITCHED = {"model": "nvidia/Llama-3.1-8B-Instruct-FP4", "engine": "trtllm", "name": "small", "nodes": ["spark3"],
            "ready_timeout": 300}


@pytest.fixture(scope="module")
def served(lab_factory, tmp_path_factory):
    lab = lab_factory(3, "ring")
    env = {**os.environ, "HF_TOKEN": HF_TOKEN, "XDG_STATE_HOME": str(tmp_path_factory.mktemp("trtllm-state"))}
    inventory = engine_inventory(lab, tmp_path_factory.mktemp("inv") / "two.yaml", {"models": [FIRST, SECOND]},
                                 image=image_ref())
    code, events, output = sparkctl(["cluster", "bootstrap", inventory, "--json"], env, timeout=900)
    assert code == 0, output[-3000:]
    key = sparkctl(["serve", "key", inventory], env)[2].strip().splitlines()[-1]
    cluster = yaml.safe_load(lab.inventory_path.read_text())["cluster"]["name"]
    yield {"lab": lab, "env": env, "inventory": inventory, "events": events, "cluster": cluster, "key": key,
           "endpoint": f"http://{lab.nodes[0].mgmt_ip}:8355"}
    lab.down()


def fabric_addresses(lab, node: str) -> list[str]:
    return [a.split("/")[0] for a in sh(lab, node, "ip -4 -o addr show | awk '$2 != \"lo\" {print $4}'").split()]


def counter(text: str, name: str) -> float:
    found = re.search(rf"^{re.escape(name)} (\S+)$", text, re.M)
    assert found, (name, text[:2000])
    return float(found.group(1))


def test_each_model_answers_by_its_name_each_mpirun_on_its_own_nodes(served):
    for name in ("qwen", "oss"):
        status, answer = chat(served, name)
        assert status == 200 and answer["model"] == name, answer
    status, listed = ask(served, "/v1/models")
    assert status == 200 and sorted(m["id"] for m in listed["data"]) == ["oss", "qwen"], listed
    lab = served["lab"]
    # the TP=2 world's mpirun on spark1 with its two ranks; the one-node world's on spark3, its one rank there
    first = sh(lab, "spark1", "pgrep -af '^mpirun ' || true")
    other = sh(lab, "spark3", "pgrep -af '^mpirun ' || true")
    assert "-np 2 --host" in first and "/sparkctl/serve/extra-llm-api-config.yml" in first, first
    assert "-np 1 --host" in other and "/sparkctl/serve--oss/extra-llm-api-config.yml" in other, other
    assert not sh(lab, "spark2", "pgrep -af '^mpirun ' || true").strip()
    for node, world in (("spark2", "/sparkctl/serve/"), ("spark3", "/sparkctl/serve--oss/")):
        ranks = sh(lab, node, "pgrep -af trtllm-serve || true")
        assert world in ranks, (node, ranks)
    assert "/sparkctl/serve--oss/" not in sh(lab, "spark2", "pgrep -af trtllm-serve || true")


def test_each_world_s_collector_runs_on_its_head_beside_its_engine_and_counts_its_tokens(served):
    lab = served["lab"]
    names = {node: sh(lab, node, "docker ps --format '{{.Names}}'").split() for node in ("spark1", "spark2", "spark3")}
    assert "sparkctl-collector" in names["spark1"] and "sparkctl-collector--oss" not in names["spark1"], names
    assert not [n for n in names["spark2"] if n.startswith("sparkctl-collector")], names
    assert "sparkctl-collector--oss" in names["spark3"] and "sparkctl-collector" not in names["spark3"], names
    # on spark3's fabric address alone, beside the engine (the management address serves nothing but the gateway)
    listening = sh(lab, "spark3", "ss -ltnH '( sport = :18357 or sport = :18358 )'")
    local = {line.split()[3] for line in listening.splitlines()}
    fabric = fabric_addresses(lab, "spark3")
    assert {address.rsplit(":", 1)[1] for address in local} == {"18357", "18358"}, listening
    assert all(address.rsplit(":", 1)[0] in fabric for address in local), (listening, fabric)
    address = next(a.rsplit(":", 1)[0] for a in local if a.endswith(":18358"))
    read = f"curl -s -m 10 http://{address}:18358/metrics"
    before = counter(sh(lab, "spark3", read), "sparkctl_trtllm_generation_tokens_total")
    assert chat(served, "oss")[0] == 200
    text = sh(lab, "spark3", read)
    assert counter(text, "sparkctl_collector_engine_up") == 1.0
    assert counter(text, "sparkctl_trtllm_generation_tokens_total") > before
    # the world's watchdog reads it there
    watchdog = sh(lab, "spark3", "pgrep -af '[w]atchdog.py' || true")
    assert f"--metrics http://{address}:18358/metrics" in watchdog, watchdog


def test_top_and_its_prometheus_endpoint_show_each_world_s_collected_figures(served):
    code, events, output = sparkctl(["top", served["inventory"], "--once", "--json", "--interval", "1"], served["env"])
    assert code == 0, output[-2000:]
    (frame,) = [e for e in events if e["event"] == "top"]
    assert [(w["model"], w["metrics_status"]) for w in frame["worlds"]] == [("qwen", 200), ("oss", 200)], frame
    code, _events, output = sparkctl(["serve", "status", served["inventory"]], served["env"])
    assert code == 0 and "model oss   on spark3: 200 OK; unit sparkctl-serve-" in output, output
    # the Prometheus endpoint carries each world's row, by its model
    running = {s.labels["model"] for s in exporter_samples(served["inventory"], served["env"])
               if s.name == "sparkctl_serve_requests_running"}
    assert running == {"qwen", "oss"}, running


def test_each_model_s_acceptance_is_read_through_the_one_endpoint(served):
    """The gateway's /metrics?model=NAME is that model's collector: the smoke test and serve bench --model read each
    model's own Eagle3 acceptance there, and an unknown name gets the 404."""
    smoke = {e["smoke"]["name"]: e["smoke"]["acceptance_length"] for e in served["events"]
             if e.get("task") == "serve.smoke" and "smoke" in e}
    assert set(smoke) == {"qwen", "oss"} and all(a and a > 1 for a in smoke.values()), smoke
    code, events, output = sparkctl(["serve", "bench", "--model", "oss", "--concurrency", "1", "--requests", "2",
                                     "--max-tokens", "16", served["inventory"], "--json"], served["env"])
    assert code == 0, output[-2000:]
    (report,) = [e for e in events if e.get("report") == "serve bench"]
    assert report["name"] == "oss" and report["levels"][0]["acceptance_length"] > 1, report
    status, answer = ask(served, "/metrics?model=nope")
    assert status == 404 and answer["error"]["code"] == "model_not_found", answer


def test_doctor_finds_a_world_s_collector_down_by_its_model_and_bootstrap_starts_it(served):
    lab = served["lab"]
    report = doctor(lab, env=served["env"], inventory=served["inventory"])
    assert not {f for f in problems(report) if f[0].startswith("serve.")}, report["findings"]
    sh(lab, "spark3", "docker stop -t 0 sparkctl-collector--oss")
    report = doctor(lab, env=served["env"], inventory=served["inventory"])
    (down,) = [f for f in report["findings"] if f["id"] == "serve.collector_down"]
    assert (down["node"], down["severity"]) == ("spark3", "error"), down
    assert down["summary"].startswith("oss: the figures collector is exited"), down
    events = run(served["inventory"], served["env"], "cluster", "bootstrap")
    assert ("serve.collector", None) in changed(events), changed(events)
    assert "sparkctl-collector--oss" in sh(lab, "spark3", "docker ps --format '{{.Names}}'").split()


def test_a_rerun_changes_nothing(served):
    events = run(served["inventory"], served["env"], "cluster", "bootstrap")
    assert changed(events) == set(), changed(events)


def test_switching_the_one_node_model_keeps_the_tp2_world_serving_and_its_ranks(served):
    """Under a steady loop of requests to the TP=2 model, bootstrap switches the one-node world to another model: its
    mpirun and collector are made again on spark3, not one request to the TP=2 model fails, its mpirun and its rank
    on spark2 keep their PIDs (a world's leftover ranks are found by its own config file), and a rerun changes
    nothing."""
    lab = served["lab"]
    pids = {node: sh(lab, node, "pgrep -f '[e]xtra_llm_api_options /sparkctl/serve/' | sort").split()
            for node in ("spark1", "spark2")}
    assert all(pids.values()), pids
    results: list[int] = []
    stop = threading.Event()

    def loop() -> None:
        while not stop.is_set():
            results.append(chat(served, "qwen")[0])

    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    try:
        switched = engine_inventory(lab, Path(served["inventory"]).with_name("switched.yaml"),
                                    {"models": [FIRST, SWITCHED]}, image=image_ref())
        events = run(switched, served["env"], "cluster", "bootstrap")
    finally:
        stop.set()
        thread.join(timeout=60)
    assert results and set(results) == {200}, [r for r in results if r != 200][:5]
    assert {node: sh(lab, node, "pgrep -f '[e]xtra_llm_api_options /sparkctl/serve/' | sort").split()
            for node in ("spark1", "spark2")} == pids
    assert ("serve.launch", None) in changed(events)
    status, answer = chat(served, "small")
    assert status == 200 and answer["model"] == "small", answer
    names = sh(lab, "spark3", "docker ps -a --format '{{.Names}}'").split()
    assert "sparkctl-collector--small" in names and "sparkctl-collector--oss" not in names, names
    assert changed(run(switched, served["env"], "cluster", "bootstrap")) == set()
    served["inventory"] = switched


def test_fabric_bench_measures_the_cluster_of_several_worlds(served):
    """The fabric is the cluster's whatever it serves: every ring link over RDMA, and NCCL's all-reduce across every
    node's container (the cluster's hostfile), the worlds serving beside it."""
    code, events, output = sparkctl(["fabric", "bench", served["inventory"], "--json", "--nccl-max", "1M",
                                     "--no-record"], served["env"], timeout=600)
    assert code in (0, 1), output[-3000:]
    (report,) = [e for e in events if e.get("report") == "fabric bench"]
    validate_line(report)
    # the ring's three cables, each with its two twins
    assert len(report["links"]) == 6 and all(link["gbps"] for link in report["links"]), report["links"]
    assert report["nccl"] and not report["nccl"].get("error") and report["nccl"]["ranks"] == 3, report["nccl"]
    assert chat(served, "small")[0] == 200 and chat(served, "qwen")[0] == 200


def test_cluster_down_removes_every_world_s_unit_and_collector(served):
    lab = served["lab"]
    run(served["inventory"], served["env"], "cluster", "down")
    for node in ("spark1", "spark2", "spark3"):
        left = sh(lab, node, "docker ps -a --format '{{.Names}}'; ls /etc/systemd/system | grep sparkctl-serve || "
                             "true").split()
        assert not [name for name in left if name.startswith(("sparkctl-collector", "sparkctl-serve"))], (node, left)
