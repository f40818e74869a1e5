"""The lab's `vllm` stand-in (sparkctl/lab/standins/image-bin/vllm): it refuses what the release's parser and engine
refuse, in their words (from sparkctl/knowledge/vllm_releases.json, read from vLLM's source), and two processes on
this machine meet as --nnodes 2 and serve a chat completion whose every token crosses to the other."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import time
import urllib.request

import pytest

from sparkctl.knowledge import metric_names
from sparkctl.knowledge.serve_metrics import parse_prometheus
from sparkctl.knowledge.vllm_releases import DATA_PATH
from sparkctl.lab.standins import standin_path
from tests.lab.conftest import poll

VLLM = str(standin_path("vllm"))


@pytest.fixture
def model(tmp_path):
    """A local model dir and draft dir as vLLM would load them (config.json and safetensors)."""
    for name in ("model", "draft"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.json").write_text("{}")
        (tmp_path / name / "model.safetensors").write_bytes(b"\0")
    return tmp_path


def env(version="0.20.1", **extra):
    return {**os.environ, "SPARKCTL_LAB_VLLM_RELEASES": str(DATA_PATH), "SPARKCTL_LAB_VLLM_VERSION": version,
            "SPARKCTL_LAB_SERVE_DELAY": "0.2", **extra}


def vllm(*args, version="0.20.1", timeout=30):
    return subprocess.run([VLLM, "serve", *args], env=env(version), capture_output=True, text=True, timeout=timeout)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_the_parser_refuses_as_the_releases_argparse_does(model):
    gone = vllm(str(model / "model"), "--swap-space", "4")  # removed in 0.20.1 (arg_utils.py at v0.20.1)
    assert gone.returncode == 2 and gone.stderr.splitlines()[-1] == "vllm: error: unrecognized arguments: " \
                                                                     "--swap-space 4"
    choice = vllm(str(model / "model"), "--kv-cache-dtype", "fp9")
    assert choice.returncode == 2
    assert choice.stderr.splitlines()[-1].startswith("vllm serve: error: argument --kv-cache-dtype: invalid choice: "
                                                     "'fp9' (choose from 'auto', ")
    number = vllm(str(model / "model"), "--max-num-seqs", "many")
    assert number.stderr.splitlines()[-1] == "vllm serve: error: argument --max-num-seqs: invalid int value: 'many'"
    # the same flag on the release that still has it gets past the parser (to the world check: one GPU here)
    older = vllm(str(model / "model"), "--swap-space", "4", "-tp", "2", version="0.17.1")
    assert older.returncode == 1 and "World size (2) is larger than the number of available GPUs (1)" in older.stderr


def test_a_speculative_key_is_refused_from_0_17_and_dropped_before(model, tmp_path):
    spec = json.dumps({"method": "eagle3", "model": str(model / "draft"), "num_speculative_tokenz": 3})
    new = vllm(str(model / "model"), "--speculative-config", spec, "-tp", "2", "--nnodes", "2", "--node-rank", "1")
    assert new.returncode == 1 and "validation error for SpeculativeConfig\nnum_speculative_tokenz" in new.stderr
    # 0.11.1 drops the key without a word and goes on (here to the headless check)
    old = vllm(str(model / "model"), "--speculative-config", spec, "-tp", "2", "--nnodes", "2", "--node-rank", "1",
               version="0.11.1")
    assert old.returncode == 1 and "SpeculativeConfig" not in old.stderr and "--headless" in old.stderr


def test_two_nodes_meet_serve_and_the_master_notices_a_worker_gone(model):
    master, http = free_port(), free_port()
    common = [VLLM, "serve", str(model / "model"), "-tp", "2", "--nnodes", "2", "--master-addr", "127.0.0.1",
              "--master-port", str(master)]
    head = subprocess.Popen([*common, "--node-rank", "0", "--host", "127.0.0.1", "--port", str(http),
                             "--served-model-name", "m", "alias"], env=env(), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    worker = subprocess.Popen([*common, "--node-rank", "1", "--headless"], env=env(), stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True)
    try:
        def health():
            try:
                return urllib.request.urlopen(f"http://127.0.0.1:{http}/health", timeout=2).status
            except OSError as error:
                return getattr(error, "code", None)

        poll(lambda: health() == 200, timeout=20, interval=0.2)
        body = json.dumps({"model": "m", "messages": [{"role": "user", "content": "hello fabric"}],
                           "max_tokens": 5}).encode()
        request = urllib.request.Request(f"http://127.0.0.1:{http}/v1/chat/completions", data=body,
                                         headers={"Content-Type": "application/json"})
        reply = json.load(urllib.request.urlopen(request, timeout=10))
        assert len(reply["choices"][0]["message"]["content"].split()) == 5
        metrics = urllib.request.urlopen(f"http://127.0.0.1:{http}/metrics", timeout=5).read().decode()
        assert 'vllm:generation_tokens_total{engine="0",model_name="m"} 5.0' in metrics
        assert parse_prometheus(metrics, metric_names.VLLM).generation_tokens == 5.0  # as sparkctl top reads a real one
        # every served name answers, under the first; a name not served is refused as vLLM does
        for name, status in (("alias", 200), ("other", 404)):
            asked = urllib.request.Request(request.full_url, data=json.dumps({"model": name, "prompt": "x",
                                                                              "max_tokens": 1}).encode(),
                                           headers={"Content-Type": "application/json"})
            asked.full_url = asked.full_url.replace("chat/completions", "completions")
            try:
                answer = json.load(urllib.request.urlopen(asked, timeout=10))
                assert status == 200 and answer["model"] == "m", answer
            except urllib.error.HTTPError as error:
                assert status == error.code == 404 and "The model `other` does not exist." in error.read().decode()
        listed = json.load(urllib.request.urlopen(f"http://127.0.0.1:{http}/v1/models", timeout=5))
        assert [card["id"] for card in listed["data"]] == ["m", "alias"]
        worker.kill()
        worker.wait()
        with pytest.raises(OSError):
            urllib.request.urlopen(request, timeout=10)
        assert health() == 503
    finally:
        for process in (head, worker):
            process.kill()
            process.wait()


def test_a_worker_that_cannot_reach_the_master_hangs_and_says_so(model):
    port = free_port()  # nothing listens there
    worker = subprocess.Popen([VLLM, "serve", str(model / "model"), "-tp", "2", "--nnodes", "2", "--node-rank", "1",
                               "--headless", "--master-addr", "127.0.0.1", "--master-port", str(port)], env=env(),
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        time.sleep(1.5)
        assert worker.poll() is None  # still trying, as torch's store client does
    finally:
        worker.kill()
        out, _ = worker.communicate()
    assert f"The client socket has failed to connect to [127.0.0.1]:{port}" in out


def test_over_ray_the_driver_waits_for_its_placement_group_then_a_worker_node_runs_the_rank(model, tmp_path):
    """The lab's `ray` stand-in as vLLM uses it: a head node, `vllm serve --distributed-executor-backend ray` that
    waits (vLLM's own message) until a worker node with a GPU joins, then its rank runs there and every token
    crosses to it; `ray stop` ends the Ray processes."""
    ray = str(standin_path("ray"))
    address = tmp_path / "ray_current_cluster"
    ray_env = env(SPARKCTL_LAB_RAY_ADDRESS_FILE=str(address), VLLM_HOST_IP="127.0.0.1")
    port, http = free_port(), free_port()
    head = subprocess.run([ray, "start", "--head", "--port", str(port), "--node-ip-address", "127.0.0.1",
                           "--num-gpus", "1"], env=ray_env, capture_output=True, text=True, timeout=30)
    assert head.returncode == 0 and "Ray runtime started." in head.stdout, head.stderr
    assert address.read_text().strip() == f"127.0.0.1:{port}"
    driver = subprocess.Popen([VLLM, "serve", str(model / "model"), "-tp", "2", "--distributed-executor-backend",
                               "ray", "--host", "127.0.0.1", "--port", str(http), "--served-model-name", "m"],
                              env={**ray_env, "SPARKCTL_LAB_PG_WAIT_TIMEOUT": "60"}, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True)
    worker = None
    try:
        time.sleep(1.5)
        assert driver.poll() is None  # its placement group waits for a second GPU
        worker = subprocess.Popen([ray, "start", "--address", f"127.0.0.1:{port}", "--node-ip-address", "127.0.0.2",
                                   "--num-gpus", "1", "--block"], env={**ray_env, "VLLM_HOST_IP": "127.0.0.2"},
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)

        def health():
            try:
                return urllib.request.urlopen(f"http://127.0.0.1:{http}/health", timeout=2).status
            except OSError as error:
                return getattr(error, "code", None)

        assert poll(lambda: health() == 200, timeout=40, interval=0.2)
        body = json.dumps({"model": "m", "messages": [{"role": "user", "content": "hello ray"}],
                           "max_tokens": 4}).encode()
        request = urllib.request.Request(f"http://127.0.0.1:{http}/v1/chat/completions", data=body,
                                         headers={"Content-Type": "application/json"})
        assert len(json.load(urllib.request.urlopen(request, timeout=10))["choices"][0]["message"]["content"]
                   .split()) == 4
        status = subprocess.run([ray, "status"], env=ray_env, capture_output=True, text=True, timeout=30)
        assert "node_127.0.0.2" in status.stdout and "2.0 GPU" in status.stdout
    finally:
        driver.kill()
        out, _ = driver.communicate()
        stopped = subprocess.run([ray, "stop", "--force"], env=ray_env, capture_output=True, text=True, timeout=30)
        if worker is not None:
            worker.kill()
            worker.wait()
    assert "rank 1 joined from 127.0.0.2" in out
    assert stopped.stdout.startswith("Stopped all") and not address.exists()
