"""PURE serve checks: HF token and checkpoints in each node's cache, the server's port, /health, a completion
that is not degenerate, the unit that keeps it served, the gateway in front of it, and what NCCL really used
according to the serve log."""

from __future__ import annotations

from sparkctl.doctor.catalog import (
    HF_TOKEN_MISSING,
    MODEL_ABSENT,
    MODEL_CHANGED,
    MODEL_INCOMPLETE,
    NCCL_SOCKET_FALLBACK,
    NCCL_WARN,
    PORT_TAKEN,
    SERVE_COLLECTOR_DOWN,
    SERVE_DEGENERATE,
    SERVE_DOWN,
    SERVE_GATEWAY_DOWN,
    SERVE_HEALTH,
    SERVE_STUCK,
    SERVE_UNIT_DISABLED,
    SERVE_UNIT_FAILED,
    SERVE_UNIT_LOOPING,
    SERVE_UNIT_MISSING,
)
from sparkctl.doctor.findings import Finding, Severity, finding
from sparkctl.doctor.snapshot import NodeProbe, Snapshot, without_world
from sparkctl.facts.parse import listening_on
from sparkctl.knowledge.nccl import parse_nccl_log
from sparkctl.knowledge.serve_client import is_degenerate
from sparkctl.knowledge.serve_failures import likely_cause
from sparkctl.plan.collector import collector_name
from sparkctl.plan.gateway import ENGINE_HOST, GATEWAY_CONTAINER, ListenUnknown, listen_addresses
from sparkctl.plan.serve_unit import (
    LASTED_S,
    LOOPING_RUNS,
    failing_early,
    parse_exits,
    unit_summary,
)
from sparkctl.plan.world import world_names
from sparkctl.rules.serving import fell_back_to_sockets, has_unit, rdma_up, serves, serving_enabled

GATED_HINTS = ("meta-llama/", "/Llama-", "mistralai/", "google/gemma")
SERVER_NAMES = ("trtllm-serve", "python", "python3", "mpirun", "trtllm-llmapi-launch")



def serving_expected(s: Snapshot) -> bool:
    """sparkctl launched a server here before (its log exists on the world's head)."""
    return s.probe(s.inventory.serving_nodes()[0]).serve_log_exists


def is_gated(repo: str) -> bool:
    return any(h in repo for h in GATED_HINTS)


def check_models(s: Snapshot) -> list[Finding]:
    out: list[Finding] = []
    if not serving_enabled(s.inventory):
        return out
    token_env = s.inventory.serve.hf_token_env
    for node in s.order:
        if not serves(s.inventory, node):
            continue  # left out of the launch (more nodes than tp_size x pp_size): it needs no model
        probe = s.probe(node)
        for m in probe.models:
            if m.state == "complete" and m.changed:
                out.append(finding(MODEL_CHANGED, node, f"{m.changed} file(s) of {m.repo} changed since they were "
                                   "verified against the hashes the Hub recorded",
                                   evidence=f"their size, mtime or inode is not what "
                                            f"{s.facts[node].hf_cache}/sparkctl-verified/ recorded",
                                   fix=f"{s.bootstrap('model')} (reads them again; a wrong one is sent again from "
                                       "the head)"))
        pending = [m for m in probe.models if m.state != "complete"]
        for m in pending:
            if m.state == "incomplete":
                out.append(finding(MODEL_INCOMPLETE, node, f"{m.repo} is only partly downloaded",
                                   evidence=f"{m.detail or 'partial download'}; expected a complete checkpoint",
                                   fix=s.bootstrap('model')))
            else:
                out.append(finding(MODEL_ABSENT, node,
                                   f"{m.repo} is not in the HF cache", evidence=f"not under {s.facts[node].hf_cache}",
                                   fix=s.bootstrap('model'), severity="error" if _any_world_served(s) else "info"))
        if pending and probe.hf_token_file is False:
            gated = [m.repo for m in pending if is_gated(m.repo)]
            out.append(finding(HF_TOKEN_MISSING, node,
                               "no Hugging Face token on the node" + (" for a gated repo" if gated else ""),
                               evidence=f"no {s.facts[node].hf_cache}/token; still to download: "
                                        f"{', '.join(m.repo for m in pending)}",
                               fix=f"export {token_env}=hf_... then {s.bootstrap('model')} (writes the token "
                                   "file, mode 600)", severity="error" if gated else "warning"))
    return out


def serving_head(s: Snapshot) -> tuple[str, NodeProbe] | None:
    """The world's head and its probe, when the inventory serves and that node was read."""
    if not serving_enabled(s.inventory):
        return None
    head = s.inventory.serving_nodes()[0]
    return (head, s.probe(head)) if head in s.facts else None


def gateway_head(s: Snapshot) -> tuple[str, NodeProbe] | None:
    """The cluster's head (the gateway's node) and its probe, when the inventory serves and the head was read."""
    head = s.inventory.head.name
    if head not in s.facts or not serving_enabled(s.inventory):
        return None
    return head, s.probe(head)


def check_server(s: Snapshot) -> list[Finding]:
    if (found := serving_head(s)) is None or found[1].health_status is None:
        return []
    head, probe = found
    port = int(s.inventory.serve_spec().engine_port)
    owner = probe.port_owners.get(port) or (s.facts[head].listening_tcp.get(port) or "an unknown process"
                                            if port in s.facts[head].listening_tcp else None)
    if unit_trouble(probe):
        return []  # check_unit says why nothing serves, and its fix is this one's
    # `sparkctl serve stop` disables the unit: the server is down on purpose (check_unit says so)
    expected = serving_expected(s) and not unit_disabled(probe)
    tail = tuple(probe.serve_log_tail.splitlines()[-10:])
    if probe.health_status == 200:
        if probe.completion is not None and (not probe.completion.strip() or is_degenerate(probe.completion)):
            return [finding(SERVE_DEGENERATE, head, "the server answers with degenerate output",
                            evidence=f"completion: {probe.completion[:80]!r}; expected text",
                            fix="use a release with the Eagle3 SM12x fix (TensorRT-LLM #8615), or serve without "
                                "the draft (serve.decoding: none)")]
        if probe.completion is None and probe.completion_error:
            return [finding(SERVE_HEALTH, head, "/health answers but a completion fails",
                            evidence=probe.completion_error, fix=s.bootstrap('serve'), details=tail)]
        return []
    if owner is not None and not owner.startswith(SERVER_NAMES):
        return [finding(PORT_TAKEN, head, f"the engine's port {port} is taken by {owner}",
                        evidence=f"{owner} listens on {port}; /health answers {probe.health_status or 'nothing'}",
                        fix=f"stop {owner} on {head}, or set serve.engine_port to a free port", phase="serve")]
    if owner is None:
        return [finding(SERVE_DOWN, head, f"nothing serves on port {port}",
                        evidence="no process listens there" + ("; the server ran before (serve log)" if expected
                                                               else "; stopped by `sparkctl serve stop`"
                                                               if unit_disabled(probe) else "; not started yet"),
                        fix=s.bootstrap('serve'), details=tail, severity="error" if expected else "info")]
    return [finding(SERVE_HEALTH, head, f"/health on port {port} does not answer 200",
                    evidence=f"HTTP {probe.health_status or 'no answer'} from {owner}; ready means 200 (log: "
                             "`Application startup complete.`)",
                    fix=f"see the serve log; {s.bootstrap('serve')}", details=tail)]


def check_nccl(s: Snapshot) -> list[Finding]:
    out = []
    for node in s.order:
        text = s.probe(node).nccl_log
        if not text.strip():
            continue
        report = parse_nccl_log(text)
        f = s.facts[node]
        if fell_back_to_sockets(report, f):
            out.append(finding(NCCL_SOCKET_FALLBACK, node, "NCCL ran over TCP sockets, not RDMA",
                               evidence=f"`Using network Socket` with NCCL_IB_HCA={report.env.get('NCCL_IB_HCA', '')}"
                                        f"{' (NET/IB : No device found)' if report.ib_no_device else ''}; Up RoCE "
                                        f"devices: {', '.join(rdma_up(f)) or 'none'}",
                               fix=f"set NCCL_IB_HCA to the Up twins' devices ({s.bootstrap('container')}); "
                                   f"{s.bootstrap('serve')} restarts the server, and NCCL chooses its network anew"))
        for warning in report.warnings:
            bootstrap = warning.startswith("Bootstrap :")
            out.append(finding(NCCL_WARN, node, "NCCL warned in the serve log",
                               evidence=f"NCCL WARN {warning}",
                               fix="NCCL_SOCKET_IFNAME must name the node's Up fabric twins" if bootstrap else
                                   "see the serve log around this line", severity="error" if bootstrap else "warning"))
    return out


def check_gateway(s: Snapshot) -> list[Finding]:
    """The gateway runs on the head and listens where the plan says: without it the endpoint answers nowhere."""
    if (found := gateway_head(s)) is None or found[1].gateway is None:
        return []
    head, probe = found
    try:
        wanted = {*listen_addresses(s.inventory, s.facts[head]), ENGINE_HOST}
    except ListenUnknown:
        return []
    port = s.inventory.endpoint_port()
    severity: Severity = "error" if _any_world_served(s) else "info"
    if probe.gateway != "running":
        state = "absent" if probe.gateway == "absent" else probe.gateway
        return [finding(SERVE_GATEWAY_DOWN, head, f"the gateway in front of the engine is {state}",
                        evidence=f"container {GATEWAY_CONTAINER}: {state}; the endpoint answers on no address",
                        fix=s.bootstrap('serve'), severity=severity)]
    missing = sorted(wanted - listening_on(probe.gateway_ss, port))
    if missing:
        return [finding(SERVE_GATEWAY_DOWN, head,
                        f"the gateway does not listen on {', '.join(missing)}:{port}",
                        evidence=f"{GATEWAY_CONTAINER} runs; `ss` at port {port}: "
                                 f"{', '.join(sorted(listening_on(probe.gateway_ss, port))) or 'nothing'}",
                        fix=s.bootstrap('serve'), severity=severity)]
    return []


def check_collector(s: Snapshot) -> list[Finding]:
    """The world's figures collector runs on its head where the engine's own /metrics empties on read
    (plan/collector.py)."""
    if (found := serving_head(s)) is None or found[1].collector is None:
        return []
    head, probe = found
    if probe.collector == "running":
        return []
    return [finding(SERVE_COLLECTOR_DOWN, head, f"the figures collector is {probe.collector}",
                    evidence=f"container {collector_name(world_names(s.inventory))}: {probe.collector}; the engine's "
                             "iteration stats pile up unread, and its figures (/metrics through the gateway, top, "
                             "the watchdog's) are not read",
                    fix=s.bootstrap("serve"), severity="error" if serving_expected(s) else "info")]


def _any_world_served(s: Snapshot) -> bool:
    """sparkctl launched a world of the cluster before (its log exists on its head): serving_expected of any."""
    for world in s.inventory.worlds():
        probe = s.probe(world.nodes[0])
        if (probe.worlds.get(world.key) or without_world(probe) if world.key else probe).serve_log_exists:
            return True
    return False


#: this many stuck ends among the unit's recorded runs: it keeps getting stuck (an error, not history)
STUCK_AGAIN = 3


def unit_disabled(probe: NodeProbe) -> bool:
    return (probe.unit or {}).get("UnitFileState") == "disabled"


def looping_runs(probe: NodeProbe) -> int:
    """The runs in a row that ended by themselves early, when that many make a loop and the server does not
    answer; 0 otherwise."""
    early = failing_early(parse_exits(probe.unit_exits))
    return early if early >= LOOPING_RUNS and probe.health_status != 200 else 0


def unit_trouble(probe: NodeProbe) -> bool:
    """The unit failed, or loops: the server's state follows from it."""
    return (probe.unit or {}).get("ActiveState") == "failed" or looping_runs(probe) > 0


def check_unit(s: Snapshot) -> list[Finding]:
    """The unit that keeps the model served (plan/serve_unit.py), on the head (with vLLM on every serving node):
    installed, enabled, not failed, not looping."""
    if serving_head(s) is None:
        return []
    out: list[Finding] = []
    for node in s.order:
        probe = s.probe(node)
        if has_unit(s.inventory, node) and probe.unit is not None:
            out += _unit_findings(s, node, probe)
    return out


def _unit_findings(s: Snapshot, node: str, probe: NodeProbe) -> list[Finding]:
    unit = probe.unit or {}
    names = world_names(s.inventory)
    name = names.unit_name
    fix = s.bootstrap("serve")
    if unit.get("LoadState") == "not-found":
        return [finding(SERVE_UNIT_MISSING, node,
                        f"the serving unit {name} is not installed",
                        evidence=f"no {names.unit_path}: nothing serves the model again after a "
                                 "reboot or when the server ends", fix=fix,
                        severity="error" if serving_expected(s) else "info")]
    if unit_disabled(probe):
        return [finding(SERVE_UNIT_DISABLED, node, f"{name} is disabled: the model is not served, "
                        "and stays so across reboots", evidence=f"UnitFileState=disabled, {unit_summary(unit)}, as "
                        "`sparkctl serve stop` leaves it", fix=f"{fix} serves it again")]
    ends = parse_exits(probe.unit_exits)
    last = next((e for e in reversed(ends) if e.result != "asked"), None)
    said = f"; last end: {last.text()}" if last else ""
    cause = likely_cause(probe.serve_log_tail.splitlines())
    because = f"; likely cause (serve log): {cause[0]}" if cause else ""
    tail = tuple(probe.serve_log_tail.splitlines()[-10:])
    if unit.get("ActiveState") == "failed":
        return [finding(SERVE_UNIT_FAILED, node, f"{name} failed and does not start the server again",
                        evidence=f"Result={unit.get('Result', '?')}{said}{because}", fix=fix,
                        details=tail)]
    early = looping_runs(probe)
    if early:
        return [finding(SERVE_UNIT_LOOPING, node, f"{name} keeps starting the server and it keeps "
                        "ending", evidence=f"{early} runs in a row ended by themselves within {LASTED_S} s "
                        f"(restarts: {unit.get('NRestarts', '?')}, now {unit_summary(unit)}){said}{because}",
                        fix=f"see `sparkctl serve logs`; {fix} starts it from the planned files",
                        details=tail)]
    stuck = [e for e in ends if e.result == "stuck"]
    if stuck:
        again = len(stuck) >= STUCK_AGAIN
        return [finding(SERVE_STUCK, node, f"{name}'s world was stuck {len(stuck)} time(s) in its last "
                        f"{len(ends)} runs and started again by the watchdog" + (": it keeps getting stuck" if again
                                                                                  else ""),
                        evidence=f"last: {stuck[-1].text()}", severity="error" if again else "info",
                        fix="see `sparkctl serve logs` (the run before the restart: serve.log.1) around "
                            f"{stuck[-1].when}: what the engine and NCCL said as the tokens stopped; "
                            "serve.watchdog's stall_s and canary_s say how soon a stuck world is ended")]
    return []


CHECKS = [check_models, check_server, check_unit, check_gateway, check_collector, check_nccl]
