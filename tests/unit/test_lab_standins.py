"""The lab's stand-in scripts, run as real processes (fake podman, temp sysfs, temp HF cache)."""

from __future__ import annotations

import importlib.machinery
import importlib.util
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from sparkctl.lab import image
from sparkctl.lab.standins import IMAGE_STANDINS, NODE_STANDINS, fixture_repos_dir, standin_path
from tests.unit.hf_kit import moved_main

SYSTEM_PYTHON = "/usr/bin/python3"  # the interpreter the stand-ins' shebangs name (has mpi4py on a lab machine)


def run(name, *args, env=None, check=False, **kwargs):
    merged = {**os.environ, **(env or {})}
    result = subprocess.run(
        [str(standin_path(name)), *args], env=merged, capture_output=True, text=True, timeout=30, **kwargs
    )
    if check:
        assert result.returncode == 0, result.stderr
    return result


def load_script(name):
    loader = importlib.machinery.SourceFileLoader(name.replace("-", "_"), str(standin_path(name)))
    spec = importlib.util.spec_from_loader(loader.name, loader)
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


def test_every_standin_is_executable_and_says_it_is_a_stand_in():
    for name in (*NODE_STANDINS, *IMAGE_STANDINS, "sparkctl-lab-entrypoint"):
        path = standin_path(name)
        assert os.access(path, os.X_OK), path
        assert "stand-in" in path.read_text()[:600], path


# --- docker -------------------------------------------------------------------------------------------
@pytest.fixture
def fake_podman(tmp_path):
    daemon = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)  # the daemon's socket answering
    daemon.bind(str(tmp_path / "docker.sock"))
    daemon.listen(64)
    calls = tmp_path / "podman-calls.jsonl"
    script = tmp_path / "podman"
    script.write_text(
        f"#!{sys.executable}\nimport json, sys\n"
        f"open({str(calls)!r}, 'a').write(json.dumps(sys.argv[1:]) + '\\n')\n"
    )
    script.chmod(0o755)
    log_dir = tmp_path / "run-lab"
    log_dir.mkdir(mode=0o1777)
    log_dir.chmod(0o1777)
    env = {"SPARKCTL_LAB_PODMAN": str(script), "SPARKCTL_LAB_DOCKER_LOG": str(log_dir / "docker.log"),
           "SPARKCTL_LAB_DOCKER_SOCKET": str(tmp_path / "docker.sock")}

    def podman_calls():
        return [json.loads(line) for line in calls.read_text().splitlines()] if calls.exists() else []

    yield env, podman_calls, log_dir / "docker.log"
    daemon.close()


def test_docker_without_its_daemon_fails_as_docker_does(fake_podman, tmp_path):
    env, podman_calls, _ = fake_podman
    result = run("docker", "ps", env={**env, "SPARKCTL_LAB_DOCKER_SOCKET": str(tmp_path / "stopped.sock")})
    assert result.returncode == 1
    # the docker CLI's message (docker/cli: client.ErrorConnectionFailed)
    assert result.stderr == ("Cannot connect to the Docker daemon at unix:///var/run/docker.sock. "
                             "Is the docker daemon running?\n")
    assert podman_calls() == []


#: podman as its `system service` meets a socket systemd activated: LISTEN_PID its own pid, LISTEN_FDS=1, the listening
#: socket as fd 3 (sd_listen_fds(3)); it answers each connection with what it was asked and the command it ran as
FAKE_API = """#!/usr/bin/python3
import os, socket, sys
assert sys.argv[1:] == ["system", "service", "--time=0"], sys.argv
assert os.environ["LISTEN_FDS"] == "1" and os.environ["LISTEN_PID"] == str(os.getpid()), os.environ
server = socket.socket(fileno=3)
assert server.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN) == 1
while True:
    conn, _ = server.accept()
    conn.sendall(b"api: " + conn.recv(100))
    conn.close()
"""


def test_dockerd_holds_its_socket_while_it_runs_and_removes_it_when_stopped(tmp_path):
    """...and what answers there is podman's Engine API, handed the socket as systemd's activation does."""
    path, podman = tmp_path / "docker.sock", tmp_path / "podman"
    podman.write_text(FAKE_API)
    podman.chmod(0o755)
    daemon = subprocess.Popen([str(standin_path("dockerd"))],
                              env={**os.environ, "SPARKCTL_LAB_DOCKER_SOCKET": str(path),
                                   "SPARKCTL_LAB_PODMAN": str(podman),
                                   "SPARKCTL_LAB_DOCKER_STOPPED_DIR": str(tmp_path / "stopped")})
    try:
        deadline = time.monotonic() + 10
        while not path.exists() and time.monotonic() < deadline:
            time.sleep(0.02)
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as client:
            client.settimeout(10)
            client.connect(str(path))
            client.sendall(b"GET /_ping")
            assert client.recv(100) == b"api: GET /_ping"
        assert oct(path.stat().st_mode & 0o777) == "0o660"
    finally:
        daemon.terminate()
        assert daemon.wait(10) == 0
    assert not path.exists()
    # the API's own command line (the restart-policy thread's `podman ps` may still be starting as it goes)
    api = subprocess.run(["pgrep", "-f", f"{podman} system service"], capture_output=True)
    assert api.returncode == 1, "the API outlived it"


def test_docker_remembers_a_hand_stop_until_the_container_is_started_again(fake_podman, tmp_path):
    env, _, _ = fake_podman
    stopped = tmp_path / "stopped-by-user"
    stopped.mkdir()
    env = {**env, "SPARKCTL_LAB_DOCKER_STOPPED_DIR": str(stopped)}
    run("docker", "stop", "-t", "0", "web", "db", env=env, check=True)
    assert sorted(p.name for p in stopped.iterdir()) == ["db", "web"]
    run("docker", "start", "web", env=env, check=True)
    run("docker", "run", "-d", "--name", "db", "img", env=env, check=True)  # a new container of that name
    assert list(stopped.iterdir()) == []
    run("docker", "kill", "web", env=env, check=True)
    run("docker", "rm", "-f", "web", env=env, check=True)
    assert list(stopped.iterdir()) == []


def test_dockerd_starts_what_the_restart_policies_bring_back(tmp_path):
    """always: started; unless-stopped: started unless stopped by hand; no, or already running: left alone."""
    containers = {"a1": ("always", "exited"), "u1": ("unless-stopped", "exited"), "u2": ("unless-stopped", "exited"),
                  "n1": ("no", "exited"), "r1": ("unless-stopped", "running"), "h1": ("always", "exited")}
    calls = tmp_path / "calls"
    script = tmp_path / "podman"
    script.write_text(
        f"#!{sys.executable}\nimport sys\ncontainers = {containers!r}\nargs = sys.argv[1:]\n"
        f"open({str(calls)!r}, 'a').write(' '.join(args) + '\\n')\n"
        "if args[0] == 'ps':\n    print('\\n'.join(f'id-{n} {n}' for n in containers))\n"
        "elif args[0] == 'inspect':\n    print(' '.join(containers[args[-1][3:]]))\n")
    script.chmod(0o755)
    stopped = tmp_path / "stopped-by-user"
    stopped.mkdir()
    (stopped / "u2").touch()
    (stopped / "id-h1").touch()  # `always` comes back at a daemon start even after a hand stop (docker's docs)
    dockerd = load_script("dockerd")
    dockerd.PODMAN, dockerd.STOPPED_BY_USER_DIR = str(script), str(stopped)
    dockerd.restart_by_policy()
    started = [line.split()[1] for line in calls.read_text().splitlines() if line.startswith("start ")]
    assert sorted(started) == ["a1", "h1", "u1"]


NVIDIA_RUN = [
    "run", "-d", "--rm", "--name", "trtllm-multinode", "--gpus", '"device=all"', "--network", "host",
    "--ulimit", "memlock=-1", "--ulimit", "stack=67108864", "--device", "/dev/infiniband:/dev/infiniband",
    "-e", "NCCL_SOCKET_IFNAME=enp1s0f1np1,enP2p1s0f1np1", "-e", "HF_TOKEN=hf_secretsecretsecret",
    "-e", "MY_PASSWORD=hunter2", "-e", "HF_TOKEN", "-v", "/home/nvidia/.ssh:/tmp/.ssh:ro",
    "nvcr.io/nvidia/tensorrt-llm/release:1.3.0rc12", "bash", "-c", "echo --gpus all HF_TOKEN=hf_abcdefghijkl",
]  # fmt: skip


def test_docker_run_drops_what_the_lab_cannot_do_and_pins_limits(fake_podman):
    env, podman_calls, _ = fake_podman
    result = run("docker", *NVIDIA_RUN, env=env, check=True)
    (argv,) = podman_calls()
    image_at = argv.index("nvcr.io/nvidia/tensorrt-llm/release:1.3.0rc12")
    options = argv[:image_at]
    assert "--gpus" not in options and "memlock=-1" not in options
    assert "/dev/infiniband:/dev/infiniband" not in options
    assert options[options.index("stack=67108864") - 1 :][:2] == ["--ulimit", "stack=67108864"]
    assert any(o.startswith("nofile=") for o in options) and any(o.startswith("nproc=") for o in options)
    # the container's own command is never touched
    assert argv[image_at + 1 :] == ["bash", "-c", "echo --gpus all HF_TOKEN=hf_abcdefghijkl"]
    assert "dropped --gpus" in result.stderr and "dropped --device /dev/infiniband" in result.stderr
    assert "dropped --ulimit memlock=-1" in result.stderr


def test_docker_pins_limits_even_without_ulimit_and_quietly(fake_podman):
    env, podman_calls, _ = fake_podman
    result = run("docker", "run", "--rm", "img", "true", env=env, check=True)
    (argv,) = podman_calls()
    assert argv[:2] == ["run", "--rm"] and argv[-2:] == ["img", "true"]
    assert "--ulimit" in argv
    assert result.stderr == ""


def test_docker_passes_other_commands_through_unchanged(fake_podman):
    env, podman_calls, _ = fake_podman
    run("docker", "exec", "-e", "HF_TOKEN", "c1", "mpirun", "--gpus", env=env, check=True)
    run("docker", "ps", "-a", "--format", "{{.Names}}", env=env, check=True)
    assert podman_calls() == [
        ["exec", "-e", "HF_TOKEN", "c1", "mpirun", "--gpus"],
        ["ps", "-a", "--format", "{{.Names}}"],
    ]


def test_docker_log_has_every_call_with_user_and_no_secret_values(fake_podman):
    env, _, log = fake_podman
    run("docker", *NVIDIA_RUN, env=env, check=True)
    run("docker", "exec", "--env=HF_TOKEN=hf_zzzzzzzzzzzz", "c1", "true", env=env, check=True)
    entries = [json.loads(line) for line in log.read_text().splitlines()]
    assert [e["user"] for e in entries] == ["root", "root"]
    text = log.read_text()
    assert "hf_secret" not in text and "hunter2" not in text and "hf_abcdefghijkl" not in text
    assert "hf_zzzz" not in text
    argv = entries[0]["argv"]
    assert "NCCL_SOCKET_IFNAME=enp1s0f1np1,enP2p1s0f1np1" in argv
    assert "HF_TOKEN=<redacted>" in argv and "MY_PASSWORD=<redacted>" in argv
    assert "--gpus" in argv  # the log shows what sparkctl asked for, before filtering
    assert entries[1]["argv"][1] == "--env=HF_TOKEN=<redacted>"
    assert log.stat().st_mode & 0o777 == 0o666


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("setpriv"), reason="needs root and setpriv")
def test_docker_refuses_a_user_outside_group_docker(fake_podman):
    env, podman_calls, _ = fake_podman
    log_dir = Path(tempfile.mkdtemp(prefix="lab-docker-log-"))  # reachable by nobody, unlike tmp_path
    log_dir.chmod(0o1777)
    log = log_dir / "docker.log"
    env = {**env, "SPARKCTL_LAB_DOCKER_LOG": str(log)}
    result = subprocess.run(
        ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups", str(standin_path("docker")), "ps"],
        env={**os.environ, **env}, capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    assert result.returncode == 1
    assert result.stderr.startswith(
        "permission denied while trying to connect to the Docker daemon socket at unix:///var/run/docker.sock: "
    )
    assert podman_calls() == []
    try:
        assert json.loads(log.read_text())["user"] == "nobody"
    finally:
        shutil.rmtree(log_dir)


def test_docker_moves_caller_env_values_into_a_private_env_file(monkeypatch):
    docker = load_script("docker")
    monkeypatch.setenv("HF_TOKEN", "hf_secretsecret")
    monkeypatch.delenv("NOT_SET_ANYWHERE", raising=False)
    args, env_file = docker.move_env_from_caller(
        ["exec", "-e", "HF_TOKEN", "-e", "NOT_SET_ANYWHERE", "-e", "A=1", "c1", "hf", "download", "x"]
    )
    try:
        assert args == ["exec", "-e", "A=1", "--env-file", env_file, "c1", "hf", "download", "x"]
        assert Path(env_file).read_text() == "HF_TOKEN=hf_secretsecret\n"
        assert Path(env_file).stat().st_mode & 0o777 == 0o600
    finally:
        os.unlink(env_file)


# --- ibdev2netdev, nvidia-smi, udevadm ----------------------------------------------------------------
def fake_net(root: Path, name: str, operstate: str, carrier: str | None):
    net = root / "class" / "net" / name
    net.mkdir(parents=True)
    (net / "operstate").write_text(operstate + "\n")
    if carrier is not None:
        (net / "carrier").write_text(carrier + "\n")


def test_ibdev2netdev_prints_spark_lines_for_existing_twins(tmp_path):
    fake_net(tmp_path, "enP7s7", "up", "1")
    fake_net(tmp_path, "enp1s0f1np1", "up", "1")
    fake_net(tmp_path, "enP2p1s0f1np1", "unknown", "1")
    fake_net(tmp_path, "enp1s0f0np0", "down", None)
    result = run("ibdev2netdev", env={"SPARKCTL_LAB_SYSFS": str(tmp_path)}, check=True)
    assert result.stdout.splitlines() == [
        "rocep1s0f0 port 1 ==> enp1s0f0np0 (Down)",
        "rocep1s0f1 port 1 ==> enp1s0f1np1 (Up)",
        "roceP2p1s0f1 port 1 ==> enP2p1s0f1np1 (Up)",
    ]


def test_nvidia_smi_query_and_table():
    assert run("nvidia-smi", "--query-gpu=name,memory.total", "--format=csv,noheader", check=True).stdout == (
        "NVIDIA GB10, [N/A]\n"
    )
    sized = run(
        "nvidia-smi", "--query-gpu=name,memory.total", "--format=csv,noheader,nounits",
        env={"SPARKCTL_LAB_GPU_MEMORY_MIB": "122572"}, check=True,
    )  # fmt: skip
    assert sized.stdout == "NVIDIA GB10, 122572\n"
    assert "NVIDIA GB10" in run("nvidia-smi", check=True).stdout
    bad = run("nvidia-smi", "--query-gpu=name,bogus", "--format=csv")
    assert bad.returncode == 2 and 'Field "bogus" is not a valid field to query.' in bad.stderr


def test_nvidia_smi_utilisation_follows_the_stand_in_servers_work(tmp_path):
    """The lab's GPU work is the stand-in servers' CPU time: a busy `vllm` raises utilization, power and
    temperature between two calls; an idle node reads 0 %."""
    env = {"SPARKCTL_LAB_GPU_BUSY_STATE": str(tmp_path / "busy"), "SPARKCTL_LAB_GPU_MEMORY_MIB": "122572"}
    query = ("--query-gpu=utilization.gpu,memory.used,temperature.gpu,power.draw", "--format=csv,noheader,nounits")

    def reading():
        return [float(v) for v in run("nvidia-smi", *query, env=env, check=True).stdout.split(",")]

    reading()
    time.sleep(0.3)
    assert reading()[0] < 50  # nothing of ours runs
    server = tmp_path / "vllm"
    server.write_text("import time\nend = time.monotonic() + 30\nwhile time.monotonic() < end:\n    pass\n")
    busy = subprocess.Popen([sys.executable, str(server)])
    try:
        reading()
        time.sleep(0.6)
        util, used, temp, power = reading()
    finally:
        busy.kill()
        busy.wait()
    assert util > 50 and used > 1 and temp > 50 and power > 40, (util, used, temp, power)


def test_udevadm_shim_succeeds_for_what_netplan_calls():
    for args in (["settle"], ["trigger", "--attr-match=subsystem=net"], ["test-builtin", "net_setup_link", "x"]):
        assert run("udevadm", *args).returncode == 0


# --- hf -----------------------------------------------------------------------------------------------
@pytest.fixture
def hf_env(tmp_path):
    home = tmp_path / "hf-home"
    env = {"HF_HOME": str(home), "SPARKCTL_LAB_FIXTURE_REPOS": str(fixture_repos_dir())}
    for name in ("HF_TOKEN", "HF_TOKEN_PATH", "HF_HUB_CACHE", "SPARKCTL_LAB_HF_FAIL_AFTER_BYTES"):
        env[name] = ""
    return env, home


def hf(env, *args):
    return run("hf", *args, env={k: v for k, v in env.items()})


def test_hf_download_fills_the_real_cache_layout(hf_env):
    env, home = hf_env
    result = hf(env, "download", "nvidia/Qwen3-235B-A22B-FP4")
    assert result.returncode == 0, result.stderr
    repo = home / "hub" / "models--nvidia--Qwen3-235B-A22B-FP4"
    revision = (repo / "refs" / "main").read_text()
    snapshot = repo / "snapshots" / revision
    assert result.stdout.strip() == str(snapshot)
    config = snapshot / "config.json"
    assert config.is_symlink() and config.resolve().parent == (repo / "blobs").resolve()
    assert json.loads(config.read_text())["architectures"] == ["Qwen3MoeForCausalLM"]
    assert (snapshot / "model.safetensors").stat().st_size > 1000
    assert not (snapshot / "repo.json").exists()
    assert "Fetching 3 files" in result.stderr


def test_hf_gated_repo_needs_a_token_from_env_or_file(hf_env):
    env, home = hf_env
    denied = hf(env, "download", "nvidia/Llama-3.1-8B-Instruct-FP4")
    assert denied.returncode == 1
    assert "401 Client Error" in denied.stderr and "Cannot access gated repo" in denied.stderr
    assert "You must have access to it and be authenticated" in denied.stderr
    assert hf({**env, "HF_TOKEN": "hf_x"}, "download", "nvidia/Llama-3.1-8B-Instruct-FP4").returncode == 0
    home.mkdir(exist_ok=True)
    (home / "token").write_text("hf_from_file\n")
    assert hf(env, "download", "nvidia/Qwen3-235B-A22B-Eagle3").returncode == 0


def test_hf_unknown_repo_and_revision_are_404(hf_env):
    env, _ = hf_env
    missing = hf(env, "download", "nvidia/No-Such-Model")
    assert missing.returncode == 1 and "404 Client Error" in missing.stderr
    assert "Repository Not Found" in missing.stderr
    bad_rev = hf(env, "download", "openai/gpt-oss-120b", "--revision", "v9")
    assert bad_rev.returncode == 1 and "Revision Not Found" in bad_rev.stderr


def test_hf_keeps_every_commit_and_writes_a_ref_only_for_a_name(hf_env, tmp_path):
    env, home = hf_env
    fixtures, old = moved_main(tmp_path)
    env = {**env, "SPARKCTL_LAB_FIXTURE_REPOS": str(fixtures)}
    repo = home / "hub" / "models--openai--gpt-oss-120b"
    pinned = hf(env, "download", "openai/gpt-oss-120b", "--revision", old)
    assert pinned.returncode == 0, pinned.stderr
    assert pinned.stdout.strip() == str(repo / "snapshots" / old)
    # a commit asked for is no ref: refs/main is not written (huggingface_hub's snapshot_download)
    assert not (repo / "refs" / "main").exists()
    assert "moved" not in (repo / "snapshots" / old / "config.json").read_text()
    latest = hf(env, "download", "openai/gpt-oss-120b")
    new = (repo / "refs" / "main").read_text()
    assert latest.returncode == 0 and new != old and "moved" in (repo / "snapshots" / new / "config.json").read_text()


def test_hf_cache_dir_holds_the_snapshot_and_the_token_stays_in_hf_home(hf_env, tmp_path):
    env, home = hf_env
    home.mkdir()
    (home / "token").write_text("hf_from_file\n")
    cache = tmp_path / "throwaway"
    result = hf(env, "download", "nvidia/Qwen3-235B-A22B-Eagle3", "config.json", "--cache-dir", str(cache))
    assert result.returncode == 0, result.stderr
    path = result.stdout.strip()
    assert path.startswith(str(cache / "models--nvidia--Qwen3-235B-A22B-Eagle3" / "snapshots")) and \
        path.endswith("/config.json")
    assert not (home / "hub").exists()


def test_hf_offline_serves_the_cache_and_refuses_the_rest(hf_env):
    env, home = hf_env
    offline = {**env, "HF_HUB_OFFLINE": "1"}
    refused = hf(offline, "download", "openai/gpt-oss-120b")
    assert refused.returncode == 1 and "outgoing traffic has been disabled" in refused.stderr
    assert not (home / "hub").exists()
    assert hf(env, "download", "openai/gpt-oss-120b").returncode == 0
    cached = hf(offline, "download", "openai/gpt-oss-120b")
    revision = (home / "hub" / "models--openai--gpt-oss-120b" / "refs" / "main").read_text()
    assert cached.returncode == 0 and cached.stdout.strip().endswith(f"/snapshots/{revision}")


def test_hf_resumes_an_interrupted_download_into_a_local_dir(hf_env, tmp_path):
    env, _ = hf_env
    target = tmp_path / "opt" / "Qwen3-235B-A22B-Eagle3"
    args = ("download", "nvidia/Qwen3-235B-A22B-Eagle3", "--local-dir", str(target))
    token_env = {**env, "HF_TOKEN": "hf_x"}
    broken = hf({**token_env, "SPARKCTL_LAB_HF_FAIL_AFTER_BYTES": "1000"}, *args)
    assert broken.returncode == 1 and "Connection broken" in broken.stderr
    assert not (target / "model.safetensors").exists()
    partial = target / ".cache" / "huggingface" / "download" / "model.safetensors.incomplete"
    assert 0 < partial.stat().st_size < 1000
    resumed = hf(token_env, *args)
    assert resumed.returncode == 0, resumed.stderr
    assert "Resuming download of 'model.safetensors' from byte" in resumed.stderr
    source = fixture_repos_dir() / "nvidia--Qwen3-235B-A22B-Eagle3" / "model.safetensors"
    assert (target / "model.safetensors").read_bytes() == source.read_bytes()
    assert resumed.stdout.strip() == str(target)


# --- trtllm-serve -------------------------------------------------------------------------------------
SPARK_OPTIONS = """\
enable_attention_dp: false
disable_overlap_scheduler: false
enable_autotuner: false
enable_chunked_prefill: false
enable_iter_perf_stats: true
cuda_graph_config: {max_batch_size: 1}
speculative_config: {decoding_type: Eagle, max_draft_len: 3, speculative_model_dir: DRAFT}
kv_cache_config: {free_gpu_memory_fraction: 0.9, enable_block_reuse: false}
"""


@pytest.fixture(scope="module")
def serve_env(tmp_path_factory):
    """A HF cache with the target model and a local-dir draft, shared by the trtllm-serve tests."""
    tmp_path = tmp_path_factory.mktemp("serve")
    env = {"HF_HOME": str(tmp_path / "hf-home"), "SPARKCTL_LAB_FIXTURE_REPOS": str(fixture_repos_dir()),
           "SPARKCTL_LAB_TRTLLM_RELEASES": str(image.RELEASES_FILE), "SPARKCTL_LAB_TRTLLM_VERSION": "1.3.0rc12",
           "HF_TOKEN": "hf_x", "SPARKCTL_LAB_HF_FAIL_AFTER_BYTES": "", "HF_HUB_CACHE": ""}  # fmt: skip
    draft = tmp_path / "draft"
    assert hf(env, "download", "nvidia/Qwen3-235B-A22B-FP4").returncode == 0
    assert hf(env, "download", "nvidia/Qwen3-235B-A22B-Eagle3", "--local-dir", str(draft)).returncode == 0
    options = tmp_path / "extra-llm-api-config.yml"
    options.write_text(SPARK_OPTIONS.replace("DRAFT", str(draft) + "/"))
    serve_env = {**env, "SPARKCTL_LAB_SERVE_DELAY": "0.3", "OMPI_ALLOW_RUN_AS_ROOT": "1",
                 "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1", "OMPI_MCA_btl_tcp_if_include": "lo",
                 "OMPI_MCA_oob_tcp_if_include": "lo"}  # fmt: skip
    return serve_env, options


def serve(env, options, *extra, model="nvidia/Qwen3-235B-A22B-FP4", tp="1"):
    args = [model, "--backend", "pytorch", "--tp_size", tp, "--max_num_tokens", "1024"]
    return run("trtllm-serve", *args, "--extra_llm_api_options", str(options), *extra, env=env)


@pytest.mark.parametrize(
    "version, edit, where, message",
    [
        # a key of another release (1.1.0rc0's use_torch_sampler)
        ("1.3.0rc12", {"use_torch_sampler": True}, "use_torch_sampler",
         "Extra inputs are not permitted [type=extra_forbidden, input_value=True"),
        # an unknown nested key: pydantic places it under the union's tag
        ("1.3.0rc12", {"speculative_config": {"decoding_type": "Eagle", "max_draft_len": 3, "draft_len": 1}},
         "speculative_config.Eagle.draft_len", "Extra inputs are not permitted [type=extra_forbidden"),
        ("1.3.0rc12", {"kv_cache_config": {"free_gpu_memory_fraction": 0.9, "enable_blockreuse": False}},
         "kv_cache_config.enable_blockreuse", "extra_forbidden"),
        # a key 1.3.0rc11 still has and late 1.3 removed
        ("1.3.0rc26", {"kv_cache_config": {"onboard_blocks": True}}, "kv_cache_config.onboard_blocks",
         "extra_forbidden"),
        # a wrong type
        ("1.3.0rc12", {"kv_cache_config": {"free_gpu_memory_fraction": "0.9"}},
         "kv_cache_config.free_gpu_memory_fraction", "Input should be a valid number [type=float_type"),
        ("1.3.0rc12", {"enable_autotuner": "no"}, "enable_autotuner", "Input should be a valid boolean"),
        # a decoding_type tag the release's tagged union does not list
        ("1.3.0rc12", {"speculative_config": {"decoding_type": "DraftTarget", "max_draft_len": 4,
                                              "speculative_model_dir": "/x"}},
         "speculative_config", "Input tag 'DraftTarget' found using 'decoding_type' does not match any of the "
                               "expected tags: 'Draft_Target', 'Eagle', 'Eagle3', 'Lookahead'"),
        ("1.2.0rc6", {"speculative_config": {"decoding_type": "Draft_Target", "max_draft_len": 4,
                                             "speculative_model_dir": "/x"}},
         "speculative_config", "Input tag 'Draft_Target' found using 'decoding_type' does not match"),
        ("1.3.0rc12", {"speculative_config": {"decoding_type": "Eagle", "max_draft_len": 0,
                                              "speculative_model_dir": "/x"}},
         "speculative_config.Eagle", "max_draft_len must be > 0"),
    ],
)  # fmt: skip
def test_trtllm_serve_refuses_what_the_release_refuses(serve_env, tmp_path, version, edit, where, message):
    env, _ = serve_env
    options = tmp_path / "bad.yml"
    options.write_text(json.dumps({"enable_autotuner": False, **edit}))
    result = serve({**env, "SPARKCTL_LAB_TRTLLM_VERSION": version}, options)
    assert result.returncode == 1
    assert "validation error for TorchLlmArgs" in result.stderr
    assert f"\n{where}\n" in result.stderr and message in result.stderr


def test_trtllm_serve_accepts_the_tag_its_release_lists(serve_env, tmp_path):
    env, options = serve_env
    draft = options.parent / "draft"
    for version, tag in (("1.2.0rc6", "DraftTarget"), ("1.3.0rc12", "Draft_Target")):
        good = tmp_path / f"{version}.yml"
        good.write_text(json.dumps({"speculative_config": {"decoding_type": tag, "max_draft_len": 4,
                                                           "speculative_model_dir": str(draft)}}))
        script = load_script("trtllm-serve")
        script.RELEASES_PATH = str(image.RELEASES_FILE)
        script.validate_options(json.loads(good.read_text()), script.release_schema(version))


def test_trtllm_serve_as_a_nonzero_rank_without_the_launcher_is_refused(serve_env):
    env, options = serve_env
    result = serve({**env, "OMPI_COMM_WORLD_RANK": "1"}, options)
    assert result.returncode == 1 and "through trtllm-llmapi-launch" in result.stderr


def test_trtllm_serve_in_the_broken_image_fails_at_load_in_cuda_s_words(serve_env, tmp_path):
    env, options = serve_env
    broken = tmp_path / "broken-kernels"
    broken.write_text("no kernels\n")
    result = serve({**env, "SPARKCTL_LAB_BROKEN_KERNELS_FILE": str(broken)}, options)
    assert result.returncode == 1
    assert "CUDA error: no kernel image is available for execution on the device" in result.stderr


def test_trtllm_serve_needs_the_model_in_the_cache(serve_env):
    env, options = serve_env
    result = serve(env, options, model="nvidia/Llama-3.3-70B-Instruct-FP4")
    assert result.returncode == 1
    assert "couldn't find them in the cached files" in result.stderr and "config.json" in result.stderr


def test_trtllm_serve_needs_the_draft_model_where_the_config_says(serve_env, tmp_path):
    env, options = serve_env
    moved = tmp_path / "moved.yml"
    draft = options.parent / "draft"
    moved.write_text(options.read_text().replace(str(draft), "/opt/Qwen3-235B-A22B-Eagle3"))
    result = serve(env, moved)
    assert result.returncode == 1 and "/opt/Qwen3-235B-A22B-Eagle3" in result.stderr


def test_trtllm_serve_rejects_unknown_cli_options(serve_env):
    env, options = serve_env
    result = serve(env, options, "--tp-size", "2")
    assert result.returncode == 2 and "Error: No such option: --tp-size" in result.stderr


needs_mpi = pytest.mark.skipif(
    not shutil.which("mpirun") or subprocess.run([SYSTEM_PYTHON, "-c", "import mpi4py"]).returncode != 0,
    reason="needs mpirun and mpi4py for /usr/bin/python3",
)


@needs_mpi
def test_trtllm_serve_tp_size_must_match_the_mpi_world(serve_env):
    env, options = serve_env
    result = serve(env, options, tp="2")
    assert result.returncode == 1
    assert "tp_size (2)" in result.stderr and "MPI world size is 1" in result.stderr


def free_port():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def http(method, url, body=None, timeout=10):
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url, data=data, method=method, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()
    except OSError:
        return None, ""


def wait_health(base, want, timeout=120):  # mpirun and two Python ranks start slowly on two busy cores
    deadline = time.monotonic() + timeout
    seen = []
    while time.monotonic() < deadline:
        status, _ = http("GET", f"{base}/health", timeout=2)
        seen.append(status)
        if status == want:
            return seen
        time.sleep(0.05)
    raise AssertionError(f"/health never answered {want}: {seen[-5:]}")


@pytest.mark.slow
@needs_mpi
def test_trtllm_serve_two_ranks_serve_until_a_peer_dies(serve_env):
    env, options = serve_env
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    command = [
        "mpirun", "-np", "2", "--oversubscribe", "--bind-to", "none",
        str(standin_path("trtllm-llmapi-launch")), str(standin_path("trtllm-serve")), "nvidia/Qwen3-235B-A22B-FP4",
        "--backend", "pytorch", "--tp_size", "2", "--extra_llm_api_options", str(options),
        "--host", "127.0.0.1", "--port", str(port),
    ]  # fmt: skip
    # "loading" for 3 s: a window the /health poll cannot miss on a loaded machine
    env = {**os.environ, **env, "NCCL_DEBUG": "INFO", "NCCL_SOCKET_IFNAME": "lo", "SPARKCTL_LAB_SERVE_DELAY": "3"}
    server = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        seen = wait_health(base, 200)
        assert 503 in seen  # "loading" comes first
        chat = {"model": "nvidia/Qwen3-235B-A22B-FP4", "max_tokens": 12,
                "messages": [{"role": "user", "content": "Describe the spark fabric briefly"}]}  # fmt: skip
        status, body = http("POST", f"{base}/v1/chat/completions", chat)
        assert status == 200, body
        reply = json.loads(body)
        text = reply["choices"][0]["message"]["content"]
        assert len(text.split()) == 12 and len(set(text.split())) > 1
        assert reply["choices"][0]["avg_decoded_tokens_per_iter"] == 2.5
        assert json.loads(http("POST", f"{base}/v1/chat/completions", chat)[1])["choices"][0]["message"][
            "content"] == text  # fmt: skip
        stream = {"prompt": "hello spark", "max_tokens": 3, "stream": True}
        status, body = http("POST", f"{base}/v1/completions", stream)
        events = [line[6:] for line in body.splitlines() if line.startswith("data: ")]
        assert status == 200 and events[-1] == "[DONE]" and len(events) == 5
        metrics = json.loads(http("GET", f"{base}/metrics")[1])
        wanted = {"numDraftTokens", "numAcceptedTokens", "acceptanceLength"}
        assert metrics and set(metrics[0]["specDecodingStats"]) >= wanted
        assert json.loads(http("GET", f"{base}/metrics")[1]) == []  # drained on read
        assert json.loads(http("GET", f"{base}/version")[1]) == {"version": "1.3.0rc12"}
        assert json.loads(http("GET", f"{base}/v1/models")[1])["data"][0]["id"] == "nvidia/Qwen3-235B-A22B-FP4"
        worker = worker_pid(server.pid)
        os.kill(worker, signal.SIGKILL)
        server.wait(timeout=60)  # generous: on 2 busy cores ORTE takes a while to notice the dead rank
        assert server.returncode != 0
        assert http("GET", f"{base}/health", timeout=2)[0] != 200
        log = server.stdout.read()
        assert "Application startup complete." in log
        assert "NCCL INFO NET/Socket : Using [0]lo:127.0.0.1<0>" in log
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()


def worker_pid(mpirun_pid):
    """The rank-1 process under THIS mpirun (its environment says OMPI_COMM_WORLD_RANK=1). Only its descendants
    count: other mpiruns on the machine (a lab's serving ranks, another test) have a rank 1 too."""
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or mpirun_pid not in ancestors(int(proc.name)):
            continue
        try:
            environ = (proc / "environ").read_bytes().split(b"\0")
            cmdline = (proc / "cmdline").read_bytes()
        except OSError:
            continue
        if b"OMPI_COMM_WORLD_RANK=1" in environ and b"trtllm-serve" in cmdline:
            return int(proc.name)
    raise AssertionError(f"no rank-1 trtllm-serve under mpirun {mpirun_pid}")


def ancestors(pid: int) -> list[int]:
    chain = []
    while pid > 1:
        try:
            # /proc/PID/stat: "pid (comm) state ppid ...": comm may hold spaces and parentheses
            pid = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            break
        chain.append(pid)
    return chain


class OneRankMpi:
    """MPI with a world of one: collectives return their input (the real ones are tested above)."""

    rank, size, timeout = 0, 1, 20.0

    def bcast(self, message=None, idle=False):
        return message

    def allreduce(self, value):
        return value


def generate(engine_class, prompt, tokens):
    engine = engine_class(OneRankMpi(), 0)
    threading.Thread(target=engine.run, daemon=True).start()
    out = engine.generate(prompt, tokens)
    return "".join(iter(lambda: out.get(timeout=5), None))


def test_trtllm_serve_text_is_deterministic_words_unless_degenerate(monkeypatch):
    engine_class = load_script("trtllm-serve").Engine
    monkeypatch.delenv("SPARKCTL_LAB_DEGENERATE", raising=False)
    text = generate(engine_class, "Tell me about the Spark", 20)
    assert text == generate(engine_class, "Tell me about the Spark", 20)
    assert len(text.split()) == 20 and len(set(text.split())) > 3
    assert text != generate(engine_class, "Something else entirely", 20)
    monkeypatch.setenv("SPARKCTL_LAB_DEGENERATE", "1")
    assert generate(engine_class, "Tell me about the Spark", 8) == "!!!!!!!!"


# --- image recipe -------------------------------------------------------------------------------------
def test_apt_mirrors_reads_deb822_and_one_line_sources(tmp_path):
    (tmp_path / "sources.list.d").mkdir()
    (tmp_path / "sources.list").write_text(
        "# comment\ndeb [signed-by=/k.gpg] http://mirror.example/debian bookworm main contrib\n"
        "deb-src http://mirror.example/debian bookworm main\n"
    )
    (tmp_path / "sources.list.d" / "debian.sources").write_text(
        "Types: deb\nURIs: http://deb.debian.org/debian\nSuites: bookworm bookworm-updates\nComponents: main\n"
        "Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg\n\n"
        "Types: deb\nURIs: https://deb.nodesource.com/node_20.x\nSuites: nodistro\nComponents: main\n"
    )
    (tmp_path / "sources.list.d" / "x.list.disabled").write_text("deb http://other bookworm main\n")
    mirrors = image.apt_mirrors(tmp_path)
    keyring = "[signed-by=/usr/share/keyrings/debian-archive-keyring.gpg]"
    if image._os_codename() == "bookworm":
        assert mirrors == [
            "deb [signed-by=/k.gpg] http://mirror.example/debian bookworm main",
            f"deb {keyring} http://deb.debian.org/debian bookworm main",
            f"deb {keyring} http://deb.debian.org/debian bookworm-updates main",
        ]


def test_recipe_hash_covers_the_baked_files():
    baked = dict(image._baked_files())
    assert baked[image.ENTRYPOINT_IN_IMAGE] == standin_path("sparkctl-lab-entrypoint")
    assert "/usr/local/bin/trtllm-serve" in baked and "/usr/local/bin/docker" not in baked
    assert any(p.endswith("nvidia--Qwen3-235B-A22B-Eagle3/repo.json") for p in baked)
    assert image.recipe_hash() == image.recipe_hash()
    assert set(image.required_packages()) >= {"mmdebstrap", "podman", "runc", "openssh-server"}


def test_ibv_devinfo_standin_has_the_layout_of_a_real_spark(tmp_path):
    """Line for line the keys and tabs of a real Spark's ibv_devinfo (tests/fixtures/roce/ibv_devinfo.spark.txt)."""
    for twin, state, mac in (("enp1s0f0np0", "down", "4c:bb:47:2d:1a:16"), ("enp1s0f1np1", "up", "4c:bb:47:2d:1a:17"),
                             ("enP2p1s0f0np0", "down", "4c:bb:47:2d:1a:1a"),
                             ("enP2p1s0f1np1", "up", "4c:bb:47:2d:1a:1b")):
        fake_net(tmp_path, twin, state, "1" if state == "up" else None)
        (tmp_path / "class" / "net" / twin / "address").write_text(mac + "\n")
        (tmp_path / "class" / "net" / twin / "mtu").write_text("9000\n")
    out = run("ibv_devinfo", env={"SPARKCTL_LAB_SYSFS": str(tmp_path)}, check=True).stdout
    real = (Path(__file__).resolve().parents[1] / "fixtures" / "roce" / "ibv_devinfo.spark.txt").read_text()
    order = ["rocep1s0f0", "roceP2p1s0f0", "rocep1s0f1", "roceP2p1s0f1"]  # the stand-in's ibdev2netdev order

    def blocks(text):
        found = {b.splitlines()[0].split("\t")[1]: b for b in text.strip().split("\n\n")}
        return [found[d] for d in order]

    assert blocks(out) == blocks(real)  # the same MACs give the same GUIDs, states, MTUs, firmware, board
    assert run("ibv_devinfo", "-d", "mlx5_9", env={"SPARKCTL_LAB_SYSFS": str(tmp_path)}).stderr == \
        "IB device 'mlx5_9' wasn't found\n"


def test_trtllm_serve_prints_nccls_lines_and_the_ib_late_switch_makes_one_start_fall_back(tmp_path, monkeypatch,
                                                                                            capsys):
    """The serve stand-in's NCCL lines are all_reduce_perf's (the shapes of the real NCCL 2.28.9 logs): IB over the
    Up RoCE devices NCCL_IB_HCA lists; with `nccl-ib-late` in the container's fault file, that one start finds no
    device and falls back to sockets, as doctor and serve.launch then see it."""
    from sparkctl.knowledge.nccl import parse_nccl_log

    serve = load_script("trtllm-serve")
    monkeypatch.setattr(serve, "FAULTS", str(tmp_path / "standin-faults"))
    perf = serve.all_reduce_perf()
    monkeypatch.setattr(perf, "SPARK_ROCE_DEVICES", [("rocelo", "lo")])
    monkeypatch.setattr(perf, "up", lambda netdev: True)
    monkeypatch.setattr(serve, "all_reduce_perf", lambda: perf)
    monkeypatch.setenv("NCCL_DEBUG", "INFO")
    monkeypatch.setenv("NCCL_SOCKET_IFNAME", "lo")
    monkeypatch.setenv("NCCL_IB_HCA", "rocelo")
    (tmp_path / "standin-faults").write_text("port-down x\nnccl-ib-late\n")
    serve.nccl_startup(0, 2)
    late = parse_nccl_log(capsys.readouterr().out)
    assert late.network == "Socket" and late.ib_no_device and late.silent_tcp_fallback
    assert (tmp_path / "standin-faults").read_text() == "port-down x\n"  # used once
    serve.nccl_startup(0, 2)
    ready = parse_nccl_log(capsys.readouterr().out)
    assert ready.network == "IB" and [d.device for d in ready.ib_devices] == ["rocelo"]
