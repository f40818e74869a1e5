"""PURE vLLM checks: what goes wrong between vLLM's ranks across the Sparks, each with its evidence.

- vllm.ranks_one_node: two serving nodes' containers say the same VLLM_HOST_IP, or a rank's log has vLLM's own
  "Every node should have a unique IP address" (vllm/v1/executor/ray_executor.py at v0.20.1);
- vllm.ray_missing: Ray is the executor and the container has no `ray`;
- vllm.master_unreachable: a worker's node cannot open the master port on the head's fabric address while the head
  serves, or its rank keeps saying torch's "The client socket has failed to connect";
- vllm.flag_refused: a rank's log ends with `vllm serve`'s argparse refusal of a flag or value.
A rank on the wrong NIC (VLLM_HOST_IP, GLOO/TP_SOCKET_IFNAME) is container.py's check_env (vllm.wrong_nic).
"""

from __future__ import annotations

from sparkctl.doctor.catalog import VLLM_FLAG_REFUSED, VLLM_MASTER_UNREACHABLE, VLLM_RANKS_ONE_NODE, VLLM_RAY_MISSING
from sparkctl.doctor.checks.container import running_container
from sparkctl.doctor.findings import Finding, finding
from sparkctl.doctor.snapshot import Snapshot
from sparkctl.knowledge.serve_failures import VLLM_CAUSES
from sparkctl.plan.vllm import VllmLaunch
from sparkctl.rules.serving import serves

PHASE = "serve"
TAIL = 10


def _vllm(s: Snapshot) -> bool:
    return s.plan is not None and isinstance(s.plan.launch, VllmLaunch)


def _log_says(s: Snapshot, node: str, cause: str) -> list[str]:
    """The lines of `node`'s serve log tail that carry the signature of `cause` (knowledge/serve_failures.py)."""
    pattern = next(c.pattern for c in VLLM_CAUSES if c.name == cause)
    return [line for line in s.probe(node).serve_log_tail.splitlines() if pattern.search(line)]


def check_ranks_one_node(s: Snapshot) -> list[Finding]:
    if not _vllm(s):
        return []
    nodes = [n for n in s.order if serves(s.inventory, n)]
    said: dict[str, list[str]] = {}
    for node in nodes:
        info = running_container(s, node)
        if info is not None and info.env.get("VLLM_HOST_IP"):
            said.setdefault(info.env["VLLM_HOST_IP"], []).append(node)
    out = [finding(VLLM_RANKS_ONE_NODE, same[1], f"{' and '.join(same)} say the same VLLM_HOST_IP",
                   evidence=f"VLLM_HOST_IP={ip} in {', '.join(same)}'s containers: the ranks look like one node "
                            "to each other (vLLM with Ray refuses it: `Every node should have a unique IP address`)",
                   fix=f"each container's VLLM_HOST_IP its own node's fabric address: {s.bootstrap('container')}")
           for ip, same in said.items() if len(same) > 1]
    for node in nodes:
        lines = _log_says(s, node, "ranks on one node")
        if lines and not out:
            out.append(finding(VLLM_RANKS_ONE_NODE, node, "vLLM placed two ranks on one node",
                               evidence=lines[-1].strip()[:300], fix=f"{s.bootstrap('container')}, then "
                               f"{s.bootstrap('serve')}", phase=PHASE))
    return out


def check_ray(s: Snapshot) -> list[Finding]:
    if not _vllm(s):
        return []
    return [finding(VLLM_RAY_MISSING, node, f"Ray is the executor and {node}'s image has no `ray`",
                    evidence=f"`command -v ray` finds nothing in {s.inventory.container.name} "
                             f"({s.inventory.container.image}); serve.vllm.executor resolves to ray",
                    fix="an image with Ray (NVIDIA's vLLM images have it), or serve.vllm.executor: mp where the "
                        "release has --nnodes (vLLM 0.11.1 and later)")
            for node in s.order if s.probe(node).ray_found is False]


def check_master(s: Snapshot) -> list[Finding]:
    if not _vllm(s):
        return []
    head = s.inventory.head.name
    head_serves = head in s.facts and s.probe(head).health_status == 200
    out = []
    for node in s.order:
        reach = s.probe(node).rendezvous
        if reach is None or reach[1]:
            continue
        lines = _log_says(s, node, "master unreachable")
        if not head_serves and not lines:
            continue  # the head serves nothing: its own findings say why, and the master port is closed with it
        why = (f"the head answers /health, but {reach[0]} does not open from {node}" if head_serves
               else f"{reach[0]} does not open from {node}")
        out.append(finding(VLLM_MASTER_UNREACHABLE, node, f"{node}'s rank cannot reach the master on "
                           f"{head}", evidence=why + (f"; its log: {lines[-1].strip()[:200]}" if lines else ""),
                           fix=f"check the fabric link {node}-{head} (`sparkctl fabric bench`) and any firewall "
                               f"on {head} for TCP {reach[0].rpartition(':')[2]} on its fabric address",
                           details=tuple(lines[-3:])))
    return out


def check_flags(s: Snapshot) -> list[Finding]:
    if not _vllm(s):
        return []
    out = []
    for node in s.order:
        lines = _log_says(s, node, "vLLM flag refused")
        if lines:
            out.append(finding(VLLM_FLAG_REFUSED, node, f"vllm serve on {node} refused its command line",
                               evidence=lines[-1].strip()[:300],
                               fix="fix serve.args/serve.config in the inventory for the image's vLLM release "
                                   "(`sparkctl inventory validate` names the flag), then "
                                   f"{s.bootstrap('serve')}"))
    return out


CHECKS = [check_ranks_one_node, check_ray, check_master, check_flags]
