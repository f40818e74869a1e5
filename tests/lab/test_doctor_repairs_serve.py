"""The serve phase's repairable doctor findings, seeded on one shared lab pair that serves (the qwen3-235b-eagle3
preset through the lab's TensorRT-LLM stand-in): doctor names each on its node, `doctor --fix` repairs it (healthy
after), a bootstrap rerun then changes nothing; seeded again, a plain bootstrap rerun repairs it, doctor is healthy
and the next rerun changes nothing. (tests/lab/test_doctor_repairs.py: the rest, on a pair that does not serve.)
"""

from __future__ import annotations

import os
import shlex
import time

import pytest
import yaml

from sparkctl.inventory import load_inventory
from sparkctl.runs.serve_ops import connected, server_handle
from sparkctl.tasks.serve.server import head_client
from tests.lab.conftest import poll
from tests.lab.doctor_kit import CONTAINER, Seed, bootstrap, changed, doctor, failed, problems
from tests.lab.serve_kit import DRAFT, HF, SERVE, TOKEN, kill_server

pytestmark = pytest.mark.lab

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


@pytest.fixture(scope="module")
def env(tmp_path_factory) -> dict[str, str]:
    return {**os.environ, "HF_TOKEN": TOKEN, "XDG_STATE_HOME": str(tmp_path_factory.mktemp("doctor-serve-state"))}


@pytest.fixture(scope="module")
def served(lab_factory, env, tmp_path_factory):
    lab = lab_factory(2, "pair", port=1)
    document = yaml.safe_load(lab.inventory_path.read_text())
    document["serve"] = SERVE
    # NCCL says in the serve log which network it chose (nccl.socket_fallback is read there)
    document.setdefault("container", {}).setdefault("env", {})["NCCL_DEBUG"] = "INFO"
    path = tmp_path_factory.mktemp("inv") / "serve.yaml"
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    lab.serve_inventory = str(path)
    lab.serve_env = env
    code, events = bootstrap(lab, env=env, inventory=lab.serve_inventory)
    assert code == 0, failed(events)
    healthy = doctor(lab, env=env, inventory=lab.serve_inventory)
    assert healthy["healthy"], healthy["findings"]
    lab.baseline = problems(healthy)
    assert {i for i, _ in lab.baseline} <= {"fabric.speed_low"}, lab.baseline
    return lab


def look(lab, env, *args: str) -> dict:
    return doctor(lab, *args, env=env, inventory=lab.serve_inventory)


def seen(lab, report: dict) -> set[tuple[str, str]]:
    """Beyond the healthy lab's own: and while a Qwen3-235B checkpoint is missing, a lab disk smaller than one
    rightly warns (disk.hf_cache_low, a person's); that warning is no part of the seeded fault."""
    return {p for p in problems(report) - lab.baseline if p[0] != "disk.hf_cache_low"}


def rerun(lab, env) -> tuple[int, list]:
    return bootstrap(lab, env=env, inventory=lab.serve_inventory)


@pytest.fixture
def restore(served, env, request):
    """A case that fails leaves the lab repaired for the next one."""
    yield
    if getattr(request.node, "failed_call", False):
        rerun(served, env)


@pytest.mark.parametrize("seed", SEEDS, ids=[s.name for s in SEEDS])
def test_doctor_fix_repairs_it_and_a_rerun_changes_nothing(served, env, restore, seed):
    seed.seed(served)
    report = look(served, env)
    assert seen(served, report) == {(seed.finding, seed.node), *seed.also}, report["findings"]
    fixed = look(served, env, "--fix")
    assert fixed["fix"]["ran"] and fixed["fix"]["exit_status"] == 0, fixed["fix"]
    assert fixed["healthy"] and seen(served, fixed) == set(), fixed["findings"]
    code, events = rerun(served, env)
    assert code == 0 and changed(events) == set(), (changed(events), failed(events))


@pytest.mark.parametrize("seed", SEEDS, ids=[s.name for s in SEEDS])
def test_a_bootstrap_rerun_repairs_it_and_the_next_changes_nothing(served, env, restore, seed):
    seed.seed(served)
    assert (seed.finding, seed.node) in seen(served, look(served, env))
    code, events = rerun(served, env)
    assert code == 0 and changed(events), (changed(events), failed(events))
    after = look(served, env)
    assert after["healthy"] and seen(served, after) == set(), after["findings"]
    code, events = rerun(served, env)
    assert code == 0 and changed(events) == set(), (changed(events), failed(events))
