"""The lab's SGLang stand-in (sparkctl/lab/standins/image-lib/sglang/launch_server.py, run as `python3 -m
sglang.launch_server`): it refuses what the release's argparse and ServerArgs refuse, in their words, as sparkctl's own
check of the same release data (sparkctl/knowledge/sglang_releases.json) words them; two processes on this machine
meet as --nnodes 2 and serve chat completions whose every step crosses to the other; a rank advertising an address it
does not own leaves the world hung behind a 503; a rank that cannot reach --dist-init-addr says torch's warning.
Everything talks to 127.0.0.1 only; every process started is killed."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from sparkctl.knowledge import metric_names
from sparkctl.knowledge.serve_metrics import parse_prometheus
from sparkctl.knowledge.sglang_releases import DATA_PATH, SglangVersion, schema_for
from sparkctl.lab.standins import fixture_repos_dir, image_lib_dir

MODEL = "meta-llama/Llama-3.3-70B-Instruct"
DRAFT = "yuhuili--EAGLE3-LLaMA3.3-Instruct-70B"
SPECULATIVE = ["--speculative-eagle-topk", "1", "--speculative-algorithm", "EAGLE3", "--speculative-num-steps", "3",
               "--speculative-num-draft-tokens", "4"]
#: what the caller's environment could set and the stand-in reads: each test says its own
LEAKS = ("SGLANG_HOST_IP", "HOST_IP", "SGLANG_LOCAL_IP_NIC", "HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "NCCL_DEBUG",
         "NCCL_SOCKET_IFNAME", "NCCL_IB_HCA", "NCCL_IB_DISABLE", "SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN")


@pytest.fixture
def cache(tmp_path) -> Path:
    """A Hugging Face home whose hub holds the model as a repo id (refs/main -> its snapshot), and the draft as a
    local dir, as model.fetch leaves them; both from the lab's fixture repos."""
    repo = tmp_path / "hf" / "hub" / f"models--{MODEL.replace('/', '--')}"
    snapshot = repo / "snapshots" / ("a" * 40)
    snapshot.mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("a" * 40)
    draft = tmp_path / "hf" / "sparkctl-models" / DRAFT
    draft.mkdir(parents=True)
    for source, target in ((fixture_repos_dir() / MODEL.replace("/", "--"), snapshot),
                           (fixture_repos_dir() / DRAFT, draft)):
        for name in ("config.json", "model.safetensors"):
            shutil.copy(source / name, target / name)
    return tmp_path / "hf"


def env(cache: Path, version: str = "0.5.8", **extra: str) -> dict[str, str]:
    base = {k: v for k, v in os.environ.items() if k not in LEAKS}
    return {**base, "PYTHONPATH": str(image_lib_dir()), "SPARKCTL_LAB_SGLANG_RELEASES": str(DATA_PATH),
            "SPARKCTL_LAB_SGLANG_VERSION": version, "SPARKCTL_LAB_SERVE_DELAY": "0.2", "HF_HOME": str(cache),
            "PYTHONDONTWRITEBYTECODE": "1", **extra}


def launch(cache: Path, *args: str, version: str = "0.5.8") -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "sglang.launch_server", *args], env=env(cache, version),
                          capture_output=True, text=True, timeout=30)


def start(cache: Path, log: Path, *args: str, **extra: str) -> subprocess.Popen:
    """A rank in the background, its output (stdout and stderr, as world.sh keeps them) in `log`."""
    with log.open("w") as out:
        return subprocess.Popen([sys.executable, "-m", "sglang.launch_server", *args], env=env(cache, **extra),
                                stdout=out, stderr=subprocess.STDOUT, text=True)


def stop(*processes: subprocess.Popen) -> None:
    for process in processes:
        process.kill()
        process.wait(timeout=10)


def poll(check, timeout: float = 15, interval: float = 0.1):
    """Until check() is truthy; its value, or the last one after the timeout."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value or time.monotonic() > deadline:
            return value
        time.sleep(interval)


def free_ports(count: int = 3) -> int:
    """A port P with P..P+count-1 free on every address (the store on P, the message queue on P+1+rank)."""
    for _ in range(50):
        with socket.socket() as probe:
            probe.bind(("", 0))
            base = probe.getsockname()[1]
        held = []
        try:
            for port in range(base, base + count):
                s = socket.socket()
                held.append(s)
                s.bind(("", port))
            return base
        except OSError:
            continue
        finally:
            for s in held:
                s.close()
    raise RuntimeError("no run of free ports")


def status(url: str) -> int | None:
    try:
        return urllib.request.urlopen(url, timeout=5).status
    except urllib.error.HTTPError as error:
        return error.code
    except OSError:
        return None


def post(url: str, body: dict) -> bytes:
    request = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    return urllib.request.urlopen(request, timeout=15).read()


def sparkctl_says(version: str, *argv: str) -> str:
    """sparkctl's own judgement of the same flags (inventory validate, doctor), from the same release data."""
    parsed = SglangVersion.parse(version)
    assert parsed is not None
    (problem,) = schema_for(parsed).check_flags(list(argv))
    return problem.message


@pytest.mark.parametrize(("version", "argv", "expected"), [
    ("0.5.8", ("--tp_size", "2"), "launch_server.py: error: unrecognized arguments: --tp_size 2"),
    ("0.5.8", ("--speculative-algorithm", "eagle3"), "launch_server.py: error: argument --speculative-algorithm: "
                                                     "invalid choice: 'eagle3' (choose from 'EAGLE', 'EAGLE3', "
                                                     "'NEXTN', 'STANDALONE', 'NGRAM')"),
    ("0.5.8", ("--enable-metrics=true",), "launch_server.py: error: argument --enable-metrics: ignored explicit "
                                          "argument 'true'"),
    ("0.5.8", ("--enable-metrics", "true"), "launch_server.py: error: unrecognized arguments: true"),
    ("0.5.8", ("--spec", "x"), None),  # ambiguous: argparse lists every --speculative-* option string
    ("0.5.8", ("--tp-size", "two"), "launch_server.py: error: argument --tensor-parallel-size/--tp-size: invalid int "
                                    "value: 'two'"),
    ("0.5.12", ("--tp_size", "2"), "sglang serve: error: unrecognized arguments: --tp_size 2"),  # its parser's prog
    ("0.5.12", ("--context-length", "32q"), "sglang serve: error: argument --context-length: invalid "
                                            "human_readable_int value: '32q'"),

    # 0.5.18 refuses a retired flag by parser.error with its own message
    ("0.5.18", ("--enable-expert-distribution-metrics",),
     "sglang serve: error: --enable-expert-distribution-metrics is no longer supported. Use "
     "--expert-balancedness-report-mode with one of: off, server_log, prometheus, both."),
    # flags derived from the record's fields (0.5.20's arg_groups/fields/): --tp-size first, its alias after
    ("0.5.23", ("--tp-size", "two"), "sglang serve: error: argument --tp-size/--tensor-parallel-size: invalid int "
                                     "value: 'two'"),
    ("0.5.23", ("--tp_size", "2"), "sglang serve: error: unrecognized arguments: --tp_size 2"),
])
def test_the_parser_refuses_as_the_releases_argparse_and_as_sparkctl_says(cache, version, argv, expected):
    done = launch(cache, "--model-path", MODEL, *argv, version=version)
    said = done.stderr.strip().splitlines()
    assert done.returncode == 2 and any(line.startswith("usage: ") for line in said), done.stderr
    if expected is None:
        assert said[-1].startswith("launch_server.py: error: ambiguous option: --spec could match "
                                   "--speculative-accept-threshold-acc, "), said[-1]
    else:
        assert said[-1] == expected
    assert said[-1] == sparkctl_says(version, *argv)


def test_abbreviations_and_the_whole_sparkctl_line_get_past_the_parser(cache):
    """`--tp 2` is --tensor-parallel-size; the line sparkctl writes parses (it stops at the GPU here: one rank of a
    world of two, alone)."""
    done = launch(cache, "--model-path", MODEL, "--tp", "2", "--enable-metrics", "--context-length", "2048",
                  "--mem-fraction-static", "0.75", *SPECULATIVE)
    assert done.returncode == 1 and done.stderr.splitlines()[-1] == "RuntimeError: CUDA error: invalid device ordinal"


@pytest.mark.parametrize(("version", "argv", "expected"), [
    # topk or draft tokens without num-steps: the bare assert of _handle_speculative_decoding
    ("0.5.8", ("--speculative-algorithm", "EAGLE3", "--speculative-eagle-topk", "4"), "AssertionError"),
    ("0.5.8", ("--speculative-algorithm", "EAGLE3", "--speculative-num-draft-tokens", "4"), "AssertionError"),
    # num-steps without topk: `self.speculative_eagle_topk > 1` meets None
    ("0.5.8", ("--speculative-algorithm", "EAGLE3", "--speculative-num-steps", "3"),
     "TypeError: '>' not supported between instances of 'NoneType' and 'int'"),
    ("0.5.3.post3", ("--speculative-algorithm", "NEXTN", "--speculative-num-steps", "3"),
     "TypeError: '>' not supported between instances of 'NoneType' and 'int'"),
    # a name 0.5.12 (a free string, upper-cased) does not know
    ("0.5.12", ("--speculative-algorithm", "dspark"), "ValueError: Unknown speculative algorithm name: dspark"),
    # check_server_args
    ("0.5.8", ("--tp-size", "3", "--nnodes", "2"), "AssertionError: tp_size must be divisible by number of nodes"),
    ("0.5.8", ("--dp-size", "2", "--tp-size", "2", "--nnodes", "2"),
     "AssertionError: multi-node data parallel is not supported unless dp attention!"),

    # 0.5.18 on: the checks live in arg_groups/ hooks (the eagle family's, reached through the algorithm's dispatch)
    ("0.5.23", ("--speculative-algorithm", "EAGLE3", "--speculative-eagle-topk", "4"), "AssertionError"),
    ("0.5.18", ("--speculative-algorithm", "NEXTN", "--speculative-num-steps", "3"),
     "TypeError: '>' not supported between instances of 'NoneType' and 'int'"),
    ("0.5.23", ("--tp-size", "3", "--nnodes", "2"), "AssertionError: tp_size must be divisible by number of nodes"),
])
def test_the_start_up_checks_stop_it_in_the_releases_words(cache, version, argv, expected):
    done = launch(cache, "--model-path", MODEL, *argv, version=version)
    assert done.returncode == 1, done.stderr
    assert "Traceback (most recent call last):" in done.stderr and done.stderr.splitlines()[-1] == expected
    parsed = SglangVersion.parse(version)
    assert parsed is not None
    schema = schema_for(parsed)
    flags = dict(zip(argv[::2], argv[1::2], strict=True))
    said = [p.message for p in schema.speculative_problems(flags) + schema.multi_node_problems(flags)]
    assert said and expected in said[0], said  # as sparkctl words it


def test_the_model_and_the_draft_must_be_there(cache, tmp_path):
    missing = launch(cache, "--model-path", "meta-llama/Llama-3.1-405B-Instruct")
    assert missing.returncode == 1
    assert "OSError: We couldn't connect to 'https://huggingface.co' to load the files, and couldn't find them in " \
           "the cached files: no config.json for meta-llama/Llama-3.1-405B-Instruct" in missing.stderr
    nowhere = tmp_path / "nowhere" / DRAFT
    draft = launch(cache, "--model-path", MODEL, *SPECULATIVE, "--speculative-draft-model-path", str(nowhere))
    assert draft.returncode == 1 and draft.stderr.splitlines()[-1] == (
        f"OSError: Incorrect path_or_model_id: '{nowhere}'. Please provide either the path to a local folder or the "
        "repo_id of a model on the Hub.")
    longer = launch(cache, "--model-path", MODEL, "--context-length", "4096")  # the fixture's config says no length
    assert longer.returncode == 1 and longer.stderr.splitlines()[-1].startswith(
        "ValueError: User-specified context_length (4096) is greater than the derived context_length (2048).")


def test_one_node_serves_without_metrics_unless_asked_and_ends_on_term(cache, tmp_path):
    port = free_ports(1)
    server = start(cache, tmp_path / "one.log", "--model-path", MODEL, "--host", "127.0.0.1", "--port", str(port))
    try:
        assert poll(lambda: status(f"http://127.0.0.1:{port}/health") == 200, timeout=15)
        reply = json.loads(post(f"http://127.0.0.1:{port}/v1/completions", {"prompt": "hello", "max_tokens": 3}))
        assert reply["object"] == "text_completion" and len(reply["choices"][0]["text"].split()) == 3
        assert status(f"http://127.0.0.1:{port}/metrics") == 404  # no --enable-metrics
        info = json.loads(urllib.request.urlopen(f"http://127.0.0.1:{port}/get_server_info", timeout=5).read())
        assert info["version"] == "0.5.8" and info["tp_size"] == 1 and info["model_path"] == MODEL
        server.terminate()
        assert server.wait(timeout=5) == 0
    finally:
        stop(server)
    assert "The server is fired up and ready to roll!" in (tmp_path / "one.log").read_text()
    # weights missing: the server starts, then its load fails
    snapshot = next((cache / "hub").glob("models--*/snapshots/*"))
    (snapshot / "model.safetensors").unlink()
    done = launch(cache, "--model-path", MODEL, "--host", "127.0.0.1", "--port", str(free_ports(1)))
    assert done.returncode == 1 and done.stderr.splitlines()[-1] == \
        f"RuntimeError: Cannot find any model weights with `{MODEL}`"


def world(cache: Path, tmp_path: Path, worker_env: dict[str, str] | None = None):
    """Two ranks on loopback as sparkctl launches them (--nnodes 2, the speculative line), each its own HTTP port."""
    store = free_ports(3)
    http0, http1 = (poll(lambda: (p := free_ports(1)) not in range(store, store + 3) and p) for _ in range(2))
    common = ["--model-path", MODEL, "--served-model-name", "m", "--tp-size", "2", "--enable-metrics", "--nnodes",
              "2", "--dist-init-addr", f"127.0.0.1:{store}", "--host", "127.0.0.1", "--context-length", "2048",
              *SPECULATIVE, "--speculative-draft-model-path", str(cache / "sparkctl-models" / DRAFT)]
    nccl = {"NCCL_DEBUG": "INFO", "NCCL_SOCKET_IFNAME": "lo", "SGLANG_HOST_IP": "127.0.0.1"}
    head = start(cache, tmp_path / "rank0.log", *common, "--node-rank", "0", "--port", str(http0), **nccl)
    worker = start(cache, tmp_path / "rank1.log", *common, "--node-rank", "1", "--port", str(http1),
                   **{**nccl, **(worker_env or {})})
    return head, worker, f"http://127.0.0.1:{http0}", f"http://127.0.0.1:{http1}"


def test_two_nodes_meet_serve_and_rank_0_notices_a_rank_gone(cache, tmp_path):
    head, worker, url, worker_url = world(cache, tmp_path)
    try:
        assert poll(lambda: status(f"{url}/health") == 200, timeout=20)
        assert status(f"{worker_url}/health") == 200  # SGLang's dummy health server on node_rank >= 1
        chat = {"model": "m", "messages": [{"role": "user", "content": "hello fabric"}], "max_tokens": 6}
        reply = json.loads(post(f"{url}/v1/chat/completions", chat))
        assert reply["object"] == "chat.completion" and len(reply["choices"][0]["message"]["content"].split()) == 6
        events = post(f"{url}/v1/chat/completions", {**chat, "stream": True}).decode().split("\n\n")
        assert events[-2] == "data: [DONE]"
        chunks = [json.loads(e.removeprefix("data: ")) for e in events[:-2]]
        text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks)
        assert len(text.split()) == 6 and chunks[-1]["choices"][0]["finish_reason"] == "length"
        assert json.loads(urllib.request.urlopen(f"{url}/v1/models", timeout=5).read())["data"][0]["id"] == "m"
        metrics = urllib.request.urlopen(f"{url}/metrics", timeout=5).read().decode()
        sample = parse_prometheus(metrics, metric_names.SGLANG)  # as sparkctl top reads a real one
        assert sample.generation_tokens and sample.generation_tokens > 0 and sample.running == 0
        assert sample.kv_cache_fraction is not None and sample.accept_length and sample.accept_length >= 1
        assert sample.ttft_buckets and sample.ttft_buckets[-1][1] >= 2
        worker.kill()
        worker.wait(timeout=10)
        with pytest.raises(OSError):
            post(f"{url}/v1/chat/completions", chat)
        assert status(f"{url}/health") == 503
        head.terminate()
        assert head.wait(timeout=5) == 0  # TERM: exit 0, at once
    finally:
        stop(head, worker)
    out0, out1 = (tmp_path / "rank0.log").read_text(), (tmp_path / "rank1.log").read_text()
    assert "The server is fired up and ready to roll!" in out0
    for out, rank, peer in ((out0, 0, 1), (out1, 1, 0)):
        assert "NCCL INFO NET/Socket : Using [0]lo:127.0.0.1<0>" in out and "NCCL INFO Using network Socket" in out
        assert f"NCCL INFO Channel 00/0 : {rank}[0] -> {peer}[0] [send] via NET/Socket/0" in out
    assert out0.count("NCCL INFO NCCL version 2.28.9") == 1 and "NCCL version" not in out1


def own(address: str) -> bool:
    with open("/proc/net/fib_trie") as handle:
        return f"|-- {address}\n" in handle.read()


def test_a_rank_advertising_an_address_it_does_not_own_hangs_the_world_behind_a_503(cache, tmp_path):
    """SGLANG_HOST_IP not the node's own (on a Spark: not its fabric address): the ranks meet at --dist-init-addr and
    print NCCL's lines, then rank 0 cannot open the message queue to the address the worker advertised; both wait
    without a word, rank 0's /health 503. (127.0.0.254 is loopback, but no interface here holds it: refused.)"""
    if own("127.0.0.254"):
        pytest.skip("127.0.0.254 is an address of this machine")
    head, worker, url, worker_url = world(cache, tmp_path, {"SGLANG_HOST_IP": "127.0.0.254"})
    try:
        logs = [tmp_path / "rank0.log", tmp_path / "rank1.log"]
        assert poll(lambda: all("NCCL INFO Using network Socket" in p.read_text() for p in logs), timeout=15)
        time.sleep(1.0)  # well past SPARKCTL_LAB_SERVE_DELAY (0.2 s)
        assert [status(f"{url}/health") for _ in range(3)] == [503] * 3
        assert status(f"{worker_url}/health") is None  # its dummy server comes only once it is loaded
        assert head.poll() is None and worker.poll() is None
    finally:
        stop(head, worker)
    out0 = (tmp_path / "rank0.log").read_text()
    assert "fired up" not in out0 and "Load weight begin" not in out0


def test_a_rank_that_cannot_reach_the_dist_init_addr_says_torchs_warning_and_waits(cache, tmp_path):
    port = free_ports(3)  # nothing listens there
    worker = start(cache, tmp_path / "rank1.log", "--model-path", MODEL, "--tp-size", "2", "--nnodes", "2",
                   "--node-rank", "1", "--dist-init-addr", f"127.0.0.1:{port}", "--host", "127.0.0.1", "--port",
                   str(free_ports(1)), SGLANG_HOST_IP="127.0.0.1")
    try:
        said = f"[W socket.cpp] The client socket has failed to connect to [127.0.0.1]:{port} (errno: 111 - " \
               "Connection refused)."
        assert poll(lambda: said in (tmp_path / "rank1.log").read_text(), timeout=10)
        assert worker.poll() is None  # still trying, as torch's store client does
    finally:
        stop(worker)


def test_without_a_dist_init_addr_each_node_is_alone_and_says_so_once(cache, tmp_path):
    worker = start(cache, tmp_path / "alone.log", "--model-path", MODEL, "--tp-size", "2", "--nnodes", "2",
                   "--node-rank", "1", "--host", "127.0.0.1", "--port", str(free_ports(1)))
    try:
        log = tmp_path / "alone.log"
        assert poll(lambda: "The client socket has failed to connect" in log.read_text(), timeout=10)
        time.sleep(0.5)
        assert worker.poll() is None and log.read_text().count("The client socket has failed to connect") == 1
    finally:
        stop(worker)
