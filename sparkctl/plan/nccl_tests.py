"""PURE: building nccl-tests' all_reduce_perf in a node's container when the image does not hold it (NVIDIA's
TensorRT-LLM images do not ship nccl-tests), once per node and image, into a cache on the node's own disk that the
container mounts (the state dir's run/, at CONTAINER_STATE).

The build is nccl-tests' README's: `make MPI=1 MPI_HOME=/path/to/mpi CUDA_HOME=/path/to/cuda NCCL_HOME=/path/to/nccl`
(github.com/NVIDIA/nccl-tests, README.md "Build"), as NVIDIA's DGX Spark NCCL playbook step 3 runs it
(github.com/NVIDIA/dgx-spark-playbooks, nvidia/nccl/README.md and assets/setup.sh: CUDA_HOME=/usr/local/cuda,
MPI_HOME=/usr/lib/aarch64-linux-gnu/openmpi on DGX OS, `make -j$(nproc) MPI=1`), from a pinned release tag.
"""

from __future__ import annotations

import re

from sparkctl.plan.paths import CONTAINER_STATE
from sparkctl.plan.render import render

#: github.com/NVIDIA/nccl-tests, its newest release tag when this was written
NCCL_TESTS_TAG = "v2.19.6"
NCCL_TESTS_REPO = "https://github.com/NVIDIA/nccl-tests.git"
CUDA_HOME = "/usr/local/cuda"
#: where MPI's headers may be when mpicc cannot say (NGC images: /usr/local/mpi, HPC-X; DGX OS: Debian's openmpi)
MPI_HOMES = ("/usr/local/mpi", "/opt/hpcx/ompi", "/usr/lib/aarch64-linux-gnu/openmpi",
             "/usr/lib/x86_64-linux-gnu/openmpi")
CACHE_ROOT = f"{CONTAINER_STATE}/nccl-tests"
BUILD_TIMEOUT = 1800.0
MISSING = "@@nccl-tests-missing@@"
CLONE_FAILED = "@@nccl-tests-clone-failed@@"
BUILD_FAILED = "@@nccl-tests-build-failed@@"
READY = "@@nccl-tests-ready@@"


def cache_key(image_id: str) -> str:
    """The cache directory's name: the tag and the image (its id's first 12 hex digits): a new image rebuilds."""
    digest = re.sub(r"^sha256:", "", image_id or "").lower()
    if not re.fullmatch(r"[0-9a-f]{12,64}", digest):
        raise ValueError(f"not an image id: {image_id!r}")
    return f"{NCCL_TESTS_TAG}-{digest[:12]}"


def cached_binary(image_id: str) -> str:
    """all_reduce_perf's path inside every container, once built."""
    return f"{CACHE_ROOT}/{cache_key(image_id)}/build/all_reduce_perf"


def build_script(image_id: str) -> str:
    """Shell for one node's container (templates/nccl-tests-build.sh.j2): READY, MISSING, CLONE_FAILED or
    BUILD_FAILED and why."""
    final = f"{CACHE_ROOT}/{cache_key(image_id)}"
    return render("nccl-tests-build.sh.j2", binary=f"{final}/build/all_reduce_perf", final=final, ready=READY,
                  cuda_home=CUDA_HOME, mpi_homes=MPI_HOMES, missing_mark=MISSING, cache_root=CACHE_ROOT,
                  build_failed=BUILD_FAILED, clone_failed=CLONE_FAILED, tag=NCCL_TESTS_TAG, repo=NCCL_TESTS_REPO)


def build_outcome(output: str) -> tuple[str, str]:
    """("ready", "") | ("missing", what is missing) | ("clone", why) | ("build", why) | ("unknown", output's tail)."""
    for line in output.splitlines():
        if line.startswith(READY):
            return "ready", ""
        for mark, kind in ((MISSING, "missing"), (CLONE_FAILED, "clone"), (BUILD_FAILED, "build")):
            if line.startswith(mark):
                return kind, line[len(mark):].strip()
    lines = [ln.strip() for ln in output.strip().splitlines() if ln.strip()]
    return "unknown", lines[-1][:300] if lines else "no output"


def build_error(node: str, kind: str, detail: str) -> str:
    """One line saying why all_reduce_perf could not be built on a node, and what would fix it."""
    if kind == "missing":
        what = ", ".join(detail.split())
        return (f"{node}: cannot build nccl-tests {NCCL_TESTS_TAG} in the container: missing {what} (an image with "
                "the CUDA toolkit and MPI's headers, or --all-reduce-perf PATH)")
    if kind == "clone":
        return (f"{node}: git clone of {NCCL_TESTS_REPO} ({NCCL_TESTS_TAG}) failed in the container: {detail} (does "
                "the container reach github.com?)")
    if kind == "build":
        return f"{node}: building nccl-tests {NCCL_TESTS_TAG} failed: {detail}"
    return f"{node}: the nccl-tests build gave no answer: {detail}"
