"""serve.config, serve.launch (check), serve.smoke, failure signatures, and `sparkctl serve presets`."""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from sparkctl.cli.main import cli
from sparkctl.inventory import load_inventory
from sparkctl.knowledge.serve_client import ServeClient
from sparkctl.knowledge.serve_failures import likely_cause
from sparkctl.knowledge.trtllm_releases import VERSION_LABEL
from sparkctl.plan import gateway as gateway_plan
from sparkctl.plan import plan_cluster
from sparkctl.plan.launches import is_our_server
from sparkctl.plan.trtllm import TRTLLM_CONFIG_PATH
from sparkctl.taskgraph.task import Change, TaskFailed
from sparkctl.tasks.options import RunOptions
from sparkctl.tasks.serve.config import ServeConfigTask, desired_launch, refuse_rejected
from sparkctl.tasks.serve.launch import ServeLaunchTask
from sparkctl.tasks.serve.server import STATE_SCRIPT_NAME, ServerHandle
from sparkctl.tasks.serve.smoke import SMOKE_PROMPT, ServeSmokeTask
from sparkctl.transport.base import CommandResult
from sparkctl.transport.framing import Framing
from tests.taskkit import Call, inventory_from_yaml, make_kit, spark_facts
from tests.unit.fake_endpoint import FakeEndpoint
from tests.unit.inventory_kit import TWO_VLLM_WORLDS

SERVE_DIR = "/home/nvidia/.local/state/sparkctl/{cluster}/run/serve"
PAIR = """
user: nvidia
cluster: {{name: duo}}
nodes: [{{name: spark1, host: {head}}}, {{name: spark2, host: 10.0.0.12}}]
container: {{image: "nvcr.io/nvidia/tensorrt-llm/release:{release}"}}
serve:
  preset: qwen3-235b-eagle3
  port: {port}
  {extra}
"""


@pytest.fixture
def endpoint():
    fake = FakeEndpoint()
    yield fake
    fake.close()


@pytest.fixture(autouse=True)
def gateway_on_this_machine(monkeypatch, tmp_path):
    """serve.smoke asks the endpoint through the gateway, on the head's management address: here the fake
    endpoint on this machine's loopback stands where that address would answer (the lab tests the real gateway);
    keys are kept under the test's own state folder."""
    monkeypatch.setattr(gateway_plan, "listen_addresses", lambda inventory, facts: ["127.0.0.1"])
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))


def kit_for(tmp_path, port: int = 8355, release: str = "1.3.0rc12", extra: str = "", head: str = "127.0.0.1",
            engine_port: int | None = None):
    """`port`: the serve port (the gateway's); `engine_port`: the engine's, behind it (default: port + 10000)."""
    if engine_port is not None:
        extra = f"engine_port: {engine_port}\n  {extra}"
    inv = inventory_from_yaml(PAIR.format(port=port, release=release, extra=extra, head=head), tmp_path)
    kit = make_kit(inv, {n.name: spark_facts(n.name) for n in inv.nodes})
    head_execs_here(kit)
    return kit


def head_execs_here(kit, returncode: int | None = None, stderr: str = ""):
    """The head's `docker exec -i <container> sh -c ...` runs here: the container shares the node's network, so
    its 127.0.0.1 is this machine's loopback, where the fake endpoint listens. `returncode`: a failing exec."""
    transport = kit.transport("spark1")

    def exec_in(container, cmd, *, timeout=60.0, input=None, env=None):
        transport.calls.append(Call("exec_in", cmd, input=input))
        if returncode is not None:
            return CommandResult(cmd, returncode, "", stderr)
        proc = subprocess.run(["sh", "-c", cmd], input=input or "", capture_output=True, text=True,
                              timeout=timeout, env={"PATH": "/usr/bin:/bin", "no_proxy": "*"})
        return CommandResult(cmd, proc.returncode, proc.stdout, proc.stderr)

    transport.exec_in = exec_in
    return transport


def test_config_is_written_with_a_diff_and_then_ok(tmp_path):
    kit = kit_for(tmp_path, extra="max_draft_len: 4")
    node, transport = kit.node("spark2"), kit.transport("spark2")
    (change,) = ServeConfigTask().check(node)
    path = SERVE_DIR.format(cluster="duo") + "/extra-llm-api-config.yml"
    assert change.summary == f"create {path}" and "+  max_draft_len: 4" in change.diff
    ServeConfigTask().apply(node, [change])
    assert transport.files[path] == change.carried()[1]
    assert any(c.startswith("mkdir -p ") for c in transport.commands)
    assert ServeConfigTask().check(node) == []


def test_an_override_the_release_rejects_is_refused_before_launch(tmp_path):
    # The tag says 1.3.0rc12, which has the key; a running image whose label says a late 1.3 does not.
    kit = kit_for(tmp_path, extra="config: {disable_flashinfer_sampling: true}")
    inv = kit.cluster.inventory
    launch = plan_cluster(inv).launch.configured(inv, {VERSION_LABEL: "1.3.0rc27"})
    with pytest.raises(TaskFailed) as failure:
        refuse_rejected(launch)
    assert "TensorRT-LLM 1.3.0rc27 would reject: serve.config.disable_flashinfer_sampling: Extra inputs are not " \
        "permitted" in failure.value.message
    assert "judged as 1.3.0rc26" in launch.note
    assert kit.transport("spark1").puts == []


DOCKER_STUB = """#!/bin/sh
# the head's docker: `docker exec C sh -c SCRIPT NAME PID` runs SCRIPT here (the container shares the node's
# network and, for this test, its processes); $DOCKER_FAILS makes every exec fail as a stopped container's does
[ "$1" = exec ] || { echo "stub: only exec" >&2; exit 1; }
if [ -n "$DOCKER_FAILS" ]; then echo "$DOCKER_FAILS" >&2; exit 125; fi
shift 2
exec "$@"
"""


@pytest.fixture
def mpirun():
    """A live process whose command line is our server's mpirun's (what serve.launch recognises by its PID)."""
    proc = subprocess.Popen(["sh", "-c", "sleep 60", "mpirun", "--extra_llm_api_options", TRTLLM_CONFIG_PATH])
    yield proc.pid
    proc.kill()
    proc.wait()


def engine_kit(tmp_path, engine_port: int, serve_port: int | None = None, **kwargs):
    """A kit whose engine answers on `engine_port` (the fake endpoint), the gateway on `serve_port`."""
    return kit_for(tmp_path, port=serve_port or engine_port + 1, engine_port=engine_port, **kwargs)


SYSTEMCTL_STUB = """#!/bin/sh
# the head's systemd: `systemctl show ...` answers the unit's state from $UNIT_STATE (KEY=VALUE lines)
[ "$1" = show ] || { echo "stub: only show" >&2; exit 1; }
printf '%s\\n' "$UNIT_STATE"
"""
ACTIVE = "LoadState=loaded\nActiveState=active\nSubState=running\nUnitFileState=enabled\nNRestarts=0"


def launch_kit(tmp_path, port: int, record: dict | None, alive: int | None = None, head: str = "127.0.0.1",
               nccl: str = "", docker_fails: str = "", path: str = "/usr/bin:/bin", serve_port: int | None = None,
               unit: str = ACTIVE, pid: int | None = None):
    """The head answers serve.launch's state read by running it here: its record, serve.pid and serve log in a
    directory of this test, `docker exec` and `systemctl` stubbed, `alive` the PID of a live mpirun (serve.pid
    names it, else `pid`), `unit` what systemctl shows of the serving unit. `port`: the engine's (the fake
    endpoint's)."""
    kit = engine_kit(tmp_path, port, serve_port, head=head)
    remote = ServerHandle.of(kit.node("spark1")).dir
    here = tmp_path / "head-serve"
    here.mkdir(exist_ok=True)
    (here / "serve.log").write_text(nccl)
    if record is not None:
        (here / "launch.json").write_text(json.dumps(record, indent=1, sort_keys=True) + "\n")
    if alive or pid:
        (here / "serve.pid").write_text(f"{alive or pid}\n")
    bin_dir = tmp_path / "head-bin"
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / "docker").write_text(DOCKER_STUB)
    (bin_dir / "docker").chmod(0o755)
    (bin_dir / "systemctl").write_text(SYSTEMCTL_STUB)
    (bin_dir / "systemctl").chmod(0o755)

    def run_here(script: str) -> str:
        env = {"PATH": f"{bin_dir}:{path}", "no_proxy": "*", "DOCKER_FAILS": docker_fails, "UNIT_STATE": unit}
        return subprocess.run(["/bin/bash", "-c", script.replace(remote, str(here))], capture_output=True, text=True,
                              timeout=60, env=env).stdout

    run_here.wants_script = True  # type: ignore[attr-defined]
    kit.transport("spark1").respond(STATE_SCRIPT_NAME, run_here)
    return kit


def test_launch_check_states(tmp_path, endpoint, mpirun):
    kit = launch_kit(tmp_path, endpoint.port, None)
    (start,) = ServeLaunchTask().check(kit.cluster)
    assert start.summary.startswith("start the server on spark1")
    assert kit.transport("spark1").round_trips == 1  # the record, the PID, /health and the log: one read

    text, command, fingerprint = desired_launch(kit.node("spark1"))
    record = {"fingerprint": fingerprint, "config": text, "command": command, "started": 1.0}
    assert ServeLaunchTask().check(launch_kit(tmp_path, endpoint.port, record, alive=mpirun).cluster) == []

    (gone,) = ServeLaunchTask().check(launch_kit(tmp_path, endpoint.port, record, pid=2 ** 22 + 1).cluster)
    assert f"mpirun (pid {2 ** 22 + 1}) is gone" in gone.summary
    # the unit not running it: stopped (or disabled by `serve stop`), waiting to start again, absent
    for shown, said in (("ActiveState=inactive\nSubState=dead", "inactive (dead)"),
                        ("ActiveState=activating\nSubState=auto-restart", "activating (auto-restart)"),
                        ("LoadState=not-found\nActiveState=inactive", "absent")):
        (start,) = ServeLaunchTask().check(launch_kit(tmp_path, endpoint.port, record, alive=mpirun,
                                                      unit=shown).cluster)
        assert start.summary == f"start the server on spark1: its unit sparkctl-serve-duo.service is {said}"
    (stopped,) = ServeLaunchTask().check(launch_kit(tmp_path, endpoint.port, record, alive=mpirun,
                                                    docker_fails="Error: container abc is not running").cluster)
    assert "is gone (its log: run/serve/serve.log; docker exec: Error: container abc is not running)" in \
        stopped.summary

    old = dict(record, fingerprint="0" * 16, config=text.replace("max_draft_len: 3", "max_draft_len: 5"))
    (changed,) = ServeLaunchTask().check(launch_kit(tmp_path, endpoint.port, old, alive=mpirun).cluster)
    assert "config or launch line changed" in changed.summary
    assert "-  max_draft_len: 5" in changed.diff and "+  max_draft_len: 3" in changed.diff

    endpoint.health = 503
    (sick,) = ServeLaunchTask().check(launch_kit(tmp_path, endpoint.port, record, alive=mpirun).cluster)
    assert "/health answers 503" in sick.summary
    endpoint.close()
    (silent,) = ServeLaunchTask().check(launch_kit(tmp_path, endpoint.port, record, alive=mpirun).cluster)
    assert "/health answers nothing (URLError: [Errno 111] Connection refused)" in silent.summary


def nccl_log(fixture: str) -> str:
    return (Path(__file__).resolve().parents[1] / "fixtures" / "nccl-2.28.9" / fixture).read_text()


def test_a_healthy_server_that_nccl_started_on_sockets_is_restarted_while_rdma_is_up(tmp_path, endpoint, mpirun):
    """NCCL chooses its network once, when the server starts: a server that fell back to sockets (its devices not
    ready then, or NCCL_IB_HCA naming none) stays on them, healthy, until restarted. doctor names it
    (nccl.socket_fallback) and names serve among its repairs: so serve.launch must restart it."""
    text, command, fingerprint = desired_launch(engine_kit(tmp_path, endpoint.port).node("spark1"))
    record = {"fingerprint": fingerprint, "config": text, "command": command}
    kit = launch_kit(tmp_path, endpoint.port, record, alive=mpirun, nccl=nccl_log("ib_hca_missing.log"))
    (restart,) = ServeLaunchTask().check(kit.cluster)
    assert restart.summary == ("restart the server on spark1: NCCL runs over TCP sockets though RoCE devices are "
                               "Up (rocep1s0f1, roceP2p1s0f1; it chose its network when it started)")
    # sockets by choice (IB disabled), or no RDMA device Up: nothing to restart for
    kit = launch_kit(tmp_path, endpoint.port, record, alive=mpirun, nccl=nccl_log("socket_lo.log"))
    assert ServeLaunchTask().check(kit.cluster) == []


def test_a_healthy_server_the_controller_cannot_route_to_converges(tmp_path, endpoint, mpirun):
    """The inventory host (an ssh_config alias, a host behind a jump host) answers nothing from here: /health
    is asked on the head, so a healthy server is ok, not restarted on every run."""
    gateway = FakeEndpoint()  # what answers on the head's address: the gateway, in front of the engine
    kit = engine_kit(tmp_path, endpoint.port, gateway.port, head="127.0.0.2")  # the fakes listen on 127.0.0.1 only
    text, command, fingerprint = desired_launch(kit.node("spark1"))
    record = {"fingerprint": fingerprint, "config": text, "command": command}
    kit = launch_kit(tmp_path, endpoint.port, record, alive=mpirun, head="127.0.0.2", serve_port=gateway.port)
    assert ServeLaunchTask().check(kit.cluster) == []
    assert ServeSmokeTask().check(kit.cluster) == []
    messages = [e.message for e in kit.events if e.task == "serve.smoke"]
    assert "acceptance length 2.50" in messages[0] and "on spark1" in messages[0]
    assert "http://127.0.0.2:" in messages[1] and "does not answer from this machine" in messages[1]
    chat = [c for c in kit.transport("spark1").calls if c.kind == "exec_in" and c.input]
    assert chat and SMOKE_PROMPT in chat[-1].input and SMOKE_PROMPT not in chat[-1].target  # stdin, not argv
    assert gateway.requests and not endpoint.requests  # the smoke test asked through the gateway
    gateway.close()


def test_a_python_that_warns_on_stderr_still_reads_health(tmp_path, endpoint, mpirun):
    text, command, fingerprint = desired_launch(engine_kit(tmp_path, endpoint.port).node("spark1"))
    record = {"fingerprint": fingerprint, "config": text, "command": command}
    noisy = tmp_path / "noisy-python"
    noisy.mkdir()
    (noisy / "python3").write_text(f"#!/bin/sh\necho 'Could not find platform libraries' >&2\n"
                                   f"exec {shutil.which('python3')} \"$@\"\n")
    (noisy / "python3").chmod(0o755)
    kit = launch_kit(tmp_path, endpoint.port, record, alive=mpirun, path=f"{noisy}:/usr/bin:/bin")
    assert ServeLaunchTask().check(kit.cluster) == []


def test_a_state_read_that_times_out_fails_instead_of_restarting_a_server_not_known_down(tmp_path, endpoint):
    kit = launch_kit(tmp_path, endpoint.port, None)
    head = kit.transport("spark1")
    head.run = lambda cmd, **_kw: CommandResult(cmd, -1, "", "", timed_out=True)
    with pytest.raises(TaskFailed, match="reading the server's state on spark1 timed out after 30 s") as err:
        ServeLaunchTask().check(kit.cluster)
    assert "docker ps" in err.value.hint


def test_the_head_probe_failing_is_said_clearly(tmp_path, endpoint, mpirun):
    text, command, fingerprint = desired_launch(engine_kit(tmp_path, endpoint.port).node("spark1"))
    record = {"fingerprint": fingerprint, "config": text, "command": command}
    # a container without python3 (the probe asks /health with it)
    bare = tmp_path / "no-python"
    bare.mkdir()
    for tool in ("sh", "cat", "sed", "head", "tail", "grep", "tr"):
        (bare / tool).symlink_to(shutil.which(tool))
    kit = launch_kit(tmp_path, endpoint.port, record, alive=mpirun, path=str(bare))
    (change,) = ServeLaunchTask().check(kit.cluster)
    assert "answers nothing" in change.summary and "cannot run python3 in the container" in change.summary
    assert "python3: not found" in change.summary
    head_execs_here(kit, returncode=1, stderr="Error response from daemon: container abc is not running")
    with pytest.raises(TaskFailed, match="cannot run python3 in the container trtllm-multinode on spark1"):
        ServeSmokeTask().check(kit.cluster)


CONTAINER_ID = "c0ffee" + "0" * 58


def fake_proc(root, processes: dict[int, tuple[str, str, str]]):
    """A /proc of `processes`: host PID -> (its cgroup, its NSpid line's PIDs, its command line)."""
    for host_pid, (cgroup, nspid, cmdline) in processes.items():
        d = root / str(host_pid)
        d.mkdir(parents=True)
        (d / "cgroup").write_text(cgroup + "\n")
        (d / "status").write_text(f"Name:\tx\nPid:\t{host_pid}\nNSpid:\t{nspid}\nThreads:\t1\n")
        (d / "cmdline").write_bytes(cmdline.replace(" ", "\0").encode() + b"\0")


def test_the_server_s_command_line_and_health_are_read_by_the_node_itself(tmp_path, endpoint):
    """The node sees the container's processes: serve.pid's PID is the one whose NSpid ends in it inside the
    container's cgroup (the same PID in another container is not it), and /health is asked on bash's own TCP
    connection: no `docker exec`."""
    from sparkctl.tasks.serve.server import find_server, host_reads

    proc = tmp_path / "proc"
    ours = f"0::/system.slice/docker-{CONTAINER_ID}.scope"
    fake_proc(proc, {4000: (ours, "4000\t1", "/bin/sh /entrypoint.sh"),
                     4100: ("0::/system.slice/docker-0ther.scope", "4100\t57", "mpirun --not-ours"),
                     4200: (ours, "4200\t57", f"mpirun -np 2 trtllm-llmapi-launch trtllm-serve serve m "
                                              f"--extra_llm_api_options {TRTLLM_CONFIG_PATH}")})
    framing = Framing("n")

    def read(pid: str, port: int) -> dict:
        found = find_server(CONTAINER_ID).replace("/proc/", f"{proc}/")
        script = f'_pid={pid}\n{found}\nif [ -n "$_found" ]; then\n{host_reads(framing, "127.0.0.1", port)}\nfi'
        out = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=30)
        return framing.split(out.stdout)

    found = read("57", endpoint.port)
    assert found["cmdline"].ok and is_our_server(found["cmdline"].output)
    assert "trtllm-serve" in found["cmdline"].output and "--not-ours" not in found["cmdline"].output
    assert found["health"].output.strip() == "200"
    assert "cmdline" not in read("58", endpoint.port)  # gone: the docker exec has the last word
    assert "cmdline" not in read("", endpoint.port)    # serve.pid empty
    endpoint.health = 503
    assert read("57", endpoint.port)["health"].output.strip() == "503"
    endpoint.close()
    assert read("57", endpoint.port)["health"].output.startswith(f"0\nnothing answers on 127.0.0.1:{endpoint.port}")


def test_the_state_read_asks_docker_only_where_the_node_cannot_see_the_container_s_processes(tmp_path):
    from sparkctl.facts.model import ContainerInfo

    kit = kit_for(tmp_path)
    handle = ServerHandle.of(kit.node("spark1"))
    seen = ContainerInfo("trtllm-multinode", exists=True, running=True, id=CONTAINER_ID, pid=4000)
    script = handle.state_script(18355, Framing("n"), container=seen)
    # /proc/<its first process> readable: read here; hidden (hidepid): the one `docker exec` as before
    assert "if [ -r /proc/4000/status ]; then" in script and "/dev/tcp/127.0.0.1/18355" in script
    # the server not found there (gone, or hidden after all): the docker exec says what it knows
    assert script.index("/dev/tcp/") < script.index("else\n{ _e=$(docker exec trtllm-multinode")
    for unseen in (None, ContainerInfo("trtllm-multinode", exists=True, running=False, id=CONTAINER_ID),
                   ContainerInfo("trtllm-multinode", exists=True, running=True, id=CONTAINER_ID),
                   ContainerInfo("trtllm-multinode", exists=True, running=True, id="$(reboot)", pid=4000)):
        script = handle.state_script(18355, Framing("n"), container=unseen)
        assert "/dev/tcp/" not in script and "docker exec trtllm-multinode" in script


def test_smoke_passes_and_reports_acceptance(tmp_path, endpoint):
    kit = kit_for(tmp_path, port=endpoint.port)
    assert ServeSmokeTask().check(kit.cluster) == []
    (log,) = [e for e in kit.events if e.task == "serve.smoke"]  # reachable from here: no second note
    assert "acceptance length 2.50" in log.message and log.data["smoke"]["reachable_from_here"]
    assert endpoint.requests[-1]["model"] == "nvidia/Qwen3-235B-A22B-FP4"


def test_smoke_asks_from_here_when_this_machine_reaches_the_endpoint_else_on_the_head(tmp_path, endpoint,
                                                                                     monkeypatch):
    """Reached from here, the chat goes from here (the gateway, the key, as a user meets them): the head runs no
    `docker exec` for it. Not reached from here, it is asked on the head, inside its container, as before."""
    kit = kit_for(tmp_path, port=endpoint.port)
    assert ServeSmokeTask().check(kit.cluster) == []
    (log,) = [e for e in kit.events if e.task == "serve.smoke"]
    assert log.message.startswith(f"http://127.0.0.1:{endpoint.port} answered") and "acceptance length" in log.message
    assert not [c for c in kit.transport("spark1").calls if c.kind == "exec_in"]
    monkeypatch.setattr(ServeClient, "reach", lambda self, timeout=5.0: (0, "connection refused", False))
    kit = kit_for(tmp_path, port=endpoint.port)
    assert ServeSmokeTask().check(kit.cluster) == []
    asked = [c for c in kit.transport("spark1").calls if c.kind == "exec_in"]
    assert asked and "/v1/chat/completions" in asked[0].input
    smoke = [e.message for e in kit.events if e.task == "serve.smoke"]
    assert smoke[0].endswith("acceptance length 2.50") and " on spark1 answered " in smoke[0]
    assert "does not answer from this machine (connection refused)" in smoke[1]


def test_smoke_asked_early_from_here_counts_when_nothing_changed_since(tmp_path, endpoint):
    """Asked as the run begins (tasks/early.py), the completion is the one the check reports: no second one."""
    kit = kit_for(tmp_path, port=endpoint.port)
    kit.cluster.options = RunOptions(verbosity=1)
    ServeSmokeTask().ask_early(kit.cluster)
    assert ServeSmokeTask().check(kit.cluster) == []
    assert len(endpoint.requests) == 1
    (log,) = [e for e in kit.events if e.task == "serve.smoke"]
    assert log.message.startswith(f"http://127.0.0.1:{endpoint.port} answered") and "acceptance length" in log.message
    assert log.data["smoke"]["reachable_from_here"]
    assert "serve.smoke: asked from here as the run began" in [e.message for e in kit.events]


def test_smoke_asked_early_is_asked_again_once_a_change_was_applied(tmp_path, endpoint):
    from sparkctl.taskgraph.events import Event

    kit = kit_for(tmp_path, port=endpoint.port)
    ServeSmokeTask().ask_early(kit.cluster)
    deadline = time.monotonic() + 30
    while not endpoint.requests and time.monotonic() < deadline:
        time.sleep(0.01)
    assert len(endpoint.requests) == 1  # answered early
    kit.cluster.note(Event("task_changes", task="serve.unit", node="spark1"))
    assert ServeSmokeTask().check(kit.cluster) == []
    assert len(endpoint.requests) == 2  # and asked again after the change
    assert "serve.smoke: asked from here as the run began" not in [e.message for e in kit.events]


def test_smoke_is_asked_early_only_from_here(tmp_path, endpoint, monkeypatch):
    """Not reached from here, nothing is asked early (the head runs no `docker exec` beside the other tasks): the
    check asks on the head at its turn, as before."""
    monkeypatch.setattr(ServeClient, "reach", lambda self, timeout=5.0: (0, "connection refused", False))
    kit = kit_for(tmp_path, port=endpoint.port)
    ServeSmokeTask().ask_early(kit.cluster)
    assert kit.cluster.early.take("serve.smoke") is None
    assert not [c for c in kit.transport("spark1").calls if c.kind == "exec_in"] and not endpoint.requests
    ServeSmokeTask().ask_early(kit.cluster)
    assert ServeSmokeTask().check(kit.cluster) == []
    assert len([c for c in kit.transport("spark1").calls if c.kind == "exec_in"]) == 1
    assert len(endpoint.requests) == 1


def test_a_smoke_asked_early_whose_request_failed_from_here_is_asked_on_the_head_at_once(tmp_path, endpoint,
                                                                                          monkeypatch):
    """This machine's route failed the early ask (a proxy that hangs up): at its turn the check asks on the head,
    as a failed ask from here always is, without trying from here (and waiting out its time limit) a second time."""
    from sparkctl.knowledge.serve_client import EndpointError, HttpFetch

    tries: list[object] = []

    def refused(self, requests):
        tries.append(requests)
        raise EndpointError("the proxy hung up")

    monkeypatch.setattr(HttpFetch, "batch", refused)
    kit = kit_for(tmp_path, port=endpoint.port)
    ServeSmokeTask().ask_early(kit.cluster)
    assert ServeSmokeTask().check(kit.cluster) == []
    assert len(tries) == 1
    (log,) = [e for e in kit.events if e.task == "serve.smoke"]
    assert " on spark1 answered " in log.message and log.message.endswith("acceptance length 2.50")
    assert len([c for c in kit.transport("spark1").calls if c.kind == "exec_in"]) == 1


def test_a_smoke_asked_early_that_failed_is_asked_again_and_fails_on_its_own(tmp_path, endpoint):
    endpoint.reply = "!!!!!!!!!!!!!!!!"
    kit = kit_for(tmp_path, port=endpoint.port)
    ServeSmokeTask().ask_early(kit.cluster)
    with pytest.raises(TaskFailed) as failure:
        ServeSmokeTask().check(kit.cluster)
    assert "one repeated character" in failure.value.message and "#8615" in failure.value.hint
    assert len(endpoint.requests) == 2


def test_an_endpoint_that_connects_and_answers_late_is_reached_from_here(tmp_path, endpoint, monkeypatch):
    """The route is the connection: a loaded head, or a gateway's new workers still starting, answer /health later
    than the connection takes, and the chat still goes from here. No route costs only the connection's bound."""
    from sparkctl.tasks.serve import smoke

    monkeypatch.setattr(smoke, "REACH_TIMEOUT", 0.2)
    endpoint.health_delay = 0.6
    kit = kit_for(tmp_path, port=endpoint.port)
    assert ServeSmokeTask().check(kit.cluster) == []
    (log,) = [e for e in kit.events if e.task == "serve.smoke"]
    assert log.data["smoke"]["reachable_from_here"] and log.message.startswith(f"http://127.0.0.1:{endpoint.port} ")
    fetch = smoke.endpoint_fetch(kit.cluster.inventory, None)
    endpoint.close()  # nothing listens there now: refused at once
    status, why, refused = ServeSmokeTask._reach(fetch)
    assert status == 0 and "refused" in why.lower() and not refused


def test_a_chat_from_here_that_fails_is_asked_again_on_the_head(tmp_path, endpoint, monkeypatch):
    """This machine's route to the endpoint (a proxy, a VPN that drops) must not count against the server."""
    from sparkctl.knowledge.serve_client import EndpointError, HttpFetch

    def refused(self, requests):
        raise EndpointError("the proxy hung up")

    monkeypatch.setattr(HttpFetch, "batch", refused)
    kit = kit_for(tmp_path, port=endpoint.port)
    assert ServeSmokeTask().check(kit.cluster) == []
    (log,) = [e.message for e in kit.events if e.task == "serve.smoke"]
    assert " on spark1 answered " in log and log.endswith("acceptance length 2.50")
    assert [c for c in kit.transport("spark1").calls if c.kind == "exec_in"]


def test_smoke_asks_health_only_when_a_request_failed(tmp_path, endpoint):
    """serve.launch has just seen /health answer 200: a smoke test that passes costs no extra exec for it."""
    kit = kit_for(tmp_path, port=endpoint.port)
    assert ServeSmokeTask().check(kit.cluster) == []
    assert not [c for c in kit.transport("spark1").calls if c.kind == "exec_in" and "/health" in c.target]
    endpoint.close()
    with pytest.raises(TaskFailed, match="/health answers nothing"):
        ServeSmokeTask().check(kit_for(tmp_path, port=endpoint.port).cluster)


def test_smoke_fails_on_degenerate_output_with_the_8615_hint(tmp_path, endpoint):
    endpoint.reply = "!!!!!!!!!!!!!!!!"
    with pytest.raises(TaskFailed) as failure:
        ServeSmokeTask().check(kit_for(tmp_path, port=endpoint.port).cluster)
    assert "one repeated character" in failure.value.message and "#8615" in failure.value.hint


def test_smoke_fails_when_nothing_answers(tmp_path):
    fake = FakeEndpoint()
    port = fake.port
    fake.close()
    with pytest.raises(TaskFailed, match="/health answers nothing"):
        ServeSmokeTask().check(kit_for(tmp_path, port=port).cluster)


@pytest.mark.parametrize("lines, cause", [
    (["pydantic_core._pydantic_core.ValidationError: 1 validation error for TorchLlmArgs", "use_torch_sampler",
      "  Extra inputs are not permitted [type=extra_forbidden]"], "unknown config key"),
    (["torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB"], "out of memory"),
    (["ERROR:    [Errno 98] error while attempting to bind on address ('0.0.0.0', 8355): address already in use"],
     "port in use"),
    (["spark1:1:1 [0] NCCL WARN Bootstrap : no socket interface found"], "NCCL"),
    (["OSError: nvidia/x does not appear to have the files *.safetensors in /snap"], "missing model files"),
    (["ORTE was unable to reliably start one or more daemons."], "MPI start-up"),
    (["RuntimeError: CUDA error: no kernel image is available for execution on the device",
      "CUDA kernel errors might be asynchronously reported at some other API call"], "no kernels for this GPU"),
])
def test_failure_signatures(lines, cause):
    found = likely_cause(lines)
    assert found is not None and found[0] == cause
    if cause == "unknown config key":
        assert "`use_torch_sampler` is not accepted" in found[1]
    assert likely_cause(["INFO: all good"]) is None


def test_serve_presets_lists_every_preset_and_variant():
    result = CliRunner().invoke(cli, ["serve", "presets"])
    assert result.exit_code == 0, result.output
    for name in ("qwen3-235b-eagle3", "gpt-oss-120b-eagle3", "llama-3.3-70b-draft-target", ":long-context", ":v3"):
        assert name in result.output


def test_serve_status_and_stop_without_a_reachable_head(tmp_path, monkeypatch):
    """Nodes that refuse on loopback: one line each, no traceback; status says the head is not reachable."""
    import socket

    with socket.socket() as sock, socket.socket() as other:
        sock.bind(("127.0.0.1", 0))
        other.bind(("127.0.0.1", 0))
        port, serve_port = sock.getsockname()[1], other.getsockname()[1]
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    path = tmp_path / "inventory.yaml"
    path.write_text(f"""cluster: {{name: t}}
user: nvidia
ssh: {{known_hosts: {tmp_path}/known_hosts, use_ssh_config: false, connect_timeout: 2, port: {port}}}
nodes: [{{name: spark1, host: 127.0.0.1}}, {{name: spark2, host: 127.0.0.2}}]
serve: {{preset: qwen3-235b-eagle3, port: {serve_port}}}
""")
    status = CliRunner().invoke(cli, ["serve", "status", str(path)])
    assert status.exit_code == 1, status.output
    assert "not reachable over ssh" in status.output and "asked from here" in status.output
    assert "Traceback" not in status.output
    stop = CliRunner().invoke(cli, ["serve", "stop", str(path)])
    assert stop.exit_code == 3 and "cannot stop the server" in stop.output, stop.output


def test_a_world_whose_state_cannot_be_read_does_not_keep_another_from_starting(inv_file, monkeypatch):
    """Two worlds: the second's state read fails (a hung docker on its head); the first, which needs starting, is
    still started, and the failure is met again by the check after it (a dry run fails at once)."""
    inv = load_inventory(inv_file(TWO_VLLM_WORLDS))
    kit = make_kit(inv, {n.name: spark_facts(n.name) for n in inv.nodes})

    def check_world(_task, world):
        if world.inventory.world_key:
            raise TaskFailed("reading the server's state on spark2 timed out after 30 s")
        return [Change("start the server on spark1: Qwen/Qwen3-8B", node="spark1")]

    monkeypatch.setattr(ServeLaunchTask, "_check_world", check_world)
    (start,) = ServeLaunchTask().check(kit.cluster)
    assert (start.payload, start.node) == ("", "spark1")
    monkeypatch.setattr(ServeLaunchTask, "_check_world", lambda _task, world: check_world(_task, world)
                        if world.inventory.world_key else [])
    with pytest.raises(TaskFailed, match="on spark2 timed out"):
        ServeLaunchTask().check(kit.cluster)
    dry = make_kit(inv, {n.name: spark_facts(n.name) for n in inv.nodes}, RunOptions(check=True))
    monkeypatch.setattr(ServeLaunchTask, "_check_world", check_world)
    with pytest.raises(TaskFailed, match="on spark2 timed out"):
        ServeLaunchTask().check(dry.cluster)
