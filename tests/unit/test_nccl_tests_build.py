"""nccl-tests built in the containers when the image does not hold all_reduce_perf: the cache key (tag + image),
the build script (quoted, syntactically sound, naming what is missing before it writes anything) and its answers."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from sparkctl.plan import nccl_tests
from sparkctl.plan.nccl_tests import build_error, build_outcome, build_script, cache_key, cached_binary

DOCKER_ID = "sha256:3f2a9c0d4e5b6a7980112233445566778899aabbccddeeff0011223344556677"
PODMAN_ID = "3f2a9c0d4e5b6a7980112233445566778899aabbccddeeff0011223344556677"


def test_the_cache_is_keyed_by_tag_and_image():
    assert cache_key(DOCKER_ID) == cache_key(PODMAN_ID) == f"{nccl_tests.NCCL_TESTS_TAG}-3f2a9c0d4e5b"
    other = "sha256:" + "0" * 64
    assert cached_binary(other) != cached_binary(DOCKER_ID)
    assert cached_binary(DOCKER_ID) == (f"/sparkctl/nccl-tests/{nccl_tests.NCCL_TESTS_TAG}-3f2a9c0d4e5b/build/"
                                        "all_reduce_perf")
    for bad in ("", "latest", "sha256:abc; rm -rf /", "$(reboot)"):
        with pytest.raises(ValueError):
            cache_key(bad)


def test_the_build_line_is_the_readmes_and_every_value_is_quoted():
    script = build_script(DOCKER_ID)
    assert subprocess.run(["bash", "-n", "-c", script], capture_output=True).returncode == 0
    assert 'make -C "$work" -j"$(nproc)" MPI=1 MPI_HOME="$mpi" CUDA_HOME="$cuda" NCCL_HOME="$nccl"' in script
    assert f"-b {nccl_tests.NCCL_TESTS_TAG} {nccl_tests.NCCL_TESTS_REPO}" in script
    # built in a temp directory beside the cache, renamed into place
    assert 'mktemp -d /sparkctl/nccl-tests/.build-XXXXXX' in script and 'mv "$work" "$final"' in script


def test_without_a_compiler_the_script_names_what_is_missing_and_writes_nothing(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("cut", "xargs", "dirname", "tr", "tail"):
        (bin_dir / tool).symlink_to(shutil.which(tool))
    ran = subprocess.run(["/bin/bash", "-c", build_script(DOCKER_ID)], capture_output=True, text=True,
                         env={"PATH": str(bin_dir), "CUDA_HOME": str(tmp_path / "cuda")})
    kind, detail = build_outcome(ran.stdout)
    assert kind == "missing", ran.stdout + ran.stderr
    assert {"git", "make", f"nvcc({tmp_path}/cuda/bin/nvcc)"} <= set(detail.split())
    line = build_error("spark1", kind, detail)
    assert line.startswith(f"spark1: cannot build nccl-tests {nccl_tests.NCCL_TESTS_TAG} in the container: "
                           "missing git, make, nvcc(")
    assert "--all-reduce-perf PATH" in line
    assert list(tmp_path.iterdir()) == [bin_dir]


def test_the_answers():
    assert build_outcome("cloning...\n@@nccl-tests-ready@@\n") == ("ready", "")
    assert build_outcome("@@nccl-tests-clone-failed@@ fatal: unable to access 'https://github.com/': Could not "
                         "resolve host: github.com") == ("clone", "fatal: unable to access 'https://github.com/': "
                                                                  "Could not resolve host: github.com")
    assert build_outcome("Error response from daemon: No such container: x") == (
        "unknown", "Error response from daemon: No such container: x")
    assert "does the container reach github.com?" in build_error("spark2", "clone", "Could not resolve host")
    assert build_error("spark2", "build", "nccl.h: No such file").startswith("spark2: building nccl-tests")


class Ran:
    def __init__(self, stdout: str, exit_code: int = 0):
        self.stdout, self.stderr, self.exit_code, self.timed_out = stdout, "", exit_code, False

    @property
    def ok(self):
        return self.exit_code == 0


class Container:
    def __init__(self, image_id):
        self.image_id = image_id


class Facts:
    def __init__(self, image_id):
        self.containers = {"trtllm-multinode": Container(image_id)}


class Node:
    """A node's transport: answers the build script with `build`, the all-reduce with `run`; remembers each."""

    def __init__(self, build: str, run: str = "@@no-all-reduce-perf@@"):
        self.build, self.run, self.asked = build, run, []

    def exec_in(self, container, cmd, timeout=60.0):
        self.asked.append(cmd)
        if "nccl-tests-missing" in cmd:
            return Ran(self.build)
        if "/sparkctl/nccl-tests/" in cmd:
            return Ran("ORTE was unable to reliably start one or more daemons.", exit_code=1)
        return Ran(self.run)


def bench_run(nodes: dict, images: dict):
    from sparkctl.cli.options import load
    from sparkctl.runs import fabric_bench
    from tests.taskkit import REPO

    inventory = load(str(REPO / "inventories" / "two-sparks.yaml"))
    session = type("S", (), {"transports": nodes})()
    said: list[str] = []
    run = fabric_bench.BenchRun(inventory, session, {n: Facts(i) for n, i in images.items()}, None,
                                fabric_bench.BenchRequest(), said.append)
    return run, said


def test_not_in_the_image_and_no_compiler_is_said_with_the_cause():
    nodes = {"spark1": Node("@@nccl-tests-missing@@ git make nvcc(/usr/local/cuda/bin/nvcc)"),
             "spark2": Node("@@nccl-tests-ready@@")}
    run, said = bench_run(nodes, {"spark1": DOCKER_ID, "spark2": DOCKER_ID})
    out = run.all_reduce()
    assert out["busbw"] is None
    assert out["error"].startswith("all_reduce_perf is not in the image, and spark1: cannot build nccl-tests")
    assert "missing git, make, nvcc(/usr/local/cuda/bin/nvcc)" in out["error"] and "spark2" not in out["error"]
    assert any("spark1: nccl-tests" in line for line in said)


def test_once_built_every_rank_runs_the_cached_binary():
    nodes = {"spark1": Node("@@nccl-tests-ready@@"), "spark2": Node("@@nccl-tests-ready@@")}
    run, _ = bench_run(nodes, {"spark1": DOCKER_ID, "spark2": DOCKER_ID})
    out = run.all_reduce()
    assert "ORTE was unable" in out["error"]
    assert cached_binary(DOCKER_ID) in nodes["spark1"].asked[-1]
    assert len(nodes["spark2"].asked) == 1  # built (or found cached) there too, the run is the head's


def test_containers_of_different_images_are_not_built_for():
    nodes = {"spark1": Node("@@nccl-tests-ready@@"), "spark2": Node("@@nccl-tests-ready@@")}
    run, _ = bench_run(nodes, {"spark1": DOCKER_ID, "spark2": "sha256:" + "0" * 64})
    out = run.all_reduce()
    assert "the containers run different images" in out["error"]
