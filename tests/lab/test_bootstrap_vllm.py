"""vLLM across the lab's Sparks, on a pair and on a ring of three that serves on two: bootstrap ends with the
endpoint answering behind the gateway; each rank's container says its own node's fabric (VLLM_HOST_IP, Gloo's and
TensorPipe's interface) and prints NCCL lines for its own twins; what vLLM does not need is skipped with its reason;
a rerun changes nothing; a worker whose VLLM_HOST_IP was changed by hand is found by doctor and repaired by bootstrap;
switching the pair's engine to TensorRT-LLM and back converges each time.

The lab image carries the `vllm` stand-in (it parses the release's flags and meets over the fabric at the master
port) and is also named nvcr.io/nvidia/vllm:26.05-py3, the product's default vLLM image.
"""

from __future__ import annotations

import json
import os
import subprocess
import threading
import time
import urllib.request
from pathlib import Path

import pytest
import yaml

from sparkctl.cli.json_schema import validate_line
from sparkctl.inventory import load_inventory
from sparkctl.plan.serve_unit import parse_exits
from tests.lab import firewall_kit, ranks_kit
from tests.lab.conftest import poll
from tests.lab.lab_kit import HF_TOKEN, changed, failures, sh, sparkctl
from tests.lab.ranks_kit import (
    engine_inventory,
    fabric_address,
    run,
    seed_a_worker_s_address,
    trtllm_inventory,
    unit_state,
)
from tests.lab.serve_kit import VLLM_SEEDS, exporter_samples, summed

pytestmark = pytest.mark.lab

VLLM_CONTAINER = "vllm-multinode"
# a quick stall, and no canary in this module's time: the stall is what finds vLLM's wedge here (the canary is
# proven on TensorRT-LLM's, test_bootstrap_serve.py)
# written as serve.models' one entry, with a name and an alias clients ask for (the gateway routes by them)
SERVE = {"models": [{"preset": "llama-3.3-70b-vllm", "name": "llama", "aliases": ["l70"], "fit_check": "warn",
                     "ready_timeout": 300}],
         "watchdog": {"stall_s": 10, "canary_s": 86_400, "canary_deadline_s": 5}}
SKIPPED = {"container.ssh", "mpi.hostfile"}


def vllm_inventory(lab, path) -> str:
    return engine_inventory(lab, path, SERVE)


def container_env(lab, node: str, container: str = VLLM_CONTAINER) -> dict[str, str]:
    return ranks_kit.container_env(lab, node, container)


@pytest.fixture(scope="module", params=["pair", "ring3"])
def served(request, lab_factory, tmp_path_factory):
    lab = lab_factory(2, "pair", port=1) if request.param == "pair" else lab_factory(3, "ring")
    env = {**os.environ, "HF_TOKEN": HF_TOKEN, "XDG_STATE_HOME": str(tmp_path_factory.mktemp("vllm-state"))}
    inventory = vllm_inventory(lab, tmp_path_factory.mktemp("inv") / "vllm.yaml")
    code, events, output = sparkctl(["cluster", "bootstrap", inventory, "--json"], env)
    assert code == 0, output[-3000:]
    cluster = yaml.safe_load(lab.inventory_path.read_text())["cluster"]["name"]
    yield {"lab": lab, "env": env, "inventory": inventory, "events": events, "cluster": cluster,
           "serving": ["spark1", "spark2"], "nodes": [n.name for n in lab.nodes]}
    lab.down()


def test_bootstrap_serves_with_a_rank_per_node_each_on_its_own_fabric(served):
    lab, events, env = served["lab"], served["events"], served["env"]
    assert ("serve.launch", None) in changed(events)
    skipped = {e["task"]: e.get("message", "") for e in events
               if e["event"] == "task_result" and e["status"] == "skipped"}
    assert set(skipped) >= SKIPPED and all("vLLM" in skipped[t] for t in SKIPPED), skipped
    chat = sparkctl(["serve", "chat", served["inventory"], "hello"], env)
    assert chat[0] == 0 and chat[2].strip(), chat[2]
    for rank, node in enumerate(served["serving"]):
        have = container_env(lab, node)
        own = have["GLOO_SOCKET_IFNAME"]
        assert have["VLLM_HOST_IP"] == fabric_address(lab, node, own)
        assert have["TP_SOCKET_IFNAME"] == own and own in have["NCCL_SOCKET_IFNAME"].split(",")
        assert unit_state(lab, node, served["cluster"])["ActiveState"] == "active"
        line = sh(lab, node, f"docker exec {VLLM_CONTAINER} ps -eo args").splitlines()
        ranks = [x for x in line if x.startswith("/usr/bin/python3 /usr/local/bin/vllm serve")]
        assert len(ranks) == 1 and f"--node-rank {rank}" in ranks[0], line
        assert ("--headless" in ranks[0]) == (rank > 0)
    # each serving node's NCCL lines were read by verify.fabric, and no node but the serving ones has a unit
    verify = [e["node"] for e in events if e["event"] == "log" and e.get("task") == "verify.fabric"
              and "used network" in e.get("message", "")]
    assert sorted(verify) == served["serving"], verify
    for node in set(served["nodes"]) - set(served["serving"]):
        assert unit_state(lab, node, served["cluster"])["LoadState"] == "not-found"


def test_from_the_management_network_only_sshd_and_the_endpoint_answer(served):
    """sparkctl's firewall with vLLM: from this machine (on the management bridge, no node) only sshd and the
    endpoint answer, whatever else the nodes listen on."""
    lab = served["lab"]
    port = load_inventory(served["inventory"]).serve_spec().port
    assert firewall_kit.answering(lab) == {n.mgmt_ip: {22, port} if n.name == "spark1" else {22} for n in lab.nodes}


def test_a_rerun_changes_nothing(served):
    events = run(served["inventory"], served["env"], "cluster", "bootstrap")
    assert changed(events) == set(), changed(events)


@pytest.mark.parametrize("finding", sorted(VLLM_SEEDS))
def test_a_worker_whose_vllm_host_ip_was_changed_is_found_by_doctor_and_repaired_by_bootstrap(served, finding):
    """On the ring: the worker's management address (a rank on the wrong NIC); on the pair: the head's fabric
    address (the ranks look like one node). Doctor names it with its evidence; bootstrap recreates the container
    and restarts the world; the next run changes nothing."""
    where, _what = VLLM_SEEDS[finding]
    if served["lab"].state.topology != ("pair" if where == "pair" else "ring"):
        pytest.skip(f"seeded on the {where}")
    seed_a_worker_s_address(served, finding, container=VLLM_CONTAINER, setting="VLLM_HOST_IP",
                            wrong_nic="vllm.wrong_nic")


def test_switching_the_engine_to_trtllm_and_back_converges_each_time(served, tmp_path):
    if served["lab"].state.topology != "pair":
        pytest.skip("the switch is proven on the pair")
    lab, env = served["lab"], served["env"]
    other = trtllm_inventory(lab, tmp_path / "trtllm.yaml")
    events = run(other, env, "cluster", "bootstrap")
    assert {("container.retire", n) for n in served["nodes"]} <= changed(events), failures(events)
    assert ("serve.unit", "spark2") in changed(events)  # the worker's vLLM unit goes: mpirun reaches it now
    for node in served["nodes"]:
        names = sh(lab, node, "docker ps -a --format '{{.Names}}'").split()
        assert VLLM_CONTAINER not in names and "trtllm-multinode" in names, names
    assert changed(run(other, env, "cluster", "bootstrap")) == set()
    events = run(served["inventory"], env, "cluster", "bootstrap")
    assert {("container.retire", n) for n in served["nodes"]} <= changed(events)
    assert unit_state(lab, "spark2", served["cluster"])["ActiveState"] == "active"
    assert changed(run(served["inventory"], env, "cluster", "bootstrap")) == set()


def test_serve_stop_stops_every_rank_and_bootstrap_serves_again(served):
    if served["lab"].state.topology != "pair":
        pytest.skip("proven on the pair")
    lab, env, inventory = served["lab"], served["env"], served["inventory"]
    run(inventory, env, "serve", "stop")
    for node in served["serving"]:
        unit = unit_state(lab, node, served["cluster"])
        assert unit["ActiveState"] == "inactive" and unit["UnitFileState"] == "disabled", (node, unit)
        assert "vllm serve" not in sh(lab, node, f"docker exec {VLLM_CONTAINER} ps -eo args")
    events = run(inventory, env, "cluster", "bootstrap")
    assert ("serve.launch", None) in changed(events)
    assert {unit_state(lab, n, served["cluster"])["ActiveState"] for n in served["serving"]} == {"active"}


def chat_status(host: str, port: int, key: str) -> int:
    body = json.dumps({"messages": [{"role": "user", "content": "still there?"}], "max_tokens": 8}).encode()
    request = urllib.request.Request(f"http://{host}:{port}/v1/chat/completions", data=body, headers={
        "Content-Type": "application/json", "Authorization": f"Bearer {key}"})
    try:
        with urllib.request.urlopen(request, timeout=30) as answer:
            return answer.status
    except OSError:
        return 0


def asked_by_name(host: str, port: int, key: str, model: str) -> tuple[int, dict]:
    body = json.dumps({"model": model, "messages": [{"role": "user", "content": "who?"}], "max_tokens": 2}).encode()
    request = urllib.request.Request(f"http://{host}:{port}/v1/chat/completions", data=body, headers={
        "Content-Type": "application/json", "Authorization": f"Bearer {key}"})
    try:
        with urllib.request.urlopen(request, timeout=30) as answer:
            return answer.status, json.load(answer)
    except urllib.error.HTTPError as error:
        return error.code, json.load(error)


def test_the_endpoint_answers_to_the_model_s_name_and_alias_and_names_them_to_anything_else(served):
    """serve.models' entry named llama, alias l70: the gateway's router (real NGINX and njs) sends both to the world,
    where vLLM serves both names (--served-model-name llama l70) and answers under the first; any other name gets the
    gateway's OpenAI-style 404 naming the two."""
    if served["lab"].state.topology != "pair":
        pytest.skip("proven on the pair")
    lab, env, inventory = served["lab"], served["env"], served["inventory"]
    code, _events, output = sparkctl(["serve", "key", inventory], env)
    assert code == 0, output
    key, host, port = output.strip().splitlines()[-1], lab.nodes[0].mgmt_ip, load_inventory(inventory).serve_spec().port
    for name in ("llama", "l70"):
        status, answer = asked_by_name(host, port, key, name)
        assert status == 200 and answer["model"] == "llama", answer
    status, answer = asked_by_name(host, port, key, "meta-llama/Llama-3.3-70B-Instruct")
    assert status == 404 and answer["error"]["code"] == "model_not_found", answer
    assert answer["error"]["message"].endswith("served are llama, l70"), answer


def test_a_wedged_world_is_ended_by_its_watchdog_and_every_rank_starts_again(served):
    """vLLM's rank 0 alive but generating nothing under a steady request loop: its generated-token counter stands
    still with a request running, the watchdog ends rank 0 after stall_s, the worker's rank ends when rank 0 goes,
    and both units start their ranks again: the endpoint answers with no sparkctl command, the end is `stuck`."""
    if served["lab"].state.topology != "pair":
        pytest.skip("proven on the pair")
    lab, env, inventory, cluster = served["lab"], served["env"], served["inventory"], served["cluster"]
    code, _events, output = sparkctl(["serve", "key", inventory], env)
    assert code == 0, output
    key, host = output.strip().splitlines()[-1], lab.nodes[0].mgmt_ip
    port = load_inventory(inventory).serve_spec().port
    exits_log = f"/home/nvidia/.local/state/sparkctl/{cluster}/run/serve/exits.log"

    def stuck_ends() -> list:
        return [e for e in parse_exits(sh(lab, "spark1", f"cat {exits_log} 2>/dev/null; true")) if e.result == "stuck"]

    starts = {n: unit_state(lab, n, cluster)["ExecMainStartTimestamp"] for n in served["serving"]}
    stop = threading.Event()

    def load():
        while not stop.is_set():
            chat_status(host, port, key)

    loop = threading.Thread(target=load, daemon=True)
    loop.start()
    try:
        sh(lab, "spark1", f"docker exec {VLLM_CONTAINER} sh -c 'mkdir -p /run/lab && echo wedge >> "
                          "/run/lab/standin-faults'")
        assert poll(lambda: stuck_ends(), timeout=120, interval=2), sh(
            lab, "spark1", f"cat {exits_log}; tail -n 30 {exits_log.replace('exits.log', 'serve.log')}; "
                           f"docker exec {VLLM_CONTAINER} ps -eo pid,pgid,args")
    finally:
        stop.set()
    reason = stuck_ends()[-1].evidence["reason"]
    assert reason.startswith("no token for ") and reason.endswith("s with 1 requests running"), reason
    assert poll(lambda: all(unit_state(lab, n, cluster)["ExecMainStartTimestamp"] != starts[n]
                            for n in served["serving"]) and chat_status(host, port, key) == 200, timeout=240,
                interval=2), {n: unit_state(lab, n, cluster) for n in served["serving"]}
    loop.join(timeout=60)


def test_top_during_a_bench_shows_the_work_where_nccl_says_it_runs(served, tmp_path):
    """`top --once --json` while `serve bench` runs: tokens are generated, both GPUs work, the twins NCCL's lines
    name carry traffic on both nodes, and the worker's management port carries less than its fabric (only top's
    own SSH); the Prometheus endpoint, read by Prometheus' own parser, carries the same figures."""
    if served["lab"].state.topology != "pair":
        pytest.skip("proven on the pair")
    env, inventory = served["env"], served["inventory"]
    bench = subprocess.Popen(["sparkctl", "serve", "bench", inventory, "--requests", "5000", "--concurrency", "4",
                              "--max-tokens", "384", "-o", str(tmp_path / "bench.json")], env=env,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        time.sleep(2)  # under way
        code, events, output = sparkctl(["top", inventory, "--once", "--json", "--interval", "2"], env)
        exported = summed(exporter_samples(inventory, env))
    finally:
        bench.terminate()  # it only has to outlast the readings
        bench.wait(timeout=60)
    assert code == 0, output[-2000:]
    (frame,) = [e for e in events if e["event"] == "top"]
    validate_line(frame)
    assert frame["serving"]["engine"] == "vllm" and frame["serving"]["generation_tps"] > 0, frame["serving"]
    for node in served["serving"]:
        figures = frame["nodes"][node]
        assert figures["answering"] and figures["gpu_util_pct"] > 0 and figures["container"] == "running", figures
        named = [link for link in figures["links"] if link["nccl"]]
        assert named and any(link["rx_gbps"] + link["tx_gbps"] > 0 for link in named), figures["links"]
    worker = frame["nodes"]["spark2"]["links"]
    fabric = sum(link["rx_gbps"] + link["tx_gbps"] for link in worker if link["role"] == "fabric")
    management = sum(link["rx_gbps"] + link["tx_gbps"] for link in worker if link["role"] == "management")
    assert fabric > management, worker
    assert exported["sparkctl_serve_generation_tokens_per_second"] > 0
    assert exported["sparkctl_node_up"] == 2.0


def test_ray_as_the_executor_starts_a_ray_node_per_serving_node_and_serves(served, tmp_path):
    """serve.vllm.executor: ray (what a release without --nnodes needs): the head's unit starts Ray's head and its
    vllm serve over it, the worker's unit is its Ray node; vLLM places one rank per node; a rerun changes nothing;
    back to mp, the Ray nodes are gone."""
    if served["lab"].state.topology != "pair":
        pytest.skip("proven on the pair")
    lab, env = served["lab"], served["env"]
    document = yaml.safe_load(Path(served["inventory"]).read_text())
    document["serve"]["models"][0]["vllm"] = {"executor": "ray"}
    ray = tmp_path / "ray.yaml"
    ray.write_text(yaml.safe_dump(document, sort_keys=False))
    events = run(str(ray), env, "cluster", "bootstrap")
    assert ("serve.launch", None) in changed(events)
    chat = sparkctl(["serve", "chat", str(ray), "hello"], env)
    assert chat[0] == 0 and chat[2].strip(), chat[2]
    head = sh(lab, "spark1", f"docker exec {VLLM_CONTAINER} ps -eo args")
    worker = sh(lab, "spark2", f"docker exec {VLLM_CONTAINER} ps -eo args")
    assert "ray start --head" in head and "--distributed-executor-backend ray" in head, head
    assert "ray start --address" in worker and "vllm serve" not in worker, worker
    # Ray's GCS, its dashboard and its workers hold every address: none answers on the management network
    port = load_inventory(str(ray)).serve_spec().port
    assert firewall_kit.answering(lab) == {n.mgmt_ip: {22, port} if n.name == "spark1" else {22} for n in lab.nodes}
    log = sh(lab, "spark2", f"cat {_serve_log(served)}")
    assert "NCCL INFO Using network" in log, log[-2000:]  # the rank vLLM placed there ran
    assert changed(run(str(ray), env, "cluster", "bootstrap")) == set()
    run(served["inventory"], env, "cluster", "bootstrap")
    assert "ray start" not in sh(lab, "spark2", f"docker exec {VLLM_CONTAINER} ps -eo args")


def _serve_log(served) -> str:
    return f"/home/nvidia/.local/state/sparkctl/{served['cluster']}/run/serve/serve.log"
