"""The lab's container image: a small Debian with sshd, Open MPI, mpi4py and the TensorRT-LLM stand-ins.

No registry is reachable from a lab machine, so the image is built locally with mmdebstrap from the
machine's own apt mirror and imported once into ONE shared image store that every node reads as an
`additionalimagestores` entry. It is cached by a hash of its recipe (package list, mirror, hooks and the
contents of every file baked in), so a reused machine skips the build.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from sparkctl.errors import SparkctlError
from sparkctl.lab.standins import IMAGE_STANDINS, fixture_repos_dir, image_lib_dir, standin_path

TRTLLM_VERSION = "1.3.0rc12"
IMAGE_STORE = "/var/lib/sparkctl-lab/image-store"
#: One repository per recipe (image_ref): checkouts with different recipes on one machine (the labs of several
#: branches) each keep their own image in the shared store instead of retagging one ref, and pruning the old
#: image, from under each other's running containers. The tag stays the TensorRT-LLM release, which sparkctl
#: reads from an image reference.
IMAGE_REPO = "localhost/sparkctl-lab-trtllm"
VERSION_LABEL = "com.nvidia.tensorrt-llm.version"
RECIPE_LABEL = "sparkctl.lab.recipe"

LAB_STATE_DIR = Path("/var/lib/sparkctl-lab")
# A runroot of its own: sharing the machine's /run/containers/storage with another graphroot confuses podman.
IMAGE_STORE_RUNROOT = "/run/sparkctl-lab/image-store"
LOCK_PATH = LAB_STATE_DIR / "image.lock"
BUILD_DIR = LAB_STATE_DIR / "image-build"

ENTRYPOINT_IN_IMAGE = "/usr/local/bin/sparkctl-lab-entrypoint"
# sparkctl's own TensorRT-LLM release data, read by the trtllm-serve stand-in: found by path (the lab imports no
# product code), so the stand-in and sparkctl judge a config with one file.
RELEASES_IN_IMAGE = "/opt/sparkctl-lab/trtllm_releases.json"
RELEASES_FILE = Path(__file__).resolve().parents[1] / "knowledge" / "trtllm_releases.json"
#: the same for vLLM, read by the vllm stand-in, and for SGLang, read by the sglang one
VLLM_RELEASES_IN_IMAGE = "/opt/sparkctl-lab/vllm_releases.json"
VLLM_RELEASES_FILE = Path(__file__).resolve().parents[1] / "knowledge" / "vllm_releases.json"
SGLANG_RELEASES_IN_IMAGE = "/opt/sparkctl-lab/sglang_releases.json"
SGLANG_RELEASES_FILE = Path(__file__).resolve().parents[1] / "knowledge" / "sglang_releases.json"
#: The stand-ins that are Python modules (`python3 -m sglang.launch_server`), on Debian python3's path through a .pth
PYTHON_LIB_IN_IMAGE = "/opt/sparkctl-lab/python"
PTH_IN_IMAGE = "/usr/lib/python3/dist-packages/sparkctl-lab.pth"
FIXTURE_REPOS_IN_IMAGE = "/opt/sparkctl-lab/fixture-repos"

IMAGE_PACKAGES = [
    "openssh-server",
    "openmpi-bin",
    "python3",
    "python3-mpi4py",
    "python3-yaml",
    "iproute2",
    "procps",
    "iputils-ping",
    # the gateway sparkctl puts in front of the engine is real NGINX in the lab too (Debian's build)
    "nginx",
    # njs, which the gateway's router runs in (the official nginx images carry it too)
    "libnginx-mod-http-js",
    # sparkctl's figures collector runs from the engine's image with its prometheus_client (TensorRT-LLM's
    # requirements.txt has it): Debian's build of the same library
    "python3-prometheus-client",
]
DPKG_PATH_EXCLUDES = [
    "/usr/share/doc/*",
    "/usr/share/man/*",
    "/usr/share/info/*",
    "/usr/share/locale/*",
    "/usr/share/lintian/*",
]
# Bump when the build steps below change in a way the hashed inputs cannot see.
RECIPE_REVISION = 1

MACHINE_PACKAGES = [
    "openssh-server",
    "netplan.io",
    "openmpi-bin",
    "python3-mpi4py",
    "python3-yaml",
    "iputils-ping",
    "iproute2",
    "podman",
    "podman-docker",
    "runc",
    # `docker run --init` (the vLLM containers) is podman's catatonit
    "catatonit",
    "mmdebstrap",
    "debian-archive-keyring",
    "sudo",
    "systemd",
    "dbus",
    "iperf3",
    # DGX OS (Ubuntu) ships rsync: model.copy runs it on both ends (its daemon on the peer, over the fabric)
    "rsync",
    # and nftables (the backend of its iptables too): sparkctl's firewall is a table of its own
    "nftables",
]

Log = Callable[[str], None]


def required_packages() -> list[str]:
    """Debian packages the machine needs for the lab (nodes, networks, podman and this image's build)."""
    return list(MACHINE_PACKAGES)


def ensure_image(rebuild: bool = False, log: Log = print) -> str:
    """Build and import the image unless the store already holds this recipe's; return its reference."""
    with _build_lock():
        recipe = recipe_hash()
        ref = image_ref(recipe)
        current = installed_recipe(ref)
        if current == recipe and not rebuild:
            _tag_gateway(ref)
            return ref
        reason = "rebuild asked" if rebuild else ("not built yet" if current is None else "recipe changed")
        log(f"lab image: building {ref} ({reason}, recipe {recipe[:12]})")
        BUILD_DIR.mkdir(parents=True, exist_ok=True)
        tarball = BUILD_DIR / "rootfs.tar"
        try:
            started = time.monotonic()
            log("lab image: mmdebstrap (a Debian root with OpenMPI, mpi4py, sshd and the stand-ins; "
                "about a minute, once)")
            _bootstrap_rootfs(tarball, BUILD_DIR / "overlay", log)
            built = time.monotonic()
            size_mb = tarball.stat().st_size / 1e6
            log(f"lab image: mmdebstrap {built - started:.1f} s, {size_mb:.0f} MB")
            _import_rootfs(tarball, recipe, ref)
            log(f"lab image: podman import {time.monotonic() - built:.1f} s")
        finally:
            shutil.rmtree(BUILD_DIR, ignore_errors=True)
        _tag_gateway(ref)
        return ref


#: The gateway image sparkctl runs by default (sparkctl/inventory/sections.py, DEFAULT_GATEWAY_IMAGE; a unit test
#: keeps the two equal). The lab reaches no registry: this name is given to the lab image, which carries Debian's
#: NGINX, so the product's own default runs unchanged.
GATEWAY_IMAGE = "docker.io/library/nginx:1.30.6-alpine"


#: The vLLM image sparkctl runs by default with serve.engine vllm (sparkctl/engines/__init__.py,
#: ENGINES; a unit test keeps the two equal): the lab image carries the vllm stand-in too, so a lab
#: inventory that serves with vLLM runs the product's own default image name, as the gateway's.
VLLM_IMAGE = "nvcr.io/nvidia/vllm:26.05-py3"
#: the same for SGLang (serve.engine sglang): the image carries the sglang stand-in
SGLANG_IMAGE = "nvcr.io/nvidia/sglang:26.02-py3"


def _tag_gateway(ref: str) -> None:
    """The names the product's own defaults use, given to the lab image (the gateway's, vLLM's, SGLang's)."""
    _run(["podman", *podman_store_args(), "tag", ref, GATEWAY_IMAGE, VLLM_IMAGE, SGLANG_IMAGE], "podman tag",
         timeout=120)


#: Images that differ from the lab image, for the switches of an image update (tests/lab): `next` is the same
#: engine under another image ID (a new release that works), `broken` one whose engine fails at load on every
#: rank, as an image built without the GPU's architecture does (the stand-ins find the file it adds).
BROKEN_KERNELS_IN_IMAGE = "/opt/sparkctl-lab/broken-kernels"
VARIANTS = {"next": [], "broken": [f"COPY broken-kernels {BROKEN_KERNELS_IN_IMAGE}"]}
VARIANT_LABEL = "sparkctl.lab.variant"


def variant_ref(variant: str, recipe: str | None = None) -> str:
    return f"{image_ref(recipe)}-{variant}"


def ensure_variant(variant: str, log: Log = print) -> str:
    """The lab image's `variant` (VARIANTS), built on it in the shared store once per recipe; its reference."""
    ensure_image(log=log)
    with _build_lock():
        ref = variant_ref(variant)
        inspected = subprocess.run(["podman", *podman_store_args(), "image", "exists", ref], capture_output=True,
                                   timeout=60)
        if inspected.returncode == 0:
            return ref
        BUILD_DIR.mkdir(parents=True, exist_ok=True)
        try:
            lines = [f"FROM {image_ref()}", f"LABEL {VARIANT_LABEL}={variant}", *VARIANTS[variant]]
            (BUILD_DIR / "Containerfile").write_text("\n".join(lines) + "\n")
            (BUILD_DIR / "broken-kernels").write_text("this image's engine has no kernels for the GPU\n")
            _run(["podman", *podman_store_args(), "build", "--pull=never", "--quiet", "-t", ref,
                  "-f", str(BUILD_DIR / "Containerfile"), str(BUILD_DIR)], f"podman build {variant}", timeout=300)
        finally:
            shutil.rmtree(BUILD_DIR, ignore_errors=True)
        return ref


def image_ref(recipe: str | None = None) -> str:
    """This recipe's image: `localhost/sparkctl-lab-trtllm-<recipe>:<release>`."""
    return f"{IMAGE_REPO}-{(recipe or recipe_hash())[:12]}:{TRTLLM_VERSION}"


def podman_store_args() -> list[str]:
    """The podman options that address the shared image store directly (machine side)."""
    return ["--root", IMAGE_STORE, "--runroot", IMAGE_STORE_RUNROOT, "--storage-driver", "overlay"]


def installed_recipe(ref: str | None = None) -> str | None:
    """The recipe hash of the image in the store (this recipe's by default), or None when there is none."""
    if not shutil.which("podman") or not Path(IMAGE_STORE).is_dir():
        return None
    result = subprocess.run(
        ["podman", *podman_store_args(), "image", "inspect", "--format", "{{json .Labels}}", ref or image_ref()],
        capture_output=True,
        text=True,
        timeout=60,
    )
    if result.returncode != 0:
        return None
    labels = json.loads(result.stdout.strip() or "null") or {}
    return labels.get(RECIPE_LABEL)


#: The CUDA an NVIDIA image says it carries, as NGC's images (the TensorRT-LLM release images among them) set it in
#: their environment (knowledge/cuda.py): what doctor's gpu.driver_too_old reads.
IMAGE_CUDA_VERSION = "13.0.2"


def image_env() -> dict[str, str]:
    return {"CUDA_VERSION": IMAGE_CUDA_VERSION, "HF_HOME": "/root/.cache/huggingface",
            "SPARKCTL_LAB_FIXTURE_REPOS": FIXTURE_REPOS_IN_IMAGE, "SPARKCTL_LAB_TRTLLM_VERSION": TRTLLM_VERSION,
            "SPARKCTL_LAB_TRTLLM_RELEASES": RELEASES_IN_IMAGE, "SPARKCTL_LAB_VLLM_RELEASES": VLLM_RELEASES_IN_IMAGE,
            "SPARKCTL_LAB_SGLANG_RELEASES": SGLANG_RELEASES_IN_IMAGE}


def recipe_hash() -> str:
    digest = hashlib.sha256()
    recipe = {
        "revision": RECIPE_REVISION,
        "packages": IMAGE_PACKAGES,
        "excludes": DPKG_PATH_EXCLUDES,
        "mirrors": apt_mirrors(),
        "version": TRTLLM_VERSION,
        "repository": IMAGE_REPO,
        "env": image_env(),
    }
    digest.update(json.dumps(recipe, sort_keys=True).encode())
    for relative, path in _baked_files():
        digest.update(relative.encode() + b"\0")
        digest.update(path.read_bytes() + b"\0")
    return digest.hexdigest()


def apt_mirrors(etc_apt: Path = Path("/etc/apt")) -> list[str]:
    """One-line `deb` entries for the machine's configured Debian suites (main only).

    Only the configured mirror is reachable from a lab machine, so the image uses exactly it.
    """
    codename = _os_codename()
    entries = []
    for uris, suites, options in _apt_sources(etc_apt):
        for uri in uris:
            for suite in suites:
                if codename and suite.split("-")[0] != codename:
                    continue
                opts = f"[{options}] " if options else ""
                entries.append(f"deb {opts}{uri} {suite} main")
    if not entries:
        raise SparkctlError(
            f"no Debian '{codename}' apt source found under {etc_apt}",
            hint="the lab image is built from the machine's configured Debian mirror",
        )
    return list(dict.fromkeys(entries))


def _apt_sources(etc_apt: Path) -> Iterator[tuple[list[str], list[str], str]]:
    files = [etc_apt / "sources.list"]
    parts = etc_apt / "sources.list.d"
    if parts.is_dir():
        files += sorted(parts.glob("*.list")) + sorted(parts.glob("*.sources"))
    for path in files:
        if not path.is_file():
            continue
        text = path.read_text()
        if path.suffix == ".sources":
            yield from _deb822_sources(text)
        else:
            yield from _one_line_sources(text)


def _one_line_sources(text: str) -> Iterator[tuple[list[str], list[str], str]]:
    for raw in text.splitlines():
        words = raw.split("#", 1)[0].split()
        if not words or words[0] != "deb":
            continue
        options = ""
        if len(words) > 1 and words[1].startswith("["):
            end = next(i for i, w in enumerate(words) if w.endswith("]"))
            options = " ".join(words[1 : end + 1])[1:-1]
            words = [words[0], *words[end + 1 :]]
        if len(words) >= 3 and "main" in words[3:]:
            yield [words[1]], [words[2]], options


def _deb822_sources(text: str) -> Iterator[tuple[list[str], list[str], str]]:
    for stanza in text.split("\n\n"):
        fields: dict[str, str] = {}
        for line in stanza.splitlines():
            if line.startswith("#") or ":" not in line or line[:1].isspace():
                continue
            key, value = line.split(":", 1)
            fields[key.strip().lower()] = value.strip()
        if "deb" not in fields.get("types", "").split() or fields.get("enabled", "yes") == "no":
            continue
        if "main" not in fields.get("components", "").split():
            continue
        options = f"signed-by={fields['signed-by']}" if fields.get("signed-by", "").startswith("/") else ""
        yield fields.get("uris", "").split(), fields.get("suites", "").split(), options


def _os_codename() -> str:
    try:
        for line in Path("/etc/os-release").read_text().splitlines():
            if line.startswith("VERSION_CODENAME="):
                return line.split("=", 1)[1].strip().strip('"')
    except OSError:
        pass
    return ""


def _baked_files() -> list[tuple[str, Path]]:
    """(path inside the image, path on the machine) for every file the build copies in."""
    files = [(ENTRYPOINT_IN_IMAGE, standin_path("sparkctl-lab-entrypoint")), (RELEASES_IN_IMAGE, RELEASES_FILE),
             (VLLM_RELEASES_IN_IMAGE, VLLM_RELEASES_FILE), (SGLANG_RELEASES_IN_IMAGE, SGLANG_RELEASES_FILE),
             (PTH_IN_IMAGE, standin_path("sparkctl-lab.pth"))]
    files += [(f"/usr/local/bin/{name}", standin_path(name)) for name in IMAGE_STANDINS]
    lib = image_lib_dir()
    files += [(f"{PYTHON_LIB_IN_IMAGE}/{p.relative_to(lib)}", p) for p in sorted(lib.rglob("*.py"))
              if "__pycache__" not in p.parts]
    repos = fixture_repos_dir()
    files += [
        (f"{FIXTURE_REPOS_IN_IMAGE}/{p.relative_to(repos)}", p)
        for p in sorted(repos.rglob("*"))
        if p.is_file() and "__pycache__" not in p.parts
    ]
    return files


def _bootstrap_rootfs(tarball: Path, overlay: Path, log: Log | None = None) -> None:
    shutil.rmtree(overlay, ignore_errors=True)
    for inside, source in _baked_files():
        target = overlay / inside.lstrip("/")
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source, target)
        target.chmod(0o755 if inside.startswith("/usr/local/bin/") else 0o644)
    command = [
        "mmdebstrap",
        "--variant=apt",
        "--mode=root",
        "--format=tar",
        "--include=" + ",".join(IMAGE_PACKAGES),
        '--aptopt=Acquire::Languages "none"',
        # apt's download sandbox user `_apt` needs a world-writable /dev/null, which not every machine has.
        '--aptopt=APT::Sandbox::User "root"',
        *[f"--dpkgopt=path-exclude={pattern}" for pattern in DPKG_PATH_EXCLUDES],
        # The entrypoint makes fresh host keys per container; baked ones would be shared by every node.
        '--customize-hook=rm -f "$1"/etc/ssh/ssh_host_*',
        f'--customize-hook=cp -a {overlay}/. "$1"/',
        _os_codename() or "bookworm",
        str(tarball),
        *apt_mirrors(),
    ]
    _run(command, "mmdebstrap", timeout=1800, log=log)


def _import_rootfs(tarball: Path, recipe: str, ref: str) -> None:
    Path(IMAGE_STORE).mkdir(parents=True, exist_ok=True)
    Path(IMAGE_STORE_RUNROOT).mkdir(parents=True, exist_ok=True)
    changes = [
        f'CMD ["{ENTRYPOINT_IN_IMAGE}"]',
        f"LABEL {VERSION_LABEL}={TRTLLM_VERSION}",
        f"LABEL {RECIPE_LABEL}={recipe}",
        *[f"ENV {name}={value}" for name, value in image_env().items()],
    ]
    podman = ["podman", *podman_store_args()]
    change_args = [arg for change in changes for arg in ("--change", change)]
    _run([*podman, "import", "--quiet", *change_args, str(tarball), ref], "podman import", timeout=600)
    # This recipe's previous build (a --rebuild, now untagged) would otherwise stay in the store forever; the
    # images of other recipes are other checkouts' (their labs may be running) and stay.
    subprocess.run([*podman, "image", "prune", "-f"], capture_output=True, timeout=120)


#: How often a long build step says it is still working.
PROGRESS_EVERY_S = 10.0


def _run(command: list[str], what: str, timeout: int, log: Log | None = None) -> None:
    """Run a build step; with `log`, a line every PROGRESS_EVERY_S seconds while it runs."""
    started = time.monotonic()
    with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as proc:
        while True:
            try:
                stdout, stderr = proc.communicate(timeout=PROGRESS_EVERY_S)
                break
            except subprocess.TimeoutExpired:
                elapsed = time.monotonic() - started
                if elapsed > timeout:
                    proc.kill()
                    raise SparkctlError(f"lab image: {what} did not finish within {timeout} s") from None
                if log is not None:
                    log(f"lab image: {what} still running ({elapsed:.0f} s)")
    result = subprocess.CompletedProcess(command, proc.returncode, stdout, stderr)
    if result.returncode != 0:
        tail = "\n".join((result.stderr or result.stdout).strip().splitlines()[-15:])
        raise SparkctlError(f"lab image: {what} failed (exit {result.returncode}):\n{tail}",
                            hint=build_hint(result.stderr + result.stdout))


# apt's own words (apt 2.x: methods/connect.cc, apt-pkg/acquire-item.cc, cmdline/apt-get.cc) for a mirror that
# cannot be reached and for a package the mirror does not have; the kernel's for a full disk.
_UNREACHABLE_MIRROR = ("Failed to fetch", "Could not resolve", "Temporary failure resolving", "Could not connect",
                       "Unable to connect", "Connection timed out", "Connection failed")
_NO_PACKAGE = ("Unable to locate package", "has no installation candidate")


def build_hint(output: str) -> str | None:
    """The hint for what a build step's output shows; None when nothing here explains it (the output does)."""
    hints = []
    if any(w in output for w in _UNREACHABLE_MIRROR):
        hints.append("is the machine's apt mirror reachable? (the build fetches the lab packages from it)")
    if any(w in output for w in _NO_PACKAGE):
        hints.append("a lab package is not in the mirror's suite (lab/image.py IMAGE_PACKAGES)")
    if "No space left on device" in output:
        hints.append(f"the disk holding {IMAGE_STORE} or the temp directory is full")
    return "; ".join(hints) or None


@contextmanager
def _build_lock() -> Iterator[None]:
    LOCK_PATH.parent.mkdir(parents=True, exist_ok=True)
    with open(LOCK_PATH, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
