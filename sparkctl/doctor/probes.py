"""Active probes, ONE round trip per node (all nodes in parallel): pings across each link, ssh to the peers
from the node and from its container, the container's hostfile and keys, port owners, the HF cache, the
server's /health and a tiny completion on the head (asked inside its container, like the serve tasks do), the
NCCL lines of the serve log.

Everything here only reads: a probe never changes a node.
"""

from __future__ import annotations

import json
import posixpath
import re
from concurrent.futures import ThreadPoolExecutor

from sparkctl.doctor import node_probes
from sparkctl.doctor.snapshot import LinkProbe, ModelCache, NodeProbe, SshProbe
from sparkctl.engine.runner import DEFAULT_FORKS
from sparkctl.errors import Unreachable
from sparkctl.facts import Facts
from sparkctl.inventory import Inventory, Node
from sparkctl.inventory.serve import engine_port
from sparkctl.knowledge.serve_client import node_http_command
from sparkctl.plan import ClusterPlan
from sparkctl.plan.gateway import GATEWAY_CONTAINER
from sparkctl.plan.paths import CONTAINER_HF_HOME, HOSTFILE_PATH, SERVE_LOG, draft_dir, node_home, state_dir
from sparkctl.plan.serve_unit import EXITS_LOG, parse_show, show_command
from sparkctl.rules.fabric import exposed, exposure_script, management_addresses
from sparkctl.rules.mesh import (
    Try,
    container_tries,
    host_tries,
    link_pings,
    mesh_script,
    mesh_timeout,
    parse_pings,
    parse_verdicts,
    ping_script,
)
from sparkctl.rules.serving import has_unit, serving_enabled
from sparkctl.transport.base import Transport, q
from sparkctl.transport.framing import Framing

PROBE_TIMEOUT = 60.0
NCCL_LINES = 2000
LOG_LINES = 20
COMPLETION_PROMPT = "Reply with one short sentence about the sea."

_PRELUDE = """_has() { command -v "$1" >/dev/null 2>&1; }
if [ "$(id -u 2>/dev/null)" = 0 ]; then _S=""; elif sudo -n true >/dev/null 2>&1; then _S="sudo -n"; else _S=""; fi"""


def _section(nonce: str, name: str, body: str) -> str:
    # a subshell: a body may `exit` early without ending the whole probe
    return Framing(nonce).section(name, body, subshell=True)


def serve_log_path(inventory: Inventory, node: Node, facts: Facts | None) -> str:
    return posixpath.join(state_dir(inventory, node_home(inventory, node, facts)), SERVE_LOG)


def serve_port(inventory: Inventory) -> int:
    """Where the engine answers on the head (behind the gateway), without resolving the rest of the serve spec."""
    return engine_port(inventory.serve, len(inventory.nodes))


def model_repos(inventory: Inventory) -> list[tuple[str, str]]:
    """(role, repo) the serve spec needs in every node's HF cache."""
    try:
        spec = inventory.serve_spec()
    except Exception:  # noqa: BLE001 - an inventory without a servable model has nothing to check
        return []
    repos = [("model", spec.model)] if spec.model else []
    if spec.draft:
        repos.append(("draft", spec.draft))
    return repos


def _mesh_section(tries: list[Try]) -> str:
    return mesh_script(tries) or "true"


def _container_lines(inventory: Inventory, plan: ClusterPlan, node: str, order: list[str], nonce: str) -> str:
    """Inside the container: its hostfile, keys and ssh mesh (TensorRT-LLM's mpirun needs them; vLLM has none:
    whether its image has Ray where Ray is chosen instead), and the settings files that override sparkctl's."""
    if plan.vllm is not None:
        inner = [_section(nonce, "c-ray", "command -v ray") if plan.vllm.executor == "ray" else ""]
    else:
        inner = [_section(nonce, "c-hostfile", f"cat {HOSTFILE_PATH}"),
                 _section(nonce, "c-authkeys", "cat /root/.ssh/authorized_keys"),
                 _section(nonce, "c-ssh", _mesh_section(container_tries(plan.fabric, order, node)))]
    inner.append(_section(nonce, "c-settings", node_probes.CONTAINER_SETTINGS))
    return f"docker exec {q(inventory.container.name)} sh -c {q(chr(10).join(filter(None, inner)))} 2>&1"


def _master_reach(plan: ClusterPlan, inventory: Inventory) -> str:
    """Whether vLLM's master port answers from this node (a worker's rank connects there over the fabric): `open`,
    or `closed` with why."""
    assert plan.vllm is not None
    head = plan.vllm.serve[inventory.serving_nodes()[0]]
    address, port = head[head.index("--master-addr") + 1], head[head.index("--master-port") + 1]
    target = f"/dev/tcp/{address}/{port}"
    return (f"echo {q(f'{address}:{port}')}; if timeout 3 bash -c {q(f': <{target}')} 2>/dev/null; "
            "then echo open; else echo closed; fi")


def _model_lines(hf: str, repos: list[tuple[str, str]]) -> str:
    lines = []
    for _role, repo in repos:
        flat = repo.replace("/", "--")
        hub = f"{hf}/hub/models--{flat}"
        local = f"{hf}/{posixpath.relpath(draft_dir(repo), CONTAINER_HF_HOME)}"
        lines.append(f"""d=""; for c in {q(local)} {q(hub)}; do [ -d "$c" ] && {{ d=$c; break; }}; done
if [ -z "$d" ]; then echo {q('absent ' + repo)}
elif [ -n "$(find "$d" -name '*.incomplete' 2>/dev/null | head -n 1)" ]; then
  echo {q('incomplete ' + repo)} partial download in "$d"
elif [ -z "$(find -L "$d" -name config.json 2>/dev/null | head -n 1)" ]; then
  echo {q('incomplete ' + repo)} no config.json in "$d"
else echo {q('complete ' + repo)}; fi""")
    return "\n".join(lines) or "true"


def _http(container: str, url: str, body: str | None = None, timeout: int = 5) -> str:
    """HTTP status line then the body, asked from inside the container (host network: the server's loopback)
    with the serve tasks' own client; a request body goes on its stdin (a here-document), never argv."""
    command = node_http_command("POST" if body is not None else "GET", url, timeout)
    line = f"docker exec{' -i' if body is not None else ''} {q(container)} {command}"
    if body is None:
        return f"{line} </dev/null"
    end = "SPARKCTL_HTTP_BODY"
    while end in body:
        end += "_"
    # the client's first line of input is the Authorization value: none (the engine, on the head's loopback)
    return f"{line} <<'{end}'\n\n{body}\n{end}"


def probe_script(inventory: Inventory, plan: ClusterPlan | None, facts: Facts, node: str, order: list[str], *,
                 nonce: str, want_logs: bool = False) -> str:
    """The probe script of one node. `order`: the reachable nodes (peers to probe)."""
    inv_node = inventory.node(node)
    container = inventory.container.name
    info = facts.containers.get(container)
    ports = sorted({int(inventory.container.ssh_port), serve_port(inventory)})
    port_filter = " or ".join(f"sport = :{p}" for p in ports)
    log = serve_log_path(inventory, inv_node, facts)
    sections = [("ports", f"$_S ss -ltnpH {q('( ' + port_filter + ' )')} 2>/dev/null || ss -ltnpH")]
    sections += node_probes.probe_sections(inventory.topology)
    if plan is not None and inventory.topology != "single":
        routes = plan.nodes[node].routes if node in plan.nodes else None
        pings = ping_script(link_pings(plan.fabric, order, node, routes), inventory.fabric.mtu - 28)
        sections.append(("ping", pings or "true"))
        sections.append(("ssh", _mesh_section(host_tries(inventory, plan.fabric, order, node))))
    if info is not None and info.running:
        sections.append(("exposure", exposure_script(management_addresses(facts), int(inventory.container.ssh_port))))
    if info is not None and info.exists and (not info.running or info.status == "restarting" or want_logs):
        sections.append(("c-logs", f"docker logs --tail {LOG_LINES} {q(container)} 2>&1"))
    hf = facts.hf_cache or inventory.container.hf_cache
    sections.append(("hf-token", f'[ -s {q(hf + "/token")} ] && echo yes || echo no'))
    serving = serving_enabled(inventory)
    sections.append(("models", _model_lines(hf, model_repos(inventory) if serving else [])))
    sections.append(("serve-log", f"[ -f {q(log)} ] || exit 3; tail -n {LOG_LINES} {q(log)}"))
    sections.append(("nccl", f"grep -E 'NCCL|NET/' {q(log)} 2>/dev/null | tail -n {NCCL_LINES}"))
    if has_unit(inventory, node) and node != inventory.head.name:
        sections.append(("unit", show_command(inventory.cluster.name)))
        sections.append(("unit-exits", f"tail -n 20 {q(posixpath.join(posixpath.dirname(log), EXITS_LOG))}"))
        if plan is not None and plan.vllm is not None and "--master-addr" in plan.vllm.serve.get(
                inventory.serving_nodes()[0], []):
            sections.append(("vllm-master", _master_reach(plan, inventory)))
    if node == inventory.head.name and serving:
        port = serve_port(inventory)
        sections.append(("health", _http(container, f"http://127.0.0.1:{port}/health")))
        body = json.dumps({"model": inventory.serve_spec().model, "max_tokens": 24,
                           "messages": [{"role": "user", "content": COMPLETION_PROMPT}]})
        gateway_port = int(inventory.serve_spec().port)
        sections.append(("gateway", f"docker inspect -f '{{{{.State.Status}}}}' {GATEWAY_CONTAINER} 2>/dev/null "
                                    "|| echo absent"))
        sections.append(("gateway-listen", f"ss -ltnH 'sport = :{gateway_port}'"))
        sections.append(("unit", show_command(inventory.cluster.name)))
        sections.append(("unit-exits", f"tail -n 20 {q(posixpath.join(posixpath.dirname(log), EXITS_LOG))}"))
        sections.append(("completion", "[ \"$_health\" = 200 ] || exit 3\n"
                                       + _http(container, f"http://127.0.0.1:{port}/v1/chat/completions", body,
                                               60)))
    parts = [_PRELUDE]
    inside = _container_lines(inventory, plan, node, order, nonce) if info is not None and info.running and \
        plan is not None else ""
    if inside:
        # the container's mesh runs alongside the host's (other sshds, other targets): the probe costs the
        # slower of the two, not their sum
        parts.append(f'_C=$(mktemp 2>/dev/null) || _C=""\nif [ -n "$_C" ]; then {{ {inside}; }} >"$_C" 2>&1 & fi')
    for name, body in sections:
        if name == "health":
            parts.append(f"_health=$({body} | head -n 1)")
            parts.append(_section(nonce, name, "printf '%s\\n' \"$_health\""))
        else:
            parts.append(_section(nonce, name, body))
    if inside:
        parts.append(f'if [ -n "$_C" ]; then wait; cat "$_C"; rm -f "$_C"; else {inside}; fi')
    return "\n".join(parts) + "\nexit 0\n"


_SS_OWNER = re.compile(r':(?P<port>\d+)\s.*users:\(\("(?P<name>[^"]+)",pid=(?P<pid>\d+)')


def parse_probe(stdout: str, nonce: str) -> NodeProbe:
    sections = Framing(nonce).split(stdout)

    def text(name: str) -> str:
        s = sections.get(name)
        return s.output if s else ""

    probe = NodeProbe()
    probe.system = node_probes.system_probe({name: section.output for name, section in sections.items()})
    for line in text("ports").splitlines():
        m = _SS_OWNER.search(line)
        if m:
            probe.port_owners.setdefault(int(m["port"]), f"{m['name']} (pid {m['pid']})")
    for verdict, iface, peer, address in parse_pings(text("ping")):
        probe.pings.append(LinkProbe(iface, peer, address, verdict))
    probe.ssh = _ssh_results(text("ssh"))
    probe.container_ssh = _ssh_results(text("c-ssh"))
    if "c-hostfile" in sections:
        probe.container_hostfile = text("c-hostfile") if sections["c-hostfile"].ok else ""
        probe.container_authorized_keys = text("c-authkeys") if sections.get("c-authkeys") and \
            sections["c-authkeys"].ok else ""
    probe.container_logs = text("c-logs").strip()
    probe.exposed = exposed(text("exposure"))
    token = text("hf-token").strip()
    probe.hf_token_file = {"yes": True, "no": False}.get(token)
    for line in text("models").splitlines():
        state, _, rest = line.partition(" ")
        repo, _, detail = rest.partition(" ")
        if state in ("complete", "incomplete", "absent") and repo:
            probe.models.append(ModelCache(repo, state, detail.strip()))
    log = sections.get("serve-log")
    probe.serve_log_exists = bool(log and log.ok)
    probe.serve_log_tail = text("serve-log").strip() if probe.serve_log_exists else ""
    probe.nccl_log = text("nccl")
    if "health" in sections:
        status = text("health").strip()
        probe.health_status = int(status) if status.isdigit() else 0
    if "gateway" in sections:
        lines = text("gateway").strip().splitlines()
        probe.gateway = lines[-1].strip() if lines else "absent"
        probe.gateway_ss = text("gateway-listen")
    if "unit" in sections:
        probe.unit = parse_show(text("unit"))
        probe.unit_exits = text("unit-exits")
    if "c-ray" in sections:
        probe.ray_found = sections["c-ray"].ok
    if "vllm-master" in sections:
        target, _, verdict = text("vllm-master").strip().partition("\n")
        probe.vllm_master = (target.strip(), verdict.strip() == "open")
    completion = sections.get("completion")
    if completion and completion.ok:
        status, _, body = completion.output.partition("\n")
        probe.completion, probe.completion_error = _completion_text(status.strip(), body)
    return probe


def _ssh_results(text: str) -> list[SshProbe]:
    return [SshProbe(v.peer, v.target, v.state == "ok", v.error, v.state) for v in parse_verdicts("", text)]


def _completion_text(status: str, body: str) -> tuple[str | None, str]:
    if status != "200":
        return None, f"HTTP {status or 'no answer'}: {body.strip()[:200]}"
    try:
        choice = json.loads(body)["choices"][0]
        content = (choice.get("message") or {}).get("content")
        if content is None:
            content = choice.get("text", "")
        return str(content), ""
    except (ValueError, KeyError, IndexError, TypeError) as exc:
        return None, f"unreadable answer ({type(exc).__name__}): {body.strip()[:200]}"


def probe_node(transport: Transport, inventory: Inventory, plan: ClusterPlan | None, facts: Facts, order: list[str],
               *, want_logs: bool = False, timeout: float | None = None) -> NodeProbe:
    node = transport.node
    nonce = Framing().nonce
    script = probe_script(inventory, plan, facts, node, order, nonce=nonce, want_logs=want_logs)
    timeout = probe_timeout(len(order)) if timeout is None else timeout
    try:
        result = transport.run(script, timeout=timeout)
    except Unreachable as exc:  # lost mid-probe (stopped answering, closed, powered off): a finding, not a crash
        return NodeProbe(error=str(exc) or type(exc).__name__, lost=True)
    except Exception as exc:  # noqa: BLE001 - whatever else went wrong is said on the node, not raised
        return NodeProbe(error=str(exc) or type(exc).__name__)
    probe = parse_probe(result.stdout, nonce)
    if result.timed_out:
        probe.error = f"the probes timed out after {timeout:g}s"
    if plan is not None and inventory.topology != "single":
        # a pair whose try printed no verdict (the probe was cut short) is not checked, never silently fine
        why = probe.error or "no verdict printed"
        probe.ssh += _untried(host_tries(inventory, plan.fabric, order, node), probe.ssh, why)
        info = facts.containers.get(inventory.container.name)
        if info is not None and info.running and plan.vllm is None:
            probe.container_ssh += _untried(container_tries(plan.fabric, order, node), probe.container_ssh, why)
    return probe


def _untried(tries: list[Try], verdicts: list[SshProbe], why: str) -> list[SshProbe]:
    seen = {(v.peer, v.target) for v in verdicts}
    return [SshProbe(t.peer, t.target, False, why, "unknown") for t in tries if (t.peer, t.target) not in seen]


def probe_timeout(nodes: int) -> float:
    """The probe round trip's limit: the host and container meshes (in parallel) retried to their limits."""
    return max(PROBE_TIMEOUT, mesh_timeout(max(0, nodes - 1)) + 30)


def run_probes(transports: dict[str, Transport], inventory: Inventory, plan: ClusterPlan | None,
               facts: dict[str, Facts], *, want_logs: bool = False, forks: int = DEFAULT_FORKS) -> dict[str, NodeProbe]:
    order = [n.name for n in inventory.nodes if n.name in facts]
    names = [n for n in order if n in transports]
    if not names:
        return {}
    with ThreadPoolExecutor(max_workers=max(1, min(forks, len(names)))) as pool:
        futures = {n: pool.submit(probe_node, transports[n], inventory, plan, facts[n], order, want_logs=want_logs)
                   for n in names}
        return {n: f.result() for n, f in futures.items()}
