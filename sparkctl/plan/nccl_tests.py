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
from sparkctl.transport.base import q

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
    """Shell for one node's container: print READY when the cached binary is there (or once built), MISSING and
    what is missing (git, make, nvcc, MPI's or NCCL's headers), CLONE_FAILED or BUILD_FAILED and the tail of the
    output. Built in a temp directory beside the cache, then renamed into place."""
    final = f"{CACHE_ROOT}/{cache_key(image_id)}"
    binary = f"{final}/build/all_reduce_perf"
    homes = " ".join(q(h) for h in MPI_HOMES)
    return f"""binary={q(binary)}; final={q(final)}
[ -x "$binary" ] && {{ echo {READY}; exit 0; }}
missing=
command -v git >/dev/null 2>&1 || missing="$missing git"
command -v make >/dev/null 2>&1 || missing="$missing make"
cuda=${{CUDA_HOME:-{q(CUDA_HOME)}}}
[ -x "$cuda/bin/nvcc" ] || missing="$missing nvcc($cuda/bin/nvcc)"
mpi=
for c in "${{MPI_HOME:-}}" "$(mpicc --showme:incdirs 2>/dev/null | cut -d' ' -f1 | xargs -r dirname)" {homes}; do
  [ -n "$c" ] && [ -e "$c/include/mpi.h" ] && {{ mpi=$c; break; }}
done
[ -n "$mpi" ] || missing="$missing mpi.h(MPI's headers)"
nccl=${{NCCL_HOME:-/usr}}
[ -e "$nccl/include/nccl.h" ] || missing="$missing nccl.h($nccl/include)"
[ -z "$missing" ] || {{ echo "{MISSING}$missing"; exit 0; }}
mkdir -p {q(CACHE_ROOT)} && work=$(mktemp -d {q(CACHE_ROOT + "/.build-XXXXXX")}) || {{
  echo "{BUILD_FAILED} cannot make a build directory under {CACHE_ROOT}"; exit 0; }}
if ! out=$(git clone -q --depth 1 -b {q(NCCL_TESTS_TAG)} {q(NCCL_TESTS_REPO)} "$work" 2>&1); then
  rm -rf "$work"; echo "{CLONE_FAILED} $(printf '%s' "$out" | tail -n 3 | tr '\\n' ' ')"; exit 0
fi
if ! out=$(make -C "$work" -j"$(nproc)" MPI=1 MPI_HOME="$mpi" CUDA_HOME="$cuda" NCCL_HOME="$nccl" 2>&1); then
  rm -rf "$work"; echo "{BUILD_FAILED} $(printf '%s' "$out" | tail -n 5 | tr '\\n' ' ')"; exit 0
fi
if [ -e "$final" ]; then rm -rf "$work"; else mv "$work" "$final" || {{ rm -rf "$work"; exit 1; }}; fi
[ -x "$binary" ] && echo {READY} || echo "{BUILD_FAILED} make left no build/all_reduce_perf"
"""


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
