"""The serve phases on a lab pair: model fetch, config, TP=2 Eagle3 launch through the MPI stand-in, smoke.

The lab's nodes have the machine's memory (far less than a Spark's), so the runs that must serve set
serve.fit_check: warn; the single-node refusal runs without it. The draft fixture repo is gated: a fake
token is exported, and searched for afterwards everywhere it must never appear.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import yaml

from sparkctl.lab.image import ensure_variant
from sparkctl.plan.serve_unit import RunEnd, parse_exits, parse_show, show_command
from sparkctl.plan.world import WorldNames
from sparkctl.secrets import MASK
from tests.lab.conftest import poll
from tests.lab.doctor_kit import doctor
from tests.lab.lab_kit import CONTAINER, HF_TOKEN, changed, reboot, sparkctl, write_inventory
from tests.lab.lab_kit import failures as failed
from tests.lab.lab_kit import sh_output as sh
from tests.lab.serve_kit import written_places

pytestmark = pytest.mark.lab

TOKEN = HF_TOKEN
# the README's preset as it is: sparkctl turns TensorRT-LLM's iteration stats on by itself; a watchdog quicker than
# the default, for the wedged world's test
WATCHDOG = {"stall_s": 10, "canary_s": 15, "canary_deadline_s": 5}
SERVE = {"preset": "qwen3-235b-eagle3", "fit_check": "warn", "watchdog": WATCHDOG}


def state_dir(lab) -> str:
    cluster = yaml.safe_load(lab.inventory_path.read_text())["cluster"]["name"]
    return f"/home/nvidia/.local/state/sparkctl/{cluster}/run/serve"


def unit(lab) -> str:
    return WorldNames(yaml.safe_load(lab.inventory_path.read_text())["cluster"]["name"]).unit_name


def record(lab) -> dict:
    return json.loads(sh(lab, lab.nodes[0].name, f"cat {state_dir(lab)}/launch.json"))


def pid(lab) -> str:
    """mpirun's PID in the head's container, as the unit's latest run wrote it."""
    return sh(lab, lab.nodes[0].name, f"cat {state_dir(lab)}/serve.pid").strip()


def started(lab) -> str:
    """When the running server was started: its log's first line (a PID may come again after a reboot)."""
    return sh(lab, lab.nodes[0].name, f"head -n 1 {state_dir(lab)}/serve.log").strip()


def api_key(served, env) -> str:
    """`sparkctl serve key`, as a user asks for it."""
    code, _events, output = sparkctl(["serve", "key", served["inventory"]], env)
    assert code == 0, output
    return output.strip().splitlines()[-1]


def http(url: str, key: str | None = None, body: dict | None = None) -> tuple[int, bytes]:
    headers = {"Content-Type": "application/json", **({"Authorization": f"Bearer {key}"} if key else {})}
    request = urllib.request.Request(url, data=json.dumps(body).encode() if body else None, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as error:
        return error.code, error.read()


def chat(lab, key: str, prompt: str = "hello from the lab") -> dict:
    host = yaml.safe_load(lab.inventory_path.read_text())["nodes"][0]["host"]
    status, body = http(f"http://{host}:8355/v1/chat/completions", key,
                        {"messages": [{"role": "user", "content": prompt}], "max_tokens": 8})
    assert status == 200, body
    return json.loads(body)


@pytest.fixture(scope="module")
def env(tmp_path_factory) -> dict[str, str]:
    journal = tmp_path_factory.mktemp("serve-state")
    return {**os.environ, "HF_TOKEN": TOKEN, "XDG_STATE_HOME": str(journal)}


@pytest.fixture(scope="module")
def served(lab_pair, env, tmp_path_factory):
    inventory = write_inventory(lab_pair, tmp_path_factory.mktemp("inv") / "serve.yaml", SERVE)
    code, events, output = sparkctl(["cluster", "bootstrap", inventory, "--json"], env)
    assert code == 0, output[-3000:]
    outputs = [output]
    return {"inventory": inventory, "events": events, "outputs": outputs}


def test_bootstrap_ends_with_an_answering_endpoint(lab_pair, served, env):
    events = served["events"]
    assert {("model.fetch", "spark1"), ("model.fetch", "spark2"), ("serve.launch", None)} <= changed(events)
    # each node's own download checked against the Hub's hashes, and kept verified by stat
    assert {("model.verify", "spark1"), ("model.verify", "spark2")} <= changed(events)
    for n in lab_pair.nodes:
        verified = sh(lab_pair, n.name, "cat /home/nvidia/.cache/huggingface/sparkctl-verified/"
                                        "models--nvidia--Qwen3-235B-A22B-FP4.tsv")
        assert len(verified.splitlines()) == 3, (n.name, verified)
    smoke = [e for e in events if e.get("task") == "serve.smoke" and e["event"] == "log"]
    assert smoke and "acceptance length" in smoke[0]["message"]
    reply = chat(lab_pair, api_key(served, env))
    assert reply["choices"][0]["message"]["content"].strip()
    assert record(lab_pair)["model"] == "nvidia/Qwen3-235B-A22B-FP4"
    # the draft is in the mounted HF cache on every node, never /opt
    for n in lab_pair.nodes:
        assert "config.json" in sh(lab_pair, n.name, "ls /home/nvidia/.cache/huggingface/sparkctl-models/"
                                                     "nvidia--Qwen3-235B-A22B-Eagle3/")
        assert sh(lab_pair, n.name, "stat -c %a /home/nvidia/.cache/huggingface/token").strip() == "600"


def test_second_run_changes_nothing_and_keeps_the_server(lab_pair, served, env):
    before = started(lab_pair)
    code, events, output = sparkctl(["cluster", "bootstrap", served["inventory"], "--json"], env)
    served["outputs"].append(output)
    assert code == 0, output[-3000:]
    assert changed(events) == set()
    assert started(lab_pair) == before


def head_addresses(lab) -> list[str]:
    """Every IPv4 address the head has: management, fabric twins, loopback."""
    links = json.loads(sh(lab, "spark1", "ip -j -4 addr"))
    return [a["local"] for link in links for a in link.get("addr_info", [])]


def on_head(lab, url: str, key: str | None = None, body: str | None = None) -> str:
    """The HTTP status `curl` gets on the head itself (000: nothing answered)."""
    auth = f"-H {shlex.quote('Authorization: Bearer ' + key)} " if key else ""
    data = f"-H 'Content-Type: application/json' --data-binary {shlex.quote(body)} " if body else ""
    return sh(lab, "spark1", f"curl -s -o /dev/null -w '%{{http_code}}' -m 10 {auth}{data}{shlex.quote(url)}")


def test_every_address_of_the_head_wants_the_key_on_every_path_but_health(lab_pair, served, env):
    """The gateway (real NGINX) answers the serve port on the management address and the loopback: 401 without
    the key on /v1/models, /v1/chat/completions and /metrics, 200 with it; the fabric addresses are not served at
    all; /health stays open. The engine holds its own port on the loopback alone; nothing holds the wildcard."""
    key = api_key(served, env)
    mgmt = lab_pair.nodes[0].mgmt_ip
    body = json.dumps({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4})
    answered = set()
    for address in head_addresses(lab_pair):
        base = f"http://{address}:8355"
        for path, data in (("/v1/models", None), ("/v1/chat/completions", body), ("/metrics", None)):
            without, with_key = on_head(lab_pair, base + path, None, data), on_head(lab_pair, base + path, key, data)
            assert (without, with_key) in {("401", "200"), ("000", "000")}, (address, path, without, with_key)
            if with_key == "200":
                answered.add(address)
        assert on_head(lab_pair, base + "/health") in {"200", "000"}
    assert answered == {mgmt, "127.0.0.1"}
    assert http(f"http://{mgmt}:8355/v1/models")[0] == 401 and http(f"http://{mgmt}:8355/health")[0] == 200
    listening = sh(lab_pair, "spark1", "ss -ltnH '( sport = :8355 or sport = :18355 or sport = :18356 )'")
    local = sorted(line.split()[3] for line in listening.splitlines())
    # the figures collector too, on the loopback only: the gateway's /metrics is it
    assert local == sorted([f"{mgmt}:8355", "127.0.0.1:8355", "127.0.0.1:18355", "127.0.0.1:18356"]), listening


def test_serve_status_chat_and_bench_send_the_key_by_themselves(lab_pair, served, env, tmp_path):
    for args in (["serve", "status", served["inventory"]], ["serve", "chat", served["inventory"], "hello"],
                 ["serve", "bench", served["inventory"], "--concurrency", "1", "--requests", "2", "--max-tokens",
                  "8", "-o", str(tmp_path / "bench.json")]):
        code, _events, output = sparkctl(args, env)
        assert code == 0, (args, output[-2000:])


def top_once(served, env) -> dict:
    code, events, output = sparkctl(["top", served["inventory"], "--once", "--json", "--interval", "2"], env)
    assert code == 0, output[-2000:]
    (frame,) = [e for e in events if e["event"] == "top"]
    return frame


def test_top_reads_tensorrt_llm_s_figures_through_the_gateway_during_a_bench(lab_pair, served, env, tmp_path):
    """TensorRT-LLM's figures in `top` with the README's preset as it is: the collector drains trtllm-serve's
    iterations and counts them, read with the key through the gateway: generated tokens per second and Eagle3's
    acceptance while a bench runs, both GPUs at work. Then two `top`s and a Prometheus scrape at one moment read
    the same cumulative generated tokens: nobody takes another reader's iterations."""
    bench = subprocess.Popen(["sparkctl", "serve", "bench", served["inventory"], "--concurrency", "2", "--requests",
                              "5000", "--max-tokens", "256", "-o", str(tmp_path / "bench.json")], env=env,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        time.sleep(2)
        frame = top_once(served, env)
    finally:
        bench.terminate()  # it only has to outlast the reading
        bench.wait(timeout=60)
    serving = frame["serving"]
    assert serving["engine"] == "trtllm" and serving["metrics_status"] == 200, serving
    assert serving["generation_tps"] > 0 and 0 < serving["acceptance"] <= 1 and serving["ttft_p50_s"] is None
    assert all(frame["nodes"][n]["gpu_util_pct"] > 0 for n in ("spark1", "spark2")), frame["nodes"]
    key = api_key(served, env)
    mgmt = lab_pair.nodes[0].mgmt_ip

    def generated() -> float:
        status, body = http(f"http://{mgmt}:8355/metrics", key)
        assert status == 200, body
        return float(next(line for line in body.decode().splitlines()
                          if line.startswith("sparkctl_trtllm_generation_tokens_total ")).split()[-1])

    readings = [generated()]
    # the bench's last requests end: the counter stops moving
    assert poll(lambda: (time.sleep(1), readings.append(generated()))[1] is None and readings[-1] == readings[-2],
                timeout=90), readings
    with ThreadPoolExecutor(3) as pool:
        tops = [pool.submit(top_once, served, env) for _ in range(2)]
        scraped = pool.submit(http, f"http://{mgmt}:8355/metrics", key)
        frames = [t.result() for t in tops]
        status, body = scraped.result()
    assert status == 200, body
    line = next(line for line in body.decode().splitlines()
                if line.startswith("sparkctl_trtllm_generation_tokens_total "))
    counted = {f["serving"]["generated_tokens"] for f in frames} | {float(line.split()[-1])}
    # the same total for every reader (the watchdog's idle canary may add its one token between two of them)
    assert max(counted) - min(counted) <= 1 and min(counted) > serving["generation_tps"], (frames, line)


def test_a_rotated_key_is_refused_at_once_and_the_new_one_works(lab_pair, served, env):
    old = api_key(served, env)
    code, _events, output = sparkctl(["serve", "key", served["inventory"], "--rotate"], env)
    new = output.strip().splitlines()[-1]
    assert code == 0 and new != old and new == api_key(served, env), output[-2000:]
    assert output.count(new) == 1 and old not in output  # printed once, as asked: the run itself masks it
    models = f"http://{lab_pair.nodes[0].mgmt_ip}:8355/v1/models"
    assert http(models, old)[0] == 401 and http(models, new)[0] == 200
    code, events, output = sparkctl(["cluster", "bootstrap", served["inventory"], "--json"], env)
    served["outputs"].append(output)
    assert code == 0 and changed(events) == set(), output[-3000:]


def test_the_key_is_in_no_process_list_log_journal_plan_or_bundle(lab_pair, served, env, tmp_path):
    key = api_key(served, env)
    places = written_places(lab_pair, env, served["inventory"], served["outputs"], tmp_path / "bundle.tgz")
    assert "nginx" in places["spark1 ps"]
    assert [where for where, text in places.items() if key in text] == []
    # where it is: the gateway's config on the head, readable by its owner only, and the controller's key file
    config = "/home/nvidia/.local/state/sparkctl/" + yaml.safe_load(lab_pair.inventory_path.read_text())[
        "cluster"]["name"] + "/gateway/nginx.conf"
    assert sh(lab_pair, "spark1", f"stat -c %a {config}").strip() == "600"
    assert key in sh(lab_pair, "spark1", f"cat {config}")


def test_a_no_op_rerun_reads_every_node_in_one_round_trip_with_its_facts(lab_pair, served, env):
    """Every read a no-op rerun makes beside its facts (tasks/read_ahead.py) counts: a read whose script is not the
    same text from one run to the next, or that cannot run beside the facts, would be read again on its own."""
    code, events, output = sparkctl(["cluster", "bootstrap", served["inventory"], "--json", "-v"], env)
    assert code == 0 and changed(events) == set(), output[-3000:]
    ahead = {(e["message"].split(":")[0], e.get("node")) for e in events
             if e["event"] == "log" and e.get("message", "").endswith(": read ahead with the facts")}
    each_node = ("network.verify", "ssh.keys", "container.state", "model.token", "model.pin",
                 "model.fetch", "model.verify", "serve.config", "serve.unit")
    head = lab_pair.nodes[0].name
    assert ahead == {(t, n.name) for t in each_node for n in lab_pair.nodes} | {
        (t, head) for t in ("serve.switch", "serve.launch", "serve.collector", "serve.gateway", "serve.record")}
    # the smoke test's completion, asked from here as the run began (tasks/early.py), counts: nothing changed since
    assert [e for e in events if e["event"] == "log" and e.get("message") == "serve.smoke: asked from here as the "
            "run began"]
    # the facts' one ask of docker's Engine API lists the cluster's containers: container.retire reads nothing more
    listed = {e.get("node") for e in events if e["event"] == "log" and e.get("message") == "container.retire: listed "
              "with the facts"}
    assert listed == {n.name for n in lab_pair.nodes}


def host_of(lab) -> str:
    return yaml.safe_load(lab.inventory_path.read_text())["nodes"][0]["host"]


def models_status(lab, key: str) -> int:
    host = yaml.safe_load(lab.inventory_path.read_text())["nodes"][0]["host"]
    try:
        return http(f"http://{host}:8355/v1/models", key)[0]
    except OSError:
        return 0


def rank0(lab) -> str:
    """The server's rank 0 on the head (the stand-in's trtllm-serve; rank 1 runs on spark2)."""
    return sh(lab, "spark1", f"docker exec {CONTAINER} pgrep -f 'bin/trtllm-serve'").split()[0]


def chat_status(lab, key: str) -> int:
    host = yaml.safe_load(lab.inventory_path.read_text())["nodes"][0]["host"]
    try:
        return http(f"http://{host}:8355/v1/chat/completions", key,
                    {"messages": [{"role": "user", "content": "back?"}], "max_tokens": 4})[0]
    except OSError:
        return 0


def serving_again(lab, key: str, since: str) -> bool:
    """A server started after `since` answers a chat completion with the key."""
    return poll(lambda: started(lab) != since and chat_status(lab, key) == 200, timeout=240, interval=2)


def test_reboots_a_power_cut_and_a_killed_rank_bring_the_endpoint_back_by_themselves(lab_pair, served, env):
    """After `lab reboot spark2`, then `lab reboot --hard spark1` (a power cut of the head), then `kill -9` of the
    server's rank 0, the endpoint answers again with the key each time, with no sparkctl command run: each node's
    docker starts its container by its restart policy, the head's serving unit waits until the other node's
    container answers over the fabric, kills leftover ranks and starts the world again. A bootstrap afterwards
    changes nothing, and doctor finds no error."""
    key = api_key(served, env)
    for what in ("reboot spark2", "power cut spark1", "kill rank 0"):
        since = started(lab_pair)
        if what == "reboot spark2":
            reboot(lab_pair, "spark2")
        elif what == "power cut spark1":
            reboot(lab_pair, "spark1", "--hard")
        else:
            sh(lab_pair, "spark1", f"docker exec {CONTAINER} kill -KILL {rank0(lab_pair)}")
        assert serving_again(lab_pair, key, since), (what, since, models_status(lab_pair, key), sh(
            lab_pair, "spark1", f"systemctl status --no-pager {unit(lab_pair)} | grep -v conmon; cd "
                                f"{state_dir(lab_pair)}; cat exits.log; head -n 1 serve.log; tail -n 5 serve.log; "
                                "docker ps -a; ss -ltn; ip -br addr; docker logs --tail 5 sparkctl-gateway"),
            subprocess.run(f"ip neigh; ip route get {host_of(lab_pair)}; ping -c 1 -W 2 {host_of(lab_pair)}",
                           shell=True, capture_output=True, text=True).stdout)
        assert chat(lab_pair, key)["choices"][0]["message"]["content"].strip()
        # the figures collector comes back with the head too: /metrics through the gateway counts again
        assert poll(lambda: b"sparkctl_collector_engine_up 1.0" in http(
            f"http://{lab_pair.nodes[0].mgmt_ip}:8355/metrics", key)[1], timeout=60), what
    ends = sh(lab_pair, "spark1", f"cat {state_dir(lab_pair)}/exits.log")
    assert "exit-code exited 137 " in ends  # mpirun's word for a rank killed by SIGKILL, recorded by the unit
    code, events, output = sparkctl(["cluster", "bootstrap", served["inventory"], "--json"], env)
    assert code == 0 and changed(events) == set(), (changed(events), output[-3000:])
    report = doctor(lab_pair, env=env, inventory=served["inventory"])
    assert [f for f in report["findings"] if f["severity"] == "error"] == [], report["findings"]
    code, _events, output = sparkctl(["serve", "status", served["inventory"]], env)
    assert code == 0 and "unit               active (running), enabled" in output, output


def test_serve_stop_keeps_it_down_across_a_reboot_until_the_next_serving_bootstrap(lab_pair, served, env):
    key = api_key(served, env)
    code, _events, output = sparkctl(["serve", "stop", served["inventory"]], env)
    assert code == 0 and "stopped the server" in output, output
    reboot(lab_pair, "spark1")
    assert poll(lambda: "true" in sh(lab_pair, "spark1", "docker inspect -f '{{.State.Running}}' "
                                                         "sparkctl-gateway"), timeout=60)
    # booted: the gateway answers (once NGINX listens) and nothing is behind it; the unit is disabled, so no boot
    # starts it
    assert poll(lambda: models_status(lab_pair, key) == 502, timeout=60, interval=1), models_status(lab_pair, key)
    assert sh(lab_pair, "spark1", f"systemctl is-enabled {unit(lab_pair)}").strip() == "disabled"
    assert unit_state_of(lab_pair).get("ActiveState") == "inactive"
    findings = doctor(lab_pair, env=env, inventory=served["inventory"])["findings"]
    assert {(f["id"], f["severity"]) for f in findings if f["id"].startswith("serve.")} == {
        ("serve.down", "info"), ("serve.unit_disabled", "warning")}, findings
    code, events, output = sparkctl(["cluster", "bootstrap", served["inventory"], "--json"], env)
    assert code == 0 and {("serve.unit", "spark1"), ("serve.launch", None)} <= changed(events), output[-3000:]
    assert models_status(lab_pair, key) == 200
    code, events, _output = sparkctl(["cluster", "bootstrap", served["inventory"], "--json"], env)
    assert code == 0 and changed(events) == set()


def test_changing_max_draft_len_restarts_with_the_new_config(lab_pair, served, env, tmp_path):
    before = started(lab_pair)
    inventory = write_inventory(lab_pair, tmp_path / "draft4.yaml", dict(SERVE, max_draft_len=4))
    code, events, output = sparkctl(["cluster", "bootstrap", inventory, "--json", "--diff"], env)
    served["outputs"].append(output)
    assert code == 0, output[-3000:]
    assert ("serve.launch", None) in changed(events)
    assert {("serve.config", "spark1"), ("serve.config", "spark2")} <= changed(events)
    launch = next(e for e in events if e.get("task") == "serve.launch" and e["event"] == "task_result")
    assert "+  max_draft_len: 4" in launch["changes"][0]["diff"]
    assert started(lab_pair) != before
    assert "max_draft_len: 4" in sh(lab_pair, "spark2", f"cat {state_dir(lab_pair)}/extra-llm-api-config.yml")
    reply = chat(lab_pair, api_key(served, env))
    assert reply["choices"][0]["avg_decoded_tokens_per_iter"] == 3.0  # the stand-in: 1 + draft/2
    # the smoke test reports the restarted server: what it asked early, as the run began, was the old one (2.5)
    (smoke,) = [e["smoke"] for e in events if e.get("task") == "serve.smoke" and "smoke" in e]
    assert smoke["acceptance_length"] == 3.0


def test_an_override_key_the_release_rejects_is_refused_before_anything_runs(lab_pair, served, env, tmp_path):
    before = started(lab_pair)
    serve = dict(SERVE, config={"enable_iter_perf_stats": True, "use_torch_sampler": True})
    inventory = write_inventory(lab_pair, tmp_path / "bad-key.yaml", serve)
    code, events, output = sparkctl(["cluster", "bootstrap", inventory, "--json"], env)
    served["outputs"].append(output)
    # refused when the inventory is read, with the key's path: no task runs, nothing is launched
    assert code == 2, output[-3000:]
    assert not [e for e in events if e.get("event") == "task_result"]
    assert re.search(r"bad-key\.yaml:\d+: serve\.config\.use_torch_sampler: TensorRT-LLM 1\.3\.0rc12 "
                     r"\(the image's release\) refuses it", output), output[-3000:]
    assert "nothing was changed" in output
    assert started(lab_pair) == before


def test_fit_check_refuses_qwen3_235b_on_one_node(lab_pair, served, env, tmp_path):
    strict = {k: v for k, v in SERVE.items() if k != "fit_check"}
    inventory = write_inventory(lab_pair, tmp_path / "single.yaml", dict(strict, tp_size=1), nodes=1)
    code, events, output = sparkctl(["cluster", "bootstrap", inventory, "--json", "--only", "model"], env)
    served["outputs"].append(output)
    assert code == 1
    (failure,) = failed(events)
    assert failure["task"] == "model.fit" and "Qwen3-235B-A22B-FP4 does not fit" in failure["message"]
    fetch = next(e for e in events if e.get("task") == "model.fetch" and e["event"] == "task_result")
    assert fetch["status"] == "skipped"


def test_gated_draft_without_token_fails_with_the_hint(lab_pair, served, env):
    for n in lab_pair.nodes:
        sh(lab_pair, n.name, "rm -rf /home/nvidia/.cache/huggingface/token "
                             "/home/nvidia/.cache/huggingface/sparkctl-models/nvidia--Qwen3-235B-A22B-Eagle3")
    no_token = {k: v for k, v in env.items() if k != "HF_TOKEN"}
    code, events, output = sparkctl(["cluster", "bootstrap", served["inventory"], "--json"], no_token)
    served["outputs"].append(output)
    assert code == 1
    fetches = [e for e in failed(events) if e["task"] == "model.fetch"]
    assert len(fetches) == 2
    assert all("gated repo" in e["message"] and "export HF_TOKEN=" in e["hint"] for e in fetches)
    code, _events, output = sparkctl(["cluster", "bootstrap", served["inventory"], "--json"], env)
    served["outputs"].append(output)
    assert code == 0, output[-3000:]


def test_a_draft_file_changed_in_place_is_found_by_its_download_metadata_and_downloaded_again(lab_pair, served, env):
    """The draft is a --local-dir download: its files' etags are in huggingface_hub's download metadata beside them.
    A weight of the draft changed in place on spark2, same size, is found by the next bootstrap (model.verify),
    removed, and downloaded again by the run after it; then nothing changes."""
    draft = "/home/nvidia/.cache/huggingface/sparkctl-models/nvidia--Qwen3-235B-A22B-Eagle3"
    before = sh(lab_pair, "spark2", f"sha256sum < {draft}/model.safetensors").split()[0]
    sh(lab_pair, "spark2", f"printf x | dd of={draft}/model.safetensors bs=1 seek=10 conv=notrunc status=none")
    report = doctor(lab_pair, inventory=served["inventory"], env=env)
    changed_files = [(f["node"], f["summary"]) for f in report["findings"] if f["id"] == "model.changed"]
    assert len(changed_files) == 1 and changed_files[0][0] == "spark2", report["findings"]
    assert "1 file(s) of nvidia/Qwen3-235B-A22B-Eagle3 changed" in changed_files[0][1]
    code, events, output = sparkctl(["cluster", "bootstrap", served["inventory"], "--json"], env)
    served["outputs"].append(output)
    assert code == 1, output[-3000:]
    (wrong,) = failed(events)
    assert (wrong["task"], wrong["node"]) == ("model.verify", "spark2")
    assert wrong["message"].startswith("1 file(s) of nvidia/Qwen3-235B-A22B-Eagle3 on spark2 do not match the hash "
                                       "the Hub recorded (e.g. model.safetensors)"), wrong
    code, events, output = sparkctl(["cluster", "bootstrap", served["inventory"], "--json"], env)
    served["outputs"].append(output)
    assert code == 0, output[-3000:]
    assert {("model.fetch", "spark2"), ("model.verify", "spark2")} <= changed(events)
    assert sh(lab_pair, "spark2", f"sha256sum < {draft}/model.safetensors").split()[0] == before
    code, events, output = sparkctl(["cluster", "bootstrap", served["inventory"], "--json"], env)
    assert code == 0 and changed(events) == set(), changed(events)


def test_a_short_lab_token_masks_no_path(lab_pair, served, env):
    """HF_TOKEN=lab, as the README's lab line has it: the lab's paths (cluster lab-<id>) print whole; a real token
    is masked everywhere (the next test)."""
    # a drifted serve config on spark2: the change names its path under the state dir (check mode: kept as is)
    config = f"{state_dir(lab_pair)}/extra-llm-api-config.yml"
    sh(lab_pair, "spark2", f"cp {config} {config}.kept && echo '# drift' >> {config}")
    try:
        code, _events, output = sparkctl(["cluster", "bootstrap", served["inventory"], "--check", "-v"],
                                         {**env, "HF_TOKEN": "lab"})
    finally:
        sh(lab_pair, "spark2", f"mv -f {config}.kept {config}")
    assert code == 4, output[-3000:]  # the token file would change (it holds the real one), and the config
    cluster = yaml.safe_load(lab_pair.inventory_path.read_text())["cluster"]["name"]
    assert cluster.startswith("lab-") and f"/sparkctl/{cluster}/" in output, output[-3000:]
    assert f"{MASK}-" not in output and f"-{MASK}" not in output


def test_the_token_never_appears_in_logs_events_journal_argv_or_processes(lab_pair, served, env):
    places = {"sparkctl output": "\n".join(served["outputs"])}
    runs = os.path.join(env["XDG_STATE_HOME"], "sparkctl")
    for root, _dirs, files in os.walk(runs):
        for name in files:
            with open(os.path.join(root, name), errors="replace") as handle:
                places[f"journal {name}"] = handle.read()
    assert any(k.startswith("journal") for k in places)
    serve_dir = state_dir(lab_pair)
    for n in lab_pair.nodes:
        places[f"{n.name} docker.log"] = sh(lab_pair, n.name, "cat /run/lab/docker.log")
        places[f"{n.name} journal"] = sh(lab_pair, n.name, "journalctl --no-pager -o cat 2>/dev/null | tail -n 20000")
        places[f"{n.name} ps"] = sh(lab_pair, n.name, "ps -eww -o args")
        places[f"{n.name} container ps"] = sh(lab_pair, n.name, f"docker exec {CONTAINER} ps -eww -o args")
        places[f"{n.name} container env"] = sh(lab_pair, n.name, f"docker exec {CONTAINER} env")
        places[f"{n.name} serve dir"] = sh(lab_pair, n.name, f"cat {serve_dir}/* 2>/dev/null")
    assert "trtllm-serve" in places["spark1 container ps"]  # the search looks where the server runs
    leaks = [where for where, text in places.items() if TOKEN in text]
    assert leaks == []
    # where it must be: the 0600 token file
    assert sh(lab_pair, "spark1", "cat /home/nvidia/.cache/huggingface/token").strip() == TOKEN


def container_images(lab) -> dict[str, str]:
    """Each node's engine container: the image ID it runs."""
    return {n.name: sh(lab, n.name, f"docker inspect --format '{{{{.Image}}}}' {CONTAINER}").strip()
            for n in lab.nodes}


def image_id(lab, ref: str) -> str:
    return sh(lab, lab.nodes[0].name, f"docker image inspect --format '{{{{.Id}}}}' {shlex.quote(ref)}").strip()


def rollback_lines(events: list[dict]) -> list[str]:
    return [e["message"] for e in events if e.get("task") == "serve.rollback" and e.get("event") == "log"]


def test_an_image_that_fails_at_load_is_rolled_back_and_a_good_one_switched_to_and_back(lab_pair, served, env,
                                                                                         tmp_path):
    key = api_key(served, env)
    serving = yaml.safe_load(Path(served["inventory"]).read_text())["container"]["image"]
    old = container_images(lab_pair)
    assert set(old.values()) == {image_id(lab_pair, serving)}
    broken = write_inventory(lab_pair, tmp_path / "broken.yaml", SERVE, image=ensure_variant("broken"))
    code, events, output = sparkctl(["cluster", "bootstrap", broken, "--json"], env)
    served["outputs"].append(output)
    # the switch waited for the image on every node, the new world failed at load, the old one came back
    assert code == 1, output[-3000:]
    assert ("serve.switch", None) in changed(events)
    assert [f["task"] for f in failed(events)] == ["serve.launch"]
    lines = rollback_lines(events)
    assert lines and lines[-1].startswith("rolled back: serve.launch"), lines
    assert "serves again" in lines[-1]
    assert "no kernels for this GPU" in output, output[-3000:]
    assert container_images(lab_pair) == old
    chat(lab_pair, key)
    # the old inventory, unchanged, is exactly what runs
    code, events, output = sparkctl(["cluster", "bootstrap", served["inventory"], "--json"], env)
    assert code == 0 and changed(events) == set(), output[-3000:]

    # a good image: switched to, then back by hand
    good = ensure_variant("next")
    moved = write_inventory(lab_pair, tmp_path / "next.yaml", SERVE, image=good)
    code, events, output = sparkctl(["cluster", "bootstrap", moved, "--json"], env)
    assert code == 0, output[-3000:]
    assert set(container_images(lab_pair).values()) == {image_id(lab_pair, good)}
    chat(lab_pair, key)
    code, _events, output = sparkctl(["serve", "status", moved], env)
    assert re.search(r"deployment +#\d+ " + re.escape(good), output), output
    assert re.search(r"previous +#\d+ " + re.escape(serving), output), output
    code, events, output = sparkctl(["serve", "rollback", moved, "--json"], env)
    assert code == 0, output[-3000:]
    assert rollback_lines(events)[-1].startswith("rolled back by hand"), rollback_lines(events)
    assert container_images(lab_pair) == old
    chat(lab_pair, key)
    code, events, output = sparkctl(["cluster", "bootstrap", served["inventory"], "--json"], env)
    assert code == 0 and changed(events) == set(), output[-3000:]


def exits(lab) -> list[RunEnd]:
    return parse_exits(sh(lab, "spark1", f"cat {state_dir(lab)}/exits.log"))


def wedge(lab) -> None:
    """The stand-in's one-shot fault: the next request finds rank 0's engine stuck for good (/health stays 200)."""
    sh(lab, "spark1", f"docker exec {CONTAINER} sh -c 'mkdir -p /run/lab && echo wedge >> /run/lab/standin-faults'")


def test_a_wedged_world_is_ended_by_its_watchdog_and_served_again_by_itself(lab_pair, served, env):
    """A world alive but generating nothing: under a steady request loop, then with no load at all (the canary
    finds it), the watchdog ends it, the unit starts the whole world again, and the endpoint answers with no
    sparkctl command; each end is recorded as `stuck` with what was seen; doctor is healthy afterwards."""
    key = api_key(served, env)
    stop = threading.Event()

    def load():
        while not stop.is_set():
            chat_status(lab_pair, key)

    for under in ("a request loop", "no load"):
        since, before = started(lab_pair), len([e for e in exits(lab_pair) if e.result == "stuck"])
        loop = threading.Thread(target=load, daemon=True) if under == "a request loop" else None
        if loop:
            loop.start()
        wedge(lab_pair)
        assert http(f"http://{lab_pair.nodes[0].mgmt_ip}:8355/health")[0] == 200  # alive, as a wedge is
        assert poll(lambda before=before: len([e for e in exits(lab_pair) if e.result == "stuck"]) > before,
                    timeout=120,
                    interval=2), (under, sh(lab_pair, "spark1", f"tail -n 5 {state_dir(lab_pair)}/serve.log.1 "
                                                               f"{state_dir(lab_pair)}/serve.log"))
        stop.set()
        if loop:
            loop.join(timeout=60)
        assert serving_again(lab_pair, key, since), under
        end = [e for e in exits(lab_pair) if e.result == "stuck"][-1]
        assert end.evidence and "gpu_power_w" in end.evidence and end.evidence["last_token_at"], end
        reason = end.evidence["reason"]
        assert reason.startswith("a one-token canary completion got no answer within 5s"), reason
        stop.clear()
    code, _events, output = sparkctl(["serve", "status", served["inventory"]], env)
    assert code == 0 and "stuck after" in output and "the whole world was started again" in output, output
    report = doctor(lab_pair, env=env, inventory=served["inventory"])
    assert [f for f in report["findings"] if f["severity"] == "error"] == [], report["findings"]
    assert [f["severity"] for f in report["findings"] if f["id"] == "serve.stuck"] == ["info"], report["findings"]


def test_cluster_down_stops_and_removes_the_unit_before_the_containers(lab_pair, served, env):
    """Last in this module: it takes the serving down. The unit goes first (its stop ends the server inside the
    container), then the gateway and the containers; nothing of the server is left running on either node."""
    code, events, output = sparkctl(["cluster", "down", served["inventory"], "--json"], env)
    assert code == 0, output[-3000:]
    # on the head (each node goes through a phase at its own pace: the order holds per node)
    order = [e["task"] for e in events if e["event"] == "task_result" and e["status"] == "changed"
             and e.get("node") == "spark1"]
    assert order.index("serve.unit_remove") < order.index("container.remove"), order
    assert unit_state_of(lab_pair).get("LoadState") == "not-found"
    assert sh(lab_pair, "spark1", f"ls /etc/systemd/system/ | grep -c {unit(lab_pair)}").strip() == "0"
    for node in ("spark1", "spark2"):
        assert "mpirun" not in sh(lab_pair, node, "ps -eww -o args") and "trtllm-serve" not in sh(
            lab_pair, node, "ps -eww -o args"), node
    assert "sparkctl-collector" not in sh(lab_pair, "spark1", "docker ps -a --format '{{.Names}}'")
    code, events, _output = sparkctl(["cluster", "down", served["inventory"], "--json"], env)
    assert code == 0 and changed(events) == set()


def unit_state_of(lab) -> dict[str, str]:
    cluster = yaml.safe_load(lab.inventory_path.read_text())["cluster"]["name"]
    return parse_show(sh(lab, "spark1", show_command(cluster)))
