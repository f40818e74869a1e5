"""PURE checks of the nodes' own software: the GPU driver against the CUDA of the image it runs, and the same
driver, kernel and CX-7 firmware on every node (a mismatch is a known cause of hangs at NCCL init)."""

from __future__ import annotations

from collections import Counter

from sparkctl.doctor.catalog import (
    GPU_DRIVER_MISMATCH,
    GPU_DRIVER_TOO_OLD,
    NODE_KERNEL_MISMATCH,
    ROCE_FIRMWARE_MISMATCH,
)
from sparkctl.doctor.findings import Finding, Phase, finding
from sparkctl.doctor.snapshot import Snapshot
from sparkctl.knowledge.cuda import driver_problem

PHASE: Phase = "container"


def _image_cuda(s: Snapshot, node: str) -> str:
    info = s.facts[node].containers.get(s.inventory.container.name)
    return (info.env.get("CUDA_VERSION", "") if info is not None and info.exists else "") or ""


def check_driver_for_image(s: Snapshot) -> list[Finding]:
    out = []
    for node in s.order:
        system = s.probe(node).system
        image_cuda = _image_cuda(s, node)
        problem = driver_problem(system.driver, system.cuda, image_cuda) if system.driver else None
        if problem is None:
            continue
        severity, why = problem
        out.append(finding(GPU_DRIVER_TOO_OLD, node, "the GPU driver is older than the image's CUDA",
                           evidence=f"{why} (image {s.inventory.container.image}, CUDA_VERSION={image_cuda})",
                           fix=f"update the NVIDIA driver on {node} (DGX OS: sudo apt update && sudo apt full-upgrade; "
                               "a person must, then reboot), or pick an image built for this driver",
                           severity=severity))
    return out


def _fw_of(s: Snapshot, node: str) -> str:
    hcas = s.probe(node).system.hcas or {}
    versions = sorted({h.fw for h in hcas.values() if h.fw})
    return ",".join(versions)


def _mismatches(s: Snapshot, what: dict[str, str]) -> tuple[str, dict[str, str]]:
    """(the reference value, the nodes that differ from it): the head's when it has one, else the most common."""
    known = {n: v for n, v in what.items() if v}
    if len(set(known.values())) < 2:
        return "", {}
    head = s.inventory.head.name
    reference = known.get(head) or Counter(known.values()).most_common(1)[0][0]
    return reference, {n: v for n, v in known.items() if v != reference}


def _differing(s: Snapshot, values: dict[str, str], what: str) -> list[tuple[str, str, str]]:
    """(node, the finding's evidence, its fix) for each node whose value differs from the others'."""
    reference, differ = _mismatches(s, values)
    everyone = ", ".join(f"{n} {v}" for n, v in values.items() if v)
    return [(node, f"{value} here, {reference} on the others ({everyone}); mixed versions are a known cause of hangs "
                   "at NCCL init", f"bring {what} of every node to one version (a person must: an update and a reboot)")
            for node, value in differ.items()]


def check_same_everywhere(s: Snapshot) -> list[Finding]:
    if len(s.order) < 2:
        return []
    out: list[Finding] = []
    for node, evidence, fix in _differing(s, {n: s.probe(n).system.driver for n in s.order}, "the NVIDIA driver"):
        out.append(finding(GPU_DRIVER_MISMATCH, node, "the GPU driver differs from the other nodes'",
                           evidence=evidence, fix=fix))
    for node, evidence, fix in _differing(s, {n: s.probe(n).system.kernel for n in s.order}, "the kernel"):
        out.append(finding(NODE_KERNEL_MISMATCH, node, "the kernel differs from the other nodes'",
                           evidence=evidence, fix=fix))
    for node, evidence, fix in _differing(s, {n: _fw_of(s, n) for n in s.order},
                                          "the CX-7 firmware (DGX OS firmware update, or mlxfwmanager)"):
        out.append(finding(ROCE_FIRMWARE_MISMATCH, node, "the CX-7 firmware differs from the other nodes'",
                           evidence=evidence, fix=fix))
    return out


CHECKS = [check_driver_for_image, check_same_everywhere]
