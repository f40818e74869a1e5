"""Which NVIDIA driver a container's CUDA needs, and which NCCL/UCX settings take a run off the fabric.

Driver: NVIDIA, "CUDA Compatibility", Minor Version Compatibility, Table 1 (docs.nvidia.com/deploy/cuda-compatibility/
minor-version-compatibility.html): an application built with any CUDA 13.x runs on a driver >= 580, 12.x on >= 525,
11.x on >= 450 ("with limited feature-set"; newer minor versions want the toolkit's own driver for every feature).
Forward compatibility (an older driver major with cuda-compat) is for data-center GPUs only, so a Spark's driver
must belong to the container CUDA's major family. NGC images (the TensorRT-LLM release images among them) say
their CUDA in the image env, `CUDA_VERSION=13.0.2` and `NVIDIA_REQUIRE_CUDA=cuda>=13.0 ...`: read, never guessed.

NCCL: NCCL's documentation, "Environment Variables": variables set in the environment win over /etc/nccl.conf and
~/.nccl.conf; NCCL_IB_DISABLE=1 and NCCL_NET=Socket make NCCL use TCP sockets instead of RoCE.
"""

from __future__ import annotations

import re
from typing import Literal

#: CUDA major -> the oldest driver branch that runs it (minor version compatibility).
MIN_DRIVER_BRANCH = {11: 450, 12: 525, 13: 580}

#: Settings that take NCCL off RDMA whatever sparkctl sets: (name, value) -> why.
OFF_THE_FABRIC = {
    ("NCCL_IB_DISABLE", "1"): "NCCL_IB_DISABLE=1 turns RoCE off: NCCL falls back to TCP sockets",
    ("NCCL_NET", "Socket"): "NCCL_NET=Socket makes NCCL use TCP sockets instead of RoCE",
}


def _numbers(version: str) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", version)[:3])


def cuda_major_minor(version: str) -> tuple[int, int] | None:
    n = _numbers(version)
    return (n[0], n[1] if len(n) > 1 else 0) if n else None


def driver_problem(driver: str, driver_cuda: str, image_cuda: str) -> tuple[Literal["error", "warning"], str] | None:
    """(severity, why) when a node's driver cannot (error) or can only partly (warning) run the image's CUDA."""
    image = cuda_major_minor(image_cuda)
    branch = _numbers(driver)[:1]
    if image is None or not branch:
        return None
    need = MIN_DRIVER_BRANCH.get(image[0])
    if need is not None and branch[0] < need:
        return "error", (f"the image's CUDA {image_cuda} needs a driver {need} or newer (CUDA {image[0]}.x minor "
                         f"version compatibility); the node has {driver}")
    supported = cuda_major_minor(driver_cuda)
    if supported is not None and supported < image:
        return "warning", (f"the driver {driver} supports CUDA {driver_cuda}, the image has {image_cuda}: it runs "
                           "under minor version compatibility, without the newer CUDA's features (PTX built for "
                           f"{image[0]}.{image[1]} does not load)")
    return None


def off_the_fabric(name: str, value: str) -> str | None:
    return OFF_THE_FABRIC.get((name, value.strip()))
