"""The lab image for real: build (or reuse) it, run it the way a node does, and check what sparkctl needs."""

from __future__ import annotations

import importlib.machinery
import importlib.util
import json
import os
import shutil
import subprocess
import tempfile
import time

import pytest

from sparkctl.lab import image
from sparkctl.lab.standins import standin_path
from tests.lab.conftest import after_the_readme

pytestmark = [
    pytest.mark.lab,
    pytest.mark.skipif(
        os.geteuid() != 0 or not (shutil.which("mmdebstrap") and shutil.which("podman")),
        reason="needs root, mmdebstrap and podman",
    ),
]


def pinned_ulimits():
    loader = importlib.machinery.SourceFileLoader("lab_docker", str(standin_path("docker")))
    docker = importlib.util.module_from_spec(importlib.util.spec_from_loader(loader.name, loader))
    loader.exec_module(docker)
    nofile, nproc = docker.pinned_limits()
    return ["--ulimit", f"nofile={nofile}:{nofile}", "--ulimit", f"nproc={nproc}:{nproc}"]


@pytest.fixture(scope="module")
def lab_image(request):
    after_the_readme(request)
    started = time.monotonic()
    ref = image.ensure_image(log=print)
    print(f"ensure_image: {time.monotonic() - started:.1f} s")
    return ref


@pytest.fixture(scope="module")
def podman(lab_image, tmp_path_factory):
    """podman with a graphroot of its own and the shared store as a read-only image store, like a node."""
    root = tmp_path_factory.mktemp("podman")
    # podman refuses a runroot longer than 50 characters (a pytest temp dir under xdist is longer)
    runroot = tempfile.mkdtemp(prefix="slimg-", dir="/tmp")
    base = [
        "podman", "--root", str(root / "graph"), "--runroot", runroot, "--storage-driver", "overlay",
        "--storage-opt", f"overlay.imagestore={image.IMAGE_STORE}", "--cgroup-manager", "cgroupfs",
        "--events-backend", "file", "--runtime", "runc",
    ]  # fmt: skip

    def call(*args, check=True, timeout=60):
        result = subprocess.run([*base, *args], capture_output=True, text=True, timeout=timeout)
        if check:
            assert result.returncode == 0, f"podman {' '.join(args)}: {result.stderr}"
        return result

    yield call
    call("rm", "-f", "-a", "-t", "0", check=False)
    shutil.rmtree(runroot, ignore_errors=True)
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="module")
def ssh_keys(tmp_path_factory):
    keys = tmp_path_factory.mktemp("ssh")
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(keys / "id_ed25519")], check=True)
    shutil.copy(keys / "id_ed25519.pub", keys / "authorized_keys")
    return keys


@pytest.fixture(scope="module")
def container(podman, lab_image, ssh_keys):
    name = "sparkctl-lab-image-test"
    podman("rm", "-f", "-t", "0", name, check=False)
    podman("run", "-d", "--name", name, "--network", "none", *pinned_ulimits(),
           "-v", f"{ssh_keys}:/tmp/.ssh:ro", lab_image)  # fmt: skip
    wait_for(lambda: listening(podman, name, 2233), "sshd on 2233")
    return name


def listening(podman, name, port):
    tcp = podman("exec", name, "cat", "/proc/net/tcp", "/proc/net/tcp6", check=False).stdout
    return any(f":{port:04X} " in line and line.split()[3] == "0A" for line in tcp.splitlines()[1:])


def wait_for(condition, what, timeout=120):  # returns as soon as it holds; slow only on a loaded machine
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def test_image_carries_release_and_recipe_labels_and_is_cached(lab_image, podman, monkeypatch):
    labels = json.loads(podman("image", "inspect", "--format", "{{json .Labels}}", lab_image).stdout)
    assert labels[image.VERSION_LABEL] == "1.3.0rc12"
    assert labels[image.RECIPE_LABEL] == image.recipe_hash()
    # one repository per recipe: another checkout's build on this machine never retags or prunes this one
    assert lab_image == f"localhost/sparkctl-lab-trtllm-{image.recipe_hash()[:12]}:1.3.0rc12"
    for step in ("_bootstrap_rootfs", "_import_rootfs"):  # cached: neither build step runs
        monkeypatch.setattr(image, step, lambda *a, step=step: pytest.fail(f"{step} ran although cached"))
    assert image.ensure_image(log=lambda line: pytest.fail(f"rebuilt although cached: {line}")) == lab_image


def test_entrypoint_runs_sshd_on_2233_with_the_mounted_keys(podman, container):
    modes = podman("exec", container, "stat", "-c", "%a %U %n", "/root/.ssh", "/root/.ssh/id_ed25519").stdout
    assert modes.split("\n")[:2] == ["700 root /root/.ssh", "600 root /root/.ssh/id_ed25519"]
    login = podman(
        "exec", container, "ssh", "-p", "2233", "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=accept-new",
        "root@127.0.0.1", "hostname", check=False,
    )  # fmt: skip
    assert login.returncode == 0, login.stderr
    keys = podman("exec", container, "sh", "-c", "ls /etc/ssh/ssh_host_*_key").stdout.split()
    assert "/etc/ssh/ssh_host_ed25519_key" in keys


def test_image_has_python_mpi4py_and_mpirun(podman, container):
    probe = podman("exec", container, "sh", "-c", "python3 -c 'import mpi4py, yaml; print(mpi4py.__version__)' "
                   "&& for p in mpirun sshd hf trtllm-serve trtllm-llmapi-launch; do command -v $p; done")  # fmt: skip
    lines = probe.stdout.split()
    assert lines[0].startswith(("3.", "4.")) and "/usr/sbin/sshd" in lines and "/usr/local/bin/hf" in lines


SERVE = """
set -e
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 SPARKCTL_LAB_SERVE_DELAY=0.5
hf download nvidia/Qwen3-235B-A22B-FP4 >/dev/null 2>&1
mpirun -np 1 trtllm-llmapi-launch trtllm-serve nvidia/Qwen3-235B-A22B-FP4 --backend pytorch --tp_size 1 \
    --max_num_tokens 1024 --host 127.0.0.1 --port 8355 >/tmp/serve.log 2>&1 &
"""
CLIENT = """
import json, sys, time, urllib.request, urllib.error
def get(path, body=None):
    req = urllib.request.Request("http://127.0.0.1:8355" + path, data=body and json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, ""
    except OSError:
        return None, ""
seen = []
deadline = time.monotonic() + 120  # mpirun and the server start slowly on a loaded machine
while time.monotonic() < deadline:
    seen.append(get("/health")[0])
    if seen[-1] == 200:
        break
    time.sleep(0.1)
chat = get("/v1/chat/completions", {"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]})
print(json.dumps({"health": seen, "chat": chat}))
"""


def test_trtllm_serve_under_mpirun_serves_health_and_chat(podman, container):
    podman("exec", container, "sh", "-c", SERVE)
    report = json.loads(podman("exec", container, "python3", "-c", CLIENT).stdout)
    assert report["health"][-1] == 200, podman("exec", container, "cat", "/tmp/serve.log").stdout
    status, body = report["chat"]
    assert status == 200
    assert len(json.loads(body)["choices"][0]["message"]["content"].split()) == 8
    assert "Application startup complete." in podman("exec", container, "cat", "/tmp/serve.log").stdout


def test_stop_is_quick_because_the_entrypoint_traps_term(podman, container):
    started = time.monotonic()
    podman("stop", "-t", "10", container)
    # ended by its TERM trap (exit 0), not killed once the 10 s were over (exit 137)
    assert time.monotonic() - started < 10
    assert podman("inspect", "-f", "{{.State.ExitCode}}", container).stdout.strip() == "0"
