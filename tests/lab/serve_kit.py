"""A lab that serves, as the serve-phase doctor tests and the controller-fault tests both seed it: the serve
section, the fake token, where the draft lands, and the faults seeded on it (the server stopped on the head, its
unit failed or looping...)."""

from __future__ import annotations

import json
import os
import shlex
import socket
import subprocess
import tarfile
import urllib.error
import urllib.request
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from sparkctl.inventory import load_inventory
from sparkctl.plan.serve_unit import LOOPING_RUNS, failing_early, parse_exits, parse_show, show_command
from sparkctl.plan.world import WorldNames
from sparkctl.runs.serve_ops import connected, server_handle
from sparkctl.tasks.serve.server import head_client
from tests.lab.conftest import poll
from tests.lab.doctor_kit import Seed
from tests.lab.lab_kit import CONTAINER, sh, sparkctl

TOKEN = "hf_LabDoctorToken7c1e9a2b4d6f8a0c3e5b"
SERVE = {"preset": "qwen3-235b-eagle3", "fit_check": "warn"}
HF = "/home/nvidia/.cache/huggingface"
DRAFT = f"{HF}/sparkctl-models/nvidia--Qwen3-235B-A22B-Eagle3"


def unit_of(lab) -> str:
    """The serving unit of the lab's serving inventory."""
    return WorldNames(load_inventory(lab.serve_inventory).cluster.name).unit_name


def serve_dir(lab) -> str:
    cluster = load_inventory(lab.serve_inventory).cluster.name
    return f"/home/nvidia/.local/state/sparkctl/{cluster}/run/serve"


def stop_server(lab, node: str) -> None:
    """The server stopped with its unit, by hand (`systemctl stop`: enabled still, it comes back at the next boot):
    nothing serves until something starts it."""
    result = lab.exec(node, f"systemctl stop {unit_of(lab)}")
    assert result.returncode == 0, result.stderr
    wait = lab.exec(node, "for i in $(seq 1 300); do ss -ltnH 'sport = :18355' | grep -q . || exit 0; sleep 0.2; done; "
                          "exit 1")
    assert wait.returncode == 0, "the engine's port is still taken"


def unit_state(lab, node: str) -> dict[str, str]:
    return parse_show(lab.exec(node, show_command(load_inventory(lab.serve_inventory).cluster.name)).stdout)


def remove_unit(lab, node: str) -> None:
    """The unit's file deleted by hand (the server it started runs on, but nothing brings it back after a reboot)."""
    result = lab.exec(node, f"rm -f /etc/systemd/system/{unit_of(lab)} && systemctl daemon-reload")
    assert result.returncode == 0, result.stderr


def fail_unit(lab, node: str) -> None:
    """The serve config gone from the head (a clean-up too eager): the unit's next start finds nothing to start and
    stops trying (world.sh exits 78, which the unit does not restart on)."""
    result = lab.exec(node, f"rm -f {serve_dir(lab)}/extra-llm-api-config.yml && systemctl restart {unit_of(lab)}")
    assert result.returncode == 0, result.stderr
    assert poll(lambda: unit_state(lab, node).get("ActiveState") == "failed", timeout=60, interval=0.5), \
        unit_state(lab, node)


def loop_unit(lab, node: str) -> None:
    """The server ends right after each start (here a hand edit of world.sh makes it so): the unit starts it again
    and again, waiting longer each time, and nothing serves."""
    edit = (f"sed -i 's/^run)$/run)\\n    echo \"ends at once\" >\\&2; exit 1/' {serve_dir(lab)}/world.sh && "
            f"systemctl restart {unit_of(lab)}")
    result = lab.exec(node, edit)
    assert result.returncode == 0, result.stderr

    def looping() -> bool:
        ends = parse_exits(lab.exec(node, f"cat {serve_dir(lab)}/exits.log").stdout)
        return failing_early(ends) >= LOOPING_RUNS

    assert poll(looping, timeout=90, interval=1), lab.exec(node, f"cat {serve_dir(lab)}/exits.log").stdout


def interrupt_download(lab, node: str) -> None:
    """A draft download cut off half way, as `hf download --local-dir` leaves it: one file missing, its first
    bytes in .cache/huggingface/download/<file>.incomplete (the next download resumes from them)."""
    script = (f"f=$(find {DRAFT} -maxdepth 1 -name '*.safetensors' | head -n 1); [ -n \"$f\" ] || exit 1; "
              f"d={DRAFT}/.cache/huggingface/download; mkdir -p \"$d\"; "
              f"head -c 16 \"$f\" > \"$d/$(basename \"$f\").incomplete\" && rm \"$f\"")
    result = lab.exec(node, script)
    assert result.returncode == 0, result.stderr


def hang_server(lab, node: str) -> None:
    """The server hung on the head (a deadlock, a stuck call): it holds the port and answers nothing. (A hung
    worker rank is not this fault in the lab: the stand-in's rank 0 gives up on a silent peer after its MPI timeout
    and exits, which is serve.down.)"""
    script = ("for p in $(pgrep -f 'bin/trtllm-serve'); do "
              "grep -q __lab_worker__ /proc/$p/cmdline || kill -STOP $p || exit 1; done")
    result = lab.exec(node, f"docker exec {CONTAINER} sh -c {shlex.quote(script)}")
    assert result.returncode == 0, result.stderr


def start_on_sockets(lab, node: str) -> None:
    """The server started again while the RoCE devices were not ready yet (right after a reboot): NCCL found no
    device and runs over TCP sockets, healthy, until the server restarts. The stand-in's one-shot switch in every
    container, then the unit restarted by hand (its launch record stays current): a bootstrap would see the
    fallback and restart it at once."""
    for name in ("spark1", "spark2"):
        result = lab.exec(name, f"docker exec {CONTAINER} sh -c 'mkdir -p /run/lab && "
                                "echo nccl-ib-late >> /run/lab/standin-faults'")
        assert result.returncode == 0, result.stderr
    result = lab.exec(node, f"systemctl restart {unit_of(lab)}")
    assert result.returncode == 0, result.stderr
    inventory = load_inventory(lab.serve_inventory)
    with connected(inventory, node) as transport:
        client = head_client(transport, inventory)
        handle = server_handle(inventory, transport)
        assert poll(lambda: client.health_detail()[0] == 200, timeout=180, interval=1), handle.tail(20)


SEEDS = [
    Seed("model-absent", "model.absent", "spark2", f"rm -rf {DRAFT}"),
    Seed("model-incomplete", "model.incomplete", "spark2", interrupt_download),
    Seed("token-missing", "hf.token_missing", "spark1", f"rm -f {HF}/token; rm -rf {DRAFT}",
         also=frozenset({("model.absent", "spark1")})),
    Seed("serve-down", "serve.down", "spark1", stop_server),
    Seed("unit-missing", "serve.unit_missing", "spark1", remove_unit),
    Seed("unit-failed", "serve.unit_failed", "spark1", fail_unit),
    Seed("unit-looping", "serve.unit_looping", "spark1", loop_unit),
    Seed("serve-hung", "serve.health", "spark1", hang_server),
    # stopped by hand: its restart policy leaves it stopped, and the endpoint answers on no address
    Seed("gateway-stopped", "serve.gateway_down", "spark1", "docker stop -t 0 sparkctl-gateway"),
    # the same for the figures collector: /metrics through the gateway answers 502
    Seed("collector-stopped", "serve.collector_down", "spark1", "docker stop -t 0 sparkctl-collector"),
    # the serve log is the head's: NCCL's lines of every rank are there
    Seed("nccl-socket-fallback", "nccl.socket_fallback", "spark1", start_on_sockets),
]


#: What tests/lab/test_bootstrap_vllm.py seeds on a worker of a vLLM world (its container recreated by hand with
#: another VLLM_HOST_IP), per lab: finding id -> (lab, which address)
VLLM_SEEDS = {
    "vllm.wrong_nic": ("ring3", "the worker's management address"),
    "vllm.ranks_one_node": ("pair", "the head's fabric address"),
}
#: the same for SGLang's ranks (SGLANG_HOST_IP), seeded by tests/lab/test_bootstrap_sglang.py
SGLANG_SEEDS = {
    "sglang.wrong_address": ("ring3", "the worker's management address"),
    "sglang.ranks_one_node": ("pair", "the head's fabric address"),
}


def written_places(lab, env: dict[str, str], inventory: str, outputs: list[str], bundle: Path) -> dict[str, str]:
    """Everywhere sparkctl shows or writes what it did, by name: its outputs so far, `cluster plan`, a support
    bundle, the run journal on this machine, and on each node docker's log, the journal, the process list and the
    gateway's `docker inspect` (where a secret must never be)."""
    places = {"sparkctl output": "\n".join(outputs)}
    code, _events, places["plan"] = sparkctl(["cluster", "plan", inventory], env)
    assert code == 0, places["plan"][-2000:]
    sparkctl(["doctor", inventory, "--bundle", str(bundle)], env)
    with tarfile.open(bundle) as archive:
        for member in archive.getmembers():
            if member.isfile():
                places[f"bundle {member.name}"] = archive.extractfile(member).read().decode(errors="replace")
    for root, _dirs, files in os.walk(os.path.join(env["XDG_STATE_HOME"], "sparkctl", "runs")):
        for name in files:
            with open(os.path.join(root, name), errors="replace") as handle:
                places[f"journal {name}"] = handle.read()
    for n in lab.nodes:
        places[f"{n.name} docker.log"] = sh(lab, n.name, "cat /run/lab/docker.log")
        places[f"{n.name} journal"] = sh(lab, n.name, "journalctl --no-pager -o cat 2>/dev/null | tail -n 20000")
        places[f"{n.name} ps"] = sh(lab, n.name, "ps -eww -o args")
        places[f"{n.name} docker inspect"] = sh(lab, n.name, "docker inspect sparkctl-gateway 2>/dev/null; true")
    assert any(k.startswith("bundle") for k in places) and any(k.startswith("journal") for k in places)
    return places


def exporter_samples(inventory: str, env: dict[str, str]) -> list[Sample]:
    """`top --serve-metrics` on a free port: the samples of its first scrape after a refresh."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    top = subprocess.Popen(["sparkctl", "top", inventory, "--json", "--interval", "1", "--serve-metrics",
                            f"127.0.0.1:{port}"], env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        assert top.stdout is not None and '"event": "top"' in top.stdout.readline()
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
            text = response.read().decode()
    finally:
        top.terminate()
        top.wait(timeout=30)
    return [sample for family in text_string_to_metric_families(text) for sample in family.samples]


def summed(samples: list[Sample]) -> dict[str, float]:
    """Each metric's samples added up."""
    sums: dict[str, float] = {}
    for sample in samples:
        sums[sample.name] = sums.get(sample.name, 0.0) + sample.value
    return sums


def ask(served: dict, path: str, body: dict | None = None) -> tuple[int, dict]:
    """A request to the endpoint of a lab that serves (`served`: its "endpoint" and "key"): the status and the JSON
    answer."""
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(served["endpoint"] + path, data=data, headers={
        "Content-Type": "application/json", "Authorization": f"Bearer {served['key']}"})
    try:
        with urllib.request.urlopen(request, timeout=30) as answer:
            return answer.status, json.load(answer)
    except urllib.error.HTTPError as error:
        body = error.read()
        # NGINX's own error page where no world answers (a 502) is not JSON
        return error.code, json.loads(body) if body.startswith(b"{") else {"text": body.decode(errors="replace")}


def chat(served: dict, model: str, max_tokens: int = 2) -> tuple[int, dict]:
    """A chat completion of `model` through the endpoint."""
    return ask(served, "/v1/chat/completions", {"model": model, "max_tokens": max_tokens,
                                                 "messages": [{"role": "user", "content": "who?"}]})
