"""Lab stand-ins: scripts that play the parts of Spark software a lab machine does not have.

`node-bin/` is installed by the lab runtime over each node's /usr/local/bin (docker wrapper, the
socket of its daemon (dockerd, run as docker.service), ibdev2netdev, ibv_devinfo, show_gids, nvidia-smi, udevadm);
`image-bin/` is baked into the lab image's /usr/local/bin
(entrypoint, trtllm-llmapi-launch, trtllm-serve, vllm, ray, hf, all_reduce_perf). Copy them with mode 0755: a wheel need
not keep the executable bit. `image-lib/` holds the stand-ins that are Python modules (`python3 -m
sglang.launch_server`), baked into the image on its python3's path (sparkctl-lab.pth).
"""

from __future__ import annotations

from pathlib import Path

STANDINS_DIR = Path(__file__).resolve().parent
NODE_STANDINS = ("docker", "dockerd", "ibdev2netdev", "ibv_devinfo", "show_gids", "nvidia-smi", "udevadm",
                 "ib_write_bw", "ib_write_lat")
IMAGE_STANDINS = ("trtllm-llmapi-launch", "trtllm-serve", "vllm", "ray", "hf", "all_reduce_perf")
IMAGE_ENTRYPOINT = "sparkctl-lab-entrypoint"


def node_bin_dir() -> Path:
    return STANDINS_DIR / "node-bin"


def image_bin_dir() -> Path:
    return STANDINS_DIR / "image-bin"


def image_lib_dir() -> Path:
    return STANDINS_DIR / "image-lib"


def standin_path(name: str) -> Path:
    """The script file of stand-in `name` (e.g. "docker", "trtllm-serve", "sparkctl-lab-entrypoint")."""
    for directory in (node_bin_dir(), image_bin_dir(), STANDINS_DIR):
        path = directory / name
        if path.is_file():
            return path
    raise FileNotFoundError(f"no lab stand-in named {name!r} in {STANDINS_DIR}")


def fixture_repos_dir() -> Path:
    """The small fake Hugging Face repos the `hf` stand-in downloads from."""
    return STANDINS_DIR.parent / "fixture_repos"
