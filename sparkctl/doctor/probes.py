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
import socket
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace

from sparkctl.doctor import node_probes
from sparkctl.doctor.snapshot import LinkProbe, ModelCache, NodeProbe, SshProbe, without_world
from sparkctl.errors import Unreachable
from sparkctl.facts import ContainerInfo, Facts
from sparkctl.inventory import Inventory, Node
from sparkctl.inventory.serve import engine_port
from sparkctl.knowledge.nccl import log_lines_script
from sparkctl.knowledge.serve_client import node_http_command
from sparkctl.plan import ClusterPlan, hub_hashes
from sparkctl.plan.collector import collector_name
from sparkctl.plan.gateway import ENGINE_HOST, GATEWAY_CONTAINER, ListenUnknown, listen_addresses
from sparkctl.plan.paths import CONTAINER_HF_HOME, HOSTFILE_PATH, draft_dir, node_home, state_dir
from sparkctl.plan.revisions import repo_folder
from sparkctl.plan.serve_unit import EXITS_LOG, parse_show, show_command
from sparkctl.plan.world import world_names
from sparkctl.rules.fabric import (
    exposed,
    exposure_script,
    is_ipv4,
    listening_on_management,
    management_addresses,
)
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
from sparkctl.rules.serving import has_unit, serving_enabled, without_mpi
from sparkctl.shipped import shipped_text
from sparkctl.taskgraph.runner import DEFAULT_FORKS
from sparkctl.transport.base import Transport, q
from sparkctl.transport.framing import Framing, Section, held_output

PROBE_TIMEOUT = 60.0
NCCL_LINES = 2000
LOG_LINES = 20
COMPLETION_PROMPT = "Reply with one short sentence about the sea."

def _section(nonce: str, name: str, body: str) -> str:
    # a subshell: a body may `exit` early without ending the whole probe
    return Framing(nonce).section(name, body, subshell=True)


def serve_log_path(inventory: Inventory, node: Node, facts: Facts | None) -> str:
    """The serve log of the world `inventory` sees (the first world's for the whole inventory) on `node`."""
    home = node_home(inventory, node, facts)
    return posixpath.join(state_dir(inventory, home), world_names(inventory).log)


def serve_port(inventory: Inventory) -> int:
    """Where the engine answers on the head (behind the gateway), without resolving the rest of the serve spec."""
    return engine_port(inventory.serve, len(inventory.nodes))


def model_repos(inventory: Inventory, node: str | None = None) -> list[tuple[str, str]]:
    """(role, repo) the serve spec needs in a node's HF cache: of every world on `node` (None: the first world's)."""
    if node is not None and len(inventory.worlds()) > 1:
        views = [inventory.for_world(w) for w in inventory.worlds() if node in w.nodes]
        return list(dict.fromkeys(repo for view in views for repo in model_repos(view)))
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


def _model_lines(hf: str, repos: list[tuple[str, str]]) -> str:
    lines = []
    for role, repo in repos:
        hub = f"{hf}/hub/{repo_folder(repo)}"
        local = f"{hf}/{posixpath.relpath(draft_dir(repo), CONTAINER_HF_HOME)}"
        lines.append(f"probe_model {q(repo)} {q(local)} {q(hub)}")
        if role == "draft":
            changed = hub_hashes.changed_local_since_verified_script(local, hub_hashes.record_path(hf, local))
        else:
            changed = hub_hashes.changed_since_verified_script(hub, hub_hashes.record_path(hf, hub))
        lines.append(f"n=$( ({changed}) | wc -l); [ \"$n\" -gt 0 ] && echo {q('changed ' + repo)} \"$n\"")
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


def _reach(where: str) -> str:
    """Whether `address:port` answers from this node (a worker's rank connects there over the fabric): `open`,
    or `closed`."""
    address, _, port = where.rpartition(":")
    target = f"/dev/tcp/{address}/{port}"
    return (f"echo {q(where)}; if timeout 3 bash -c {q(f': <{target}')} 2>/dev/null; "
            "then echo open; else echo closed; fi")


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


@dataclass(frozen=True)
class Where:
    """What a node's probe is rendered from: the inventory, the plan (None: none could be made), the node's facts,
    the node, the reachable nodes in order (the peers to probe), and whether logs are wanted (--bundle)."""

    inventory: Inventory
    plan: ClusterPlan | None
    facts: Facts
    node: str
    order: list[str]
    want_logs: bool = False
    #: (node, address, port) this node asks over the management network (another node's listeners)
    targets: tuple[tuple[str, str, int], ...] = ()
    #: with several worlds, the one a world section reads (Inventory.for_world; None: the inventory's only one)
    world: Inventory | None = None
    #: where that world's API server answers (Launch.host)
    world_host: str = ENGINE_HOST

    @property
    def container(self) -> ContainerInfo | None:
        return self.facts.containers.get(self.inventory.container.name)

    @property
    def running(self) -> bool:
        return self.container is not None and self.container.running

    @property
    def head(self) -> bool:
        """The cluster's head: the gateway's node."""
        return self.node == self.inventory.head.name

    @property
    def served(self) -> Inventory:
        """The inventory as the world a world section reads sees it."""
        return self.world or self.inventory

    @property
    def world_head(self) -> bool:
        """The node of the world's rank 0 (its API server)."""
        return self.served.serving_nodes()[0] == self.node

    @property
    def suffix(self) -> str:
        """What a world section's name, and its shell variables, add for a world other than the first."""
        return world_names(self.served).suffix

    @property
    def health_var(self) -> str:
        return "_health" + self.suffix.replace("-", "_")

    @property
    def serving(self) -> bool:
        return serving_enabled(self.inventory)

    @property
    def log(self) -> str:
        return serve_log_path(self.served, self.inventory.node(self.node), self.facts)

    @property
    def hf(self) -> str:
        return self.facts.hf_cache or self.inventory.container.hf_cache

    @property
    def meshed(self) -> bool:
        """A plan with peers to try (not a single node)."""
        return self.plan is not None and self.inventory.topology != "single"


@dataclass(frozen=True)
class ProbeSection:
    """One section of a node's probe, in one place: its name, its shell from what the probe is rendered from (None:
    not on this node), and what its output sets in NodeProbe (called only when the section came back)."""

    name: str
    script: Callable[[Where], str | None]
    #: what the section's output sets: the probe with those fields replaced (mypy checks every name and type), or None
    #: when the read set them on the probe itself
    read: Callable[[NodeProbe, Section], NodeProbe | None]
    #: shell run before the section, outside its subshell (what a later section reads: /health's status)
    before: Callable[[Where], str] | None = None


def _ports(w: Where) -> str:
    engines = {serve_port(w.inventory.for_world(world)) for world in w.inventory.worlds() if w.node in world.nodes} \
        if len(w.inventory.worlds()) > 1 else {serve_port(w.inventory)}
    ports = sorted({int(w.inventory.container.ssh_port), *engines})
    port_filter = " or ".join(f"sport = :{p}" for p in ports)
    return f"\"${{_S[@]}}\" ss -ltnpH {q('( ' + port_filter + ' )')} 2>/dev/null || ss -ltnpH"


def _read_ports(p: NodeProbe, s: Section) -> None:
    for line in s.output.splitlines():
        m = _SS_OWNER.search(line)
        if m:
            p.port_owners.setdefault(int(m["port"]), f"{m['name']} (pid {m['pid']})")


def _pings(w: Where) -> str | None:
    if not w.meshed or w.plan is None:
        return None
    routes = w.plan.nodes[w.node].routes if w.node in w.plan.nodes else None
    return ping_script(link_pings(w.plan.fabric, w.order, w.node, routes), w.inventory.fabric.mtu - 28) or "true"


def _read_pings(p: NodeProbe, s: Section) -> None:
    p.pings += [LinkProbe(iface, peer, address, verdict) for verdict, iface, peer, address in parse_pings(s.output)]


def _read_models(p: NodeProbe, s: Section) -> None:
    for line in s.output.splitlines():
        state, _, rest = line.partition(" ")
        repo, _, detail = rest.partition(" ")
        if state in ("complete", "incomplete", "absent") and repo:
            p.models.append(ModelCache(repo, state, detail.strip()))
        elif state == "changed" and detail.strip().isdigit():
            p.models = [replace(m, changed=int(detail)) if m.repo == repo else m for m in p.models]


def _read_serve_log(p: NodeProbe, s: Section) -> None:
    p.serve_log_exists = s.ok
    p.serve_log_tail = s.output.strip() if s.ok else ""


def _unit_here(w: Where) -> bool:
    return (w.world_head and w.serving) or (has_unit(w.served, w.node) and not w.world_head)


def _rendezvous(w: Where) -> str | None:
    if w.world_head or not has_unit(w.served, w.node) or w.plan is None:
        return None
    where = w.plan.launches[w.served.world_key].rendezvous()
    return _reach(where) if where else None


def _read_rendezvous(p: NodeProbe, s: Section) -> None:
    target, _, verdict = s.output.strip().partition("\n")
    p.rendezvous = (target.strip(), verdict.strip() == "open")


def _completion(w: Where) -> str | None:
    if not (w.world_head and w.serving):
        return None
    body = json.dumps({"model": w.served.serve_spec().served_name, "max_tokens": 24,
                       "messages": [{"role": "user", "content": COMPLETION_PROMPT}]})
    url = f"http://{w.world_host}:{serve_port(w.served)}/v1/chat/completions"
    return f"[ \"${w.health_var}\" = 200 ] || exit 3\n" + _http(w.inventory.container.name, url, body, 60)


def _read_completion(p: NodeProbe, s: Section) -> None:
    if s.ok:
        status, _, body = s.output.partition("\n")
        p.completion, p.completion_error = _completion_text(status.strip(), body)


def _answers(w: Where) -> str | None:
    """A TCP connection to each target, all at once (a port that drops it costs its wait once): `open NODE IP
    PORT` for each that accepted. Started when the probe starts (`_A`, its output file), so its wait runs beside
    the other sections."""
    if not w.targets:
        return None
    targets = " ".join(f"{q(node)} {q(ip)} {int(port)}" for node, ip, port in w.targets)
    return f"probe_answers {ANSWER_WAIT_S} {targets}"


def _answers_started(w: Where) -> str | None:
    """The asking, in the background from the probe's start (its output in "$_A")."""
    asking = _answers(w)
    if asking is None:
        return None
    return (f'_A=$(mktemp 2>/dev/null) || _A=""\n'
            f'if [ -n "$_A" ]; then {{ {asking}\n}} >"$_A" 2>&1 3>&- & _AP=$!; fi')


def _answers_collected(w: Where) -> str | None:
    """What the asking found, once it is done (asked here when no temp file could be made)."""
    asking = _answers(w)
    if asking is None:
        return None
    return f'if [ -n "$_A" ]; then wait "$_AP"; cat "$_A"; rm -f "$_A"; else\n{asking}\nfi'


def _read_answers(p: NodeProbe, s: Section) -> NodeProbe:
    answered = []
    for line in s.output.splitlines():
        fields = line.split()
        if len(fields) == 4 and fields[0] == "open" and fields[3].isdigit():
            answered.append((fields[1], fields[2], int(fields[3])))
    return replace(p, answered=answered)


def _read_versions(p: NodeProbe, s: Section) -> None:
    versions = node_probes.parse_versions(s.output)
    p.system.kernel, p.system.driver, p.system.cuda = (versions.get(k, "") for k in ("kernel", "driver", "cuda"))


#: what served-certificate.py prints when nothing at the address speaks TLS
SERVED_NO_TLS = "no TLS:"


def _served_certificate(w: Where) -> str | None:
    if not (w.head and w.serving and w.inventory.serve.tls is not None):
        return None
    try:
        address = listen_addresses(w.inventory, w.facts)[0]
    except ListenUnknown:
        return None
    return (f"python3 -c {q(shipped_text('served-certificate.py'))} {q(address)} "
            f"{w.inventory.endpoint_port()} {q(SERVED_NO_TLS)}")


#: The sections that read one world (its log, /health, completion, unit, a worker's rendezvous): with several worlds,
#: run once per world on the node, each named with the world's suffix (Where.suffix).
WORLD_SECTIONS = frozenset({"serve-log", "nccl", "rendezvous", "health", "collector", "unit", "unit-exits",
                            "completion"})

#: The node's own sections, in the order they run.
HOST_SECTIONS: list[ProbeSection] = [
    ProbeSection("ports", _ports, _read_ports),
    ProbeSection("versions", lambda w: node_probes.VERSIONS, _read_versions),
    ProbeSection("host-settings", lambda w: node_probes.HOST_SETTINGS,
                 lambda p, s: replace(p, system=replace(p.system, host_settings=node_probes.parse_settings(s.output)))),
    ProbeSection("sshd-dropins", lambda w: node_probes.SSHD_DROPINS,
                 lambda p, s: replace(p, system=replace(p.system,
                                                        sshd_dropins=node_probes.parse_sshd_dropins(s.output)))),
    ProbeSection("ibv", lambda w: node_probes.IBV_DEVINFO if w.inventory.topology != "single" else None,
                 lambda p, s: replace(p, system=replace(p.system, hcas=node_probes.parse_ibv_devinfo(s.output)))),
    ProbeSection("gids", lambda w: node_probes.GIDS if w.inventory.topology != "single" else None,
                 lambda p, s: replace(p, system=replace(p.system, gids=node_probes.parse_gids(s.output)))),
    ProbeSection("ping", _pings, _read_pings),
    ProbeSection("ssh", lambda w: _mesh_section(host_tries(w.inventory, w.plan.fabric, w.order, w.node))
                 if w.meshed and w.plan is not None else None, lambda p, s: replace(p, ssh=_ssh_results(s.output))),
    ProbeSection("exposure", lambda w: exposure_script(management_addresses(w.facts),
                                                       int(w.inventory.container.ssh_port)) if w.running else None,
                 lambda p, s: replace(p, exposed=exposed(s.output))),
    ProbeSection("c-logs", lambda w: f"docker logs --tail {LOG_LINES} {q(w.inventory.container.name)} 2>&1"
                 if w.container is not None and w.container.exists and (
                     not w.container.running or w.container.status == "restarting" or w.want_logs) else None,
                 lambda p, s: replace(p, container_logs=s.output.strip())),
    ProbeSection("hf-token", lambda w: f'[ -s {q(w.hf + "/token")} ] && echo yes || echo no',
                 lambda p, s: replace(p, hf_token_file={"yes": True, "no": False}.get(s.output.strip()))),
    ProbeSection("models", lambda w: _model_lines(w.hf, model_repos(w.inventory, w.node) if w.serving else []),
                 _read_models),
    ProbeSection("serve-log", lambda w: f"[ -f {q(w.log)} ] || exit 3; tail -n {LOG_LINES} {q(w.log)}",
                 _read_serve_log),
    ProbeSection("nccl", lambda w: log_lines_script(q(w.log), NCCL_LINES),
                 lambda p, s: replace(p, nccl_log=s.output)),
    ProbeSection("rendezvous", _rendezvous, _read_rendezvous),
    ProbeSection("health", lambda w: f"printf '%s\\n' \"${w.health_var}\"" if w.world_head and w.serving else None,
                 lambda p, s: replace(p, health_status=int(s.output.strip()) if s.output.strip().isdigit() else 0),
                 before=lambda w: f"{w.health_var}=$(" + _http(w.inventory.container.name,
                                                              f"http://{w.world_host}:{serve_port(w.served)}/health")
                 + " | head -n 1)"),
    ProbeSection("gateway", lambda w: f"docker inspect -f '{{{{.State.Status}}}}' {GATEWAY_CONTAINER} 2>/dev/null "
                 "|| echo absent" if w.head and w.serving else None,
                 lambda p, s: replace(p, gateway=(s.output.strip().splitlines() or ["absent"])[-1].strip())),
    ProbeSection("collector", lambda w: f"docker inspect -f '{{{{.State.Status}}}}' "
                 f"{q(collector_name(world_names(w.served)))} 2>/dev/null || echo absent"
                 if w.world_head and w.serving and w.inventory.engine().metrics_drained else None,
                 lambda p, s: replace(p, collector=(s.output.strip().splitlines() or ["absent"])[-1].strip())),
    ProbeSection("tls-certificate", _served_certificate, lambda p, s: replace(p, served_certificate=(
        s.output.strip() if s.output.startswith(("-----BEGIN CERTIFICATE", SERVED_NO_TLS)) else None))),
    ProbeSection("gateway-listen", lambda w: f"ss -ltnH 'sport = :{w.inventory.endpoint_port()}'"
                 if w.head and w.serving else None, lambda p, s: replace(p, gateway_ss=s.output)),
    ProbeSection("unit", lambda w: show_command(w.inventory.cluster.name, w.served.world_key) if _unit_here(w)
                 else None,
                 lambda p, s: replace(p, unit=parse_show(s.output))),
    ProbeSection("unit-exits", lambda w: f"tail -n 20 {q(posixpath.join(posixpath.dirname(w.log), EXITS_LOG))}"
                 if _unit_here(w) else None, lambda p, s: replace(p, unit_exits=s.output)),
    ProbeSection("completion", _completion, _read_completion),
    # started with the probe (probe_script): collected last
    ProbeSection("answers", _answers_collected, _read_answers),
]

def _ray_here(w: Where) -> bool:
    """A launch with Ray runs here: the only world's (on any node, as before), or one of several on this node."""
    if w.plan is None:
        return False
    worlds = w.inventory.worlds()
    if len(worlds) == 1:
        return "ray" in w.plan.launch.programs()
    return any("ray" in w.plan.launches[world.key].programs() for world in worlds if w.node in world.nodes)


def _mpi(w: Where) -> bool:
    return without_mpi(w.inventory) is None


#: Inside the running container (one `docker exec`, beside the node's own): its hostfile, keys and ssh mesh
#: (where mpirun starts the ranks; an engine whose ranks meet over their own sockets has none: whether its image
#: has Ray where Ray is chosen instead), and the settings files that override sparkctl's.
CONTAINER_SECTIONS: list[ProbeSection] = [
    ProbeSection("c-ray", lambda w: "command -v ray" if _ray_here(w) else None,
                 lambda p, s: replace(p, ray_found=s.ok)),
    ProbeSection("c-hostfile", lambda w: f"cat {HOSTFILE_PATH}" if w.plan is not None and _mpi(w) else None,
                 lambda p, s: replace(p, container_hostfile=s.output if s.ok else "")),
    ProbeSection("c-authkeys", lambda w: "cat /root/.ssh/authorized_keys" if w.plan is not None and _mpi(w)
                 else None,
                 lambda p, s: replace(p, container_authorized_keys=s.output if s.ok else "")),
    ProbeSection("c-ssh", lambda w: _mesh_section(container_tries(w.plan.fabric, w.order, w.node))
                 if w.plan is not None and _mpi(w) else None,
                 lambda p, s: replace(p, container_ssh=_ssh_results(s.output))),
    ProbeSection("c-settings", lambda w: node_probes.CONTAINER_SETTINGS,
                 lambda p, s: replace(p, system=replace(p.system,
                                                        container_settings=node_probes.parse_settings(s.output)))),
]


def probe_script(inventory: Inventory, plan: ClusterPlan | None, facts: Facts, node: str, order: list[str], *,
                 nonce: str, want_logs: bool = False, targets: tuple[tuple[str, str, int], ...] = ()) -> str:
    """The probe script of one node. `order`: the reachable nodes (peers to probe); `targets`: another node's
    management listeners to connect to."""
    w = Where(inventory, plan, facts, node, order, want_logs, targets)
    hold, send = held_output("$_O", 'rm -f "$_O"')
    parts = [shipped_text("probes.sh").rstrip(), "_probes_begin", '_O=$(mktemp 2>/dev/null) || _O=""', hold]
    inside = ""
    if w.running and plan is not None:
        inner = [_section(nonce, sec.name, body) for sec in CONTAINER_SECTIONS if (body := sec.script(w)) is not None]
        inside = f"docker exec {q(inventory.container.name)} sh -c {q(chr(10).join(inner))} 2>&1"
        # the container's mesh runs alongside the host's (other sshds, other targets): the probe costs the
        # slower of the two, not their sum
        parts.append(f'_C=$(mktemp 2>/dev/null) || _C=""\nif [ -n "$_C" ]; then {{ {inside}; }} >"$_C" 2>&1 3>&- & fi')
    started = _answers_started(w)
    if started is not None:
        parts.append(started)
    worlds = world_wheres(w)
    for sec in HOST_SECTIONS:
        for seen in (worlds if sec.name in WORLD_SECTIONS else [w]):
            if seen.world is not None and node not in seen.world.serving_nodes():
                continue  # a world of several is read on its own nodes only
            body = sec.script(seen)
            if body is None:
                continue
            if sec.before is not None:
                parts.append(sec.before(seen))
            parts.append(_section(nonce, sec.name + seen.suffix, body))
    if inside:
        parts.append(f'if [ -n "$_C" ]; then wait; cat "$_C"; rm -f "$_C"; else {inside}; fi')
    return "\n".join([*parts, send]) + "\nexit 0\n"


def world_wheres(w: Where) -> list[Where]:
    """What each world's sections are rendered from: `w` itself with one world, else one per world (the first's
    named as the only one's)."""
    worlds = w.inventory.worlds()
    if len(worlds) == 1:
        return [w]
    hosts = w.plan.hosts if w.plan is not None else {}
    return [replace(w, world=w.inventory.for_world(world), world_host=hosts.get(world.key, ENGINE_HOST))
            for world in worlds]


def world_keys(inventory: Inventory) -> list[str]:
    """The keys of the worlds other than the first (their probe sections' suffixes), with several worlds."""
    return [world.key for world in inventory.worlds()[1:]] if len(inventory.worlds()) > 1 else []


_SS_OWNER = re.compile(r':(?P<port>\d+)\s.*users:\(\("(?P<name>[^"]+)",pid=(?P<pid>\d+)')


def parse_probe(stdout: str, nonce: str, worlds: list[str] | tuple[str, ...] = ()) -> NodeProbe:
    """Each section that came back, read by its registry entry; with several worlds, each world's sections (named
    with its suffix) read into the probe as that world sees it (NodeProbe.worlds; `worlds`: their keys)."""
    sections = Framing(nonce).split(stdout)
    probe = NodeProbe()
    for sec in (*HOST_SECTIONS, *CONTAINER_SECTIONS):
        if sec.name in sections:
            probe = sec.read(probe, sections[sec.name]) or probe
    for key in worlds:
        seen = without_world(probe)
        for sec in HOST_SECTIONS:
            name = f"{sec.name}--{key}"
            if sec.name in WORLD_SECTIONS and name in sections:
                seen = sec.read(seen, sections[name]) or seen
        probe.worlds[key] = seen
    return probe


def probe_node(transport: Transport, inventory: Inventory, plan: ClusterPlan | None, facts: Facts, order: list[str],
               *, want_logs: bool = False, timeout: float | None = None,
               targets: tuple[tuple[str, str, int], ...] = ()) -> NodeProbe:
    node = transport.node
    nonce = Framing().nonce
    script = probe_script(inventory, plan, facts, node, order, nonce=nonce, want_logs=want_logs, targets=targets)
    timeout = probe_timeout(len(order)) if timeout is None else timeout
    try:
        result = transport.run(script, timeout=timeout)
    except Unreachable as exc:  # lost mid-probe (stopped answering, closed, powered off): a finding, not a crash
        return NodeProbe(error=str(exc) or type(exc).__name__, lost=True)
    except Exception as exc:  # noqa: BLE001 - whatever else went wrong is said on the node, not raised
        return NodeProbe(error=str(exc) or type(exc).__name__)
    probe = parse_probe(result.stdout, nonce, world_keys(inventory))
    if result.timed_out:
        probe.error = f"the probes timed out after {timeout:g}s"
    if plan is not None and inventory.topology != "single":
        # a pair whose try printed no verdict (the probe was cut short) is not checked, never silently fine
        why = probe.error or "no verdict printed"
        probe.ssh += _untried(host_tries(inventory, plan.fabric, order, node), probe.ssh, why)
        info = facts.containers.get(inventory.container.name)
        if info is not None and info.running and without_mpi(inventory) is None:
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
    asks = exposure_targets(names, facts)
    with ThreadPoolExecutor(max_workers=max(1, min(forks, len(names)))) as pool:
        futures = {n: pool.submit(probe_node, transports[n], inventory, plan, facts[n], order, want_logs=want_logs,
                                  targets=asks.get(n, ())) for n in names}
        probes = {n: f.result() for n, f in futures.items()}
    if len(names) == 1:
        # a lone node has no other node to be asked from: this machine asks
        lone = names[0]
        probes[lone].answered = answered_here(management_listeners(lone, facts[lone]))
    return probes


#: how long a connection over the management network may take to be accepted (a dropped SYN costs this, once)
ANSWER_WAIT_S = 2
#: the most listeners asked of one node (a node with more is a finding long before)
MAX_ASKED = 64


def management_listeners(node: str, facts: Facts) -> list[tuple[str, str, int]]:
    """(node, management address, port) of each TCP listener that holds the node's management address (itself,
    or every address)."""
    out = []
    for port in sorted(facts.listening_addresses):
        for ip in listening_on_management(facts, port):
            if is_ipv4(ip):  # a node's own report: nothing else reaches the shell that asks it
                out.append((node, ip, port))
    return out[:MAX_ASKED]


def exposure_targets(names: list[str], facts: dict[str, Facts]) -> dict[str, tuple[tuple[str, str, int], ...]]:
    """Who asks whom: each node asks the next one's management listeners (the last the first), so every node is
    asked from another node of the cluster over the management network."""
    if len(names) < 2:
        return {}
    return {asker: tuple(management_listeners(target, facts[target]))
            for asker, target in zip(names, names[1:] + names[:1], strict=True)}


def answered_here(targets: list[tuple[str, str, int]]) -> list[tuple[str, str, int]]:
    """The targets that accept a TCP connection from this machine."""
    def accepts(target: tuple[str, str, int]) -> bool:
        try:
            with socket.create_connection(target[1:], timeout=ANSWER_WAIT_S):
                return True
        except OSError:
            return False

    if not targets:
        return []
    with ThreadPoolExecutor(max_workers=min(16, len(targets))) as pool:
        return [t for t, ok in zip(targets, pool.map(accepts, targets), strict=True) if ok]
