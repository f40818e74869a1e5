"""PURE checks of the engines whose ranks meet by themselves (one server per node: vLLM, SGLang), each with its
evidence; each engine's findings by id below, their signatures in knowledge/serve_failures.py.

- <engine>.ranks_one_node: two serving nodes' containers advertise the same address (the engine's host-IP variable);
- <engine>.master_unreachable / dist_unreachable: a worker's node cannot open the head's rendezvous address over the
  fabric while the head serves, or its rank keeps saying torch's "The client socket has failed to connect";
- <engine>.flag_refused: a rank's log ends with the server's argparse refusal of a flag or value.
A rank on the wrong NIC (its host-IP variable, its control interfaces) is container.py's check_env.
"""

from __future__ import annotations

from sparkctl.doctor.catalog import FINDINGS
from sparkctl.doctor.checks.container import running_container
from sparkctl.doctor.findings import Finding, Phase, finding
from sparkctl.doctor.snapshot import Snapshot
from sparkctl.engines import Engine, EngineName
from sparkctl.knowledge.serve_failures import SGLANG_CAUSES, VLLM_CAUSES, Cause
from sparkctl.rules.serving import serves, serving_enabled

PHASE: Phase = "serve"

_CAUSES: dict[EngineName, tuple[Cause, ...]] = {"vllm": VLLM_CAUSES, "sglang": SGLANG_CAUSES}
_SAME_ADDRESS: dict[EngineName, str] = {"vllm": "vllm.ranks_one_node", "sglang": "sglang.ranks_one_node"}
_RENDEZVOUS: dict[EngineName, str] = {"vllm": "vllm.master_unreachable", "sglang": "sglang.dist_unreachable"}
_FLAG_REFUSED: dict[EngineName, str] = {"vllm": "vllm.flag_refused", "sglang": "sglang.flag_refused"}


def _own_ranks(s: Snapshot) -> Engine | None:
    """The engine, when it serves and its ranks meet by themselves."""
    engine = s.inventory.engine()
    return engine if s.plan is not None and serving_enabled(s.inventory) and engine.unit_per_rank else None


def log_says(s: Snapshot, node: str, engine: Engine, cause: str) -> list[str]:
    """The lines of `node`'s serve log tail that carry the engine's signature of `cause`."""
    pattern = next(c.pattern for c in _CAUSES[engine.name] if c.name == cause)
    return [line for line in s.probe(node).serve_log_tail.splitlines() if pattern.search(line)]


def check_same_address(s: Snapshot) -> list[Finding]:
    engine = _own_ranks(s)
    if engine is None or engine.host_ip_env is None:
        return []
    setting = engine.host_ip_env
    said: dict[str, list[str]] = {}
    for node in (n for n in s.order if serves(s.inventory, n)):
        info = running_container(s, node)
        if info is not None and info.env.get(setting):
            said.setdefault(info.env[setting], []).append(node)
    return [finding(FINDINGS[_SAME_ADDRESS[engine.name]], same[1], f"{' and '.join(same)} say the same {setting}",
                    evidence=f"{setting}={ip} in {', '.join(same)}'s containers: the ranks look like one node to "
                             "each other",
                    fix=f"each container's {setting} its own node's fabric address: {s.bootstrap('container')}")
            for ip, same in said.items() if len(same) > 1]


def check_rendezvous(s: Snapshot) -> list[Finding]:
    engine = _own_ranks(s)
    if engine is None:
        return []
    head = s.inventory.serving_nodes()[0]  # the world's
    head_serves = head in s.facts and s.probe(head).health_status == 200
    out = []
    for node in s.order:
        reach = s.probe(node).rendezvous
        if reach is None or reach[1]:
            continue
        lines = log_says(s, node, engine, "rendezvous unreachable")
        if not head_serves and not lines:
            continue  # the head serves nothing: its own findings say why, and its rendezvous is closed with it
        why = (f"the head answers /health, but {reach[0]} does not open from {node}" if head_serves
               else f"{reach[0]} does not open from {node}")
        out.append(finding(FINDINGS[_RENDEZVOUS[engine.name]], node, f"{node}'s rank cannot reach the head's "
                           f"rendezvous on {head}", evidence=why + (f"; its log: {lines[-1].strip()[:200]}"
                                                                    if lines else ""),
                           fix=f"check the fabric link {node}-{head} (`sparkctl fabric bench`) and any firewall "
                               f"on {head} for TCP {reach[0].rpartition(':')[2]} on its fabric address",
                           details=tuple(lines[-3:])))
    return out


def check_flags(s: Snapshot) -> list[Finding]:
    engine = _own_ranks(s)
    if engine is None:
        return []
    out = []
    for node in s.order:
        lines = log_says(s, node, engine, "flag refused")
        if lines:
            out.append(finding(FINDINGS[_FLAG_REFUSED[engine.name]], node, f"{engine.server} on {node} refused its "
                               "command line", evidence=lines[-1].strip()[:300],
                               fix=f"fix serve.args/serve.config in the inventory for the image's {engine.label} "
                                   "release (`sparkctl inventory validate` names the flag), then "
                                   f"{s.bootstrap('serve')}"))
    return out


CHECKS = [check_same_address, check_rendezvous, check_flags]
