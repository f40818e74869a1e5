"""A lab that serves, as the serve-phase doctor tests and the controller-fault tests both seed it: the serve
section, the fake token, where the draft lands, and the faults seeded on it (the server killed on the head...)."""

from __future__ import annotations

import shlex
import time

from sparkctl.inventory import load_inventory
from sparkctl.runs.serve_ops import connected, server_handle
from sparkctl.tasks.serve.server import head_client
from tests.lab.conftest import poll
from tests.lab.doctor_kit import Seed
from tests.lab.lab_kit import CONTAINER

TOKEN = "hf_LabDoctorToken7c1e9a2b4d6f8a0c3e5b"
SERVE = {"preset": "qwen3-235b-eagle3", "fit_check": "warn"}
HF = "/home/nvidia/.cache/huggingface"
DRAFT = f"{HF}/sparkctl-models/nvidia--Qwen3-235B-A22B-Eagle3"


def kill_server(lab, node: str) -> None:
    """The server and its launcher gone from the head (an OOM kill, a reboot of the container's processes)."""
    result = lab.exec(node, f"docker exec {CONTAINER} pkill -KILL -f 'trtllm-serve|trtllm-llmapi-launch|mpirun'")
    assert result.returncode == 0, result.stderr
    wait = lab.exec(node, "for i in $(seq 1 300); do ss -ltnH 'sport = :18355' | grep -q . || exit 0; sleep 0.2; done; "
                          "exit 1")
    assert wait.returncode == 0, "the engine's port is still taken"


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
    container, then the server started the way sparkctl starts it (its launch record kept current), by hand: a
    bootstrap would see the fallback and restart it at once."""
    kill_server(lab, node)
    for name in ("spark1", "spark2"):  # and the worker rank its mpirun left behind
        result = lab.exec(name, f"docker exec {CONTAINER} sh -c 'mkdir -p /run/lab && "
                                "echo nccl-ib-late >> /run/lab/standin-faults' && "
                                f"{{ docker exec {CONTAINER} pkill -KILL -f 'trtllm-serve|trtllm-llmapi'; true; }}")
        assert result.returncode == 0, result.stderr
    inventory = load_inventory(lab.serve_inventory)
    with connected(inventory, node) as transport:
        handle = server_handle(inventory, transport)
        record = handle.read_record()
        pid = handle.launch(record["command"], record["fingerprint"])
        handle.write_record({**record, "pid": pid, "started": time.time()})
        client = head_client(transport, inventory)
        assert poll(lambda: client.health_detail()[0] == 200, timeout=180, interval=1), handle.tail(20)


SEEDS = [
    Seed("model-absent", "model.absent", "spark2", f"rm -rf {DRAFT}"),
    Seed("model-incomplete", "model.incomplete", "spark2", interrupt_download),
    Seed("token-missing", "hf.token_missing", "spark1", f"rm -f {HF}/token; rm -rf {DRAFT}",
         also=frozenset({("model.absent", "spark1")})),
    Seed("serve-down", "serve.down", "spark1", kill_server),
    Seed("serve-hung", "serve.health", "spark1", hang_server),
    # stopped by hand: its restart policy leaves it stopped, and the endpoint answers on no address
    Seed("gateway-stopped", "serve.gateway_down", "spark1", "docker stop -t 0 sparkctl-gateway"),
    # the serve log is the head's: NCCL's lines of every rank are there
    Seed("nccl-socket-fallback", "nccl.socket_fallback", "spark1", start_on_sockets),
]
