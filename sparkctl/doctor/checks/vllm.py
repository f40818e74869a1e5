"""PURE vLLM checks: what goes wrong between vLLM's ranks across the Sparks that other engines do not have, each with
its evidence (what every engine of one rank per node shares: ranks.py).

- vllm.ranks_one_node: a rank's log has vLLM's own "Every node should have a unique IP address"
  (vllm/v1/executor/ray_executor.py at v0.20.1), where Ray placed two ranks on one node;
- vllm.ray_missing: Ray is the executor and the container has no `ray`.
"""

from __future__ import annotations

from sparkctl.doctor.catalog import VLLM_RANKS_ONE_NODE, VLLM_RAY_MISSING
from sparkctl.doctor.checks.ranks import check_same_address, log_says
from sparkctl.doctor.findings import Finding, Phase, finding
from sparkctl.doctor.snapshot import Snapshot
from sparkctl.plan.vllm import VllmLaunch
from sparkctl.rules.serving import serves

PHASE: Phase = "serve"


def _vllm(s: Snapshot) -> bool:
    return s.plan is not None and isinstance(s.plan.launches[s.inventory.world_key], VllmLaunch)


def check_ranks_one_node(s: Snapshot) -> list[Finding]:
    """Ray placed two ranks on one node, as vLLM's log says it (the containers' own addresses: ranks.py)."""
    if not _vllm(s) or check_same_address(s):
        return []
    for node in (n for n in s.order if serves(s.inventory, n)):
        lines = log_says(s, node, s.inventory.engine(), "ranks on one node")
        if lines:
            return [finding(VLLM_RANKS_ONE_NODE, node, "vLLM placed two ranks on one node",
                            evidence=lines[-1].strip()[:300], fix=f"{s.bootstrap('container')}, then "
                            f"{s.bootstrap('serve')}", phase=PHASE)]
    return []


def check_ray(s: Snapshot) -> list[Finding]:
    if not _vllm(s):
        return []
    return [finding(VLLM_RAY_MISSING, node, f"Ray is the executor and {node}'s image has no `ray`",
                    evidence=f"`command -v ray` finds nothing in {s.inventory.container.name} "
                             f"({s.inventory.container.image}); serve.vllm.executor resolves to ray",
                    fix="an image with Ray (NVIDIA's vLLM images have it), or serve.vllm.executor: mp where the "
                        "release has --nnodes (vLLM 0.11.1 and later)")
            for node in s.order if s.probe(node).ray_found is False]


CHECKS = [check_ranks_one_node, check_ray]
