"""What `sparkctl serve status|logs|chat|bench|stop` do on the cluster, apart from the CLI that shows it.

The endpoint is asked on the head (inside its container, over SSH) first: the inventory host may be an
ssh_config alias or behind a jump host the controller cannot route HTTP through. Straight HTTP from this
machine is used where it must be (streaming chat, bench timings) and reported otherwise.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from sparkctl.errors import BadInput, SparkctlError, Unreachable
from sparkctl.inventory import Inventory
from sparkctl.inventory.tls_files import TlsUnreadable, tls_files
from sparkctl.knowledge.serve_client import EndpointError, ServeClient
from sparkctl.knowledge.serve_failures import likely_cause
from sparkctl.knowledge.serve_metrics import acceptance_since, metrics_reading
from sparkctl.plan import plan_cluster
from sparkctl.plan.deployment import DeploymentRecord
from sparkctl.plan.paths import state_dir
from sparkctl.plan.serve import CERTIFICATE_HINT, endpoint, endpoint_fetch
from sparkctl.plan.serve_unit import last_failure, unit_summary
from sparkctl.plan.world import world_names
from sparkctl.runs.bootstrap import journaled_run
from sparkctl.runs.lock import ClusterLock, Holder
from sparkctl.runs.playbooks import bootstrap_graph
from sparkctl.runs.session import RunRequest, Session
from sparkctl.taskgraph import Event, RunResult
from sparkctl.taskgraph.runner import DEFAULT_FORKS
from sparkctl.taskgraph.task import TaskFailed
from sparkctl.tasks.context import ClusterContext, NodeContext, RunOptions
from sparkctl.tasks.serve.api_key import api_key, key_source, new_key
from sparkctl.tasks.serve.launch import kill_leftover_ranks, stop_ranks, worker_ranks
from sparkctl.tasks.serve.server import ServerHandle, figures_client, gateway_loopback_client, head_client
from sparkctl.tasks.worlds import cluster_worlds
from sparkctl.transport.base import Transport, q

#: How long this machine waits for the endpoint before it goes through the head instead.
DIRECT_TIMEOUT = 3.0


@contextmanager
def connected(inventory: Inventory, node_name: str) -> Iterator[Transport]:
    """One SSH (or local) connection to a node of the inventory, closed on the way out."""
    if node_name not in {n.name for n in inventory.nodes}:
        raise BadInput(f"no node named {node_name} in the inventory",
                       hint="nodes: " + ", ".join(n.name for n in inventory.nodes))
    transport = Session(inventory).open(node_name)
    try:
        yield transport
    finally:
        transport.close()


def server_handle(inventory: Inventory, transport: Transport) -> ServerHandle:
    home = transport.run('printf %s "$HOME"', timeout=15).stdout.strip() or f"/home/{inventory.user}"
    return ServerHandle(transport.run, transport.put, inventory.container.name, state_dir(inventory, home),
                        world_names(inventory))


# --- status -------------------------------------------------------------------------------------------------

@dataclass
class ServeStatus:
    rows: list[tuple[str, str]] = field(default_factory=list)
    healthy: bool = False


def endpoint_key(inventory: Inventory) -> str | None:
    """The endpoint's API key, as serve.gateway put it on the head (None with serve.auth: none)."""
    try:
        return api_key(inventory)
    except TaskFailed as exc:
        raise SparkctlError(exc.message, hint=exc.hint) from None


def rotate_key(inventory: Inventory, verbosity: int, view: Callable[[Event], None]) -> RunResult:
    """A new key for the cluster, put on the gateway by serve.gateway (a run of it and what it needs, which
    changes nothing else): the gateway reloads, and the old key is refused from then on."""
    source = key_source(inventory)
    if source is not None:
        raise BadInput(f"the endpoint's key comes from {source}: put the new key there, then run "
                       "`sparkctl cluster bootstrap`")
    new_key(inventory.cluster.name)
    request = RunRequest.of(verbosity=verbosity, only={"serve.gateway"})
    return journaled_run("serve key --rotate", inventory, bootstrap_graph(), request, view)


def _tls_text(inventory: Inventory) -> str:
    """serve.tls's certificate as this machine has it: whom it names, until when, whom sparkctl's clients trust."""
    tls = inventory.serve.tls
    assert tls is not None
    try:
        info = tls_files(tls).info
    except TlsUnreadable as exc:
        return exc.message
    trusted = f"trusted through {tls.ca}" if tls.ca else "trusted through this machine's system roots"
    return f"{info.subject}, until {info.ends()} ({info.days_left():.0f} days); {trusted}"


def serve_status(inventory: Inventory) -> ServeStatus:
    """Endpoint, health (asked on the head), whether this machine reaches it, models, version, the running
    server's record and the acceptance length since the last read; with several worlds, each world's row
    (several_status)."""
    if len(inventory.worlds()) > 1:
        return several_status(inventory)
    url = endpoint(inventory)
    direct = ServeClient(endpoint_fetch(inventory, endpoint_key(inventory)), timeout=10)
    reach, reach_why = direct.health_detail(timeout=DIRECT_TIMEOUT)
    out = ServeStatus([("endpoint", url), ("auth", "API key (`sparkctl serve key`)" if inventory.serve.auth == "key"
                                            else "none: anyone who reaches the endpoint can use it")])
    if inventory.serve.tls is not None:
        out.rows.append(("tls", _tls_text(inventory)))
    try:
        with connected(inventory, inventory.head.name) as transport:
            client = head_client(transport, inventory, timeout=10)
            health, why = client.health_detail()
            out.rows.append(("health", _health_text(health, why) + f" (asked on {inventory.head.name})"))
            _endpoint_rows(out, client, figures_client(transport, inventory), health, inventory)
            handle = server_handle(inventory, transport)
            record = handle.read_record()
            pid = handle.read_pid()
            alive = handle.alive(pid)
            unit = handle.unit_state()
            exits = handle.exits(20)
            # the run that ended: the log before this one's when the unit started the world again since
            failed_log = handle.tail(40, previous=alive)
            deployments = handle.read_deployments()
    except SparkctlError as exc:
        health, record, alive, unit, deployments = reach, None, False, {}, DeploymentRecord()
        out.rows.append(("head", f"not reachable over ssh: {exc.message}"))
        out.rows.append(("health", _health_text(reach, reach_why) + " (asked from here)"))
        _endpoint_rows(out, direct, direct, reach, inventory)
    out.rows.append(("from here", "reachable" if reach == 200 else
                     f"not reachable ({reach or reach_why}); `serve chat` goes through the head, `serve bench` "
                     "needs a route"))
    if unit:
        out.rows += _unit_rows(unit, exits, failed_log)
    if record:
        uptime = time.time() - float(record.get("started") or time.time())
        started = _systemd_time(unit.get("ExecMainStartTimestamp", "")) if unit else None
        if started is not None:
            uptime = time.time() - started
        out.rows += [("server", f"pid {pid or '-'} in {inventory.container.name}"
                                f" ({'running' if alive else 'gone'})"),
                     ("uptime", _duration(uptime) if alive else "-"), ("config", record.get("fingerprint", "-"))]
    out.rows += _deployment_rows(deployments)
    out.healthy = health == 200
    return out


def several_status(inventory: Inventory) -> ServeStatus:
    """The endpoint's rows, then one row per world: where it runs, its health asked on its head, its unit and its
    server; healthy when every world is."""
    direct = ServeClient(endpoint_fetch(inventory, endpoint_key(inventory)), timeout=10)
    reach, reach_why = direct.health_detail(timeout=DIRECT_TIMEOUT)
    out = ServeStatus([("endpoint", endpoint(inventory)),
                       ("auth", "API key (`sparkctl serve key`)" if inventory.serve.auth == "key"
                        else "none: anyone who reaches the endpoint can use it")])
    if inventory.serve.tls is not None:
        out.rows.append(("tls", _tls_text(inventory)))
    hosts = plan_cluster(inventory).hosts
    healthy = True
    for model in inventory.served_models():
        for world in model.worlds:
            row, health = _world_row(inventory.for_world(world), hosts[world.key])
            healthy = healthy and health == 200
            replica = f" (replica {world.replica + 1})" if len(model.worlds) > 1 else ""
            out.rows.append((f"model {model.name}{replica}", row))
    out.rows.append(("from here", "reachable" if reach == 200 else
                     f"not reachable ({reach or reach_why}); `serve chat` goes through the head"))
    try:
        with connected(inventory, inventory.head.name) as transport:
            deployments = server_handle(inventory, transport).read_deployments()
    except SparkctlError:
        deployments = DeploymentRecord()
    out.rows += _deployment_rows(deployments)
    out.healthy = healthy
    return out


def _world_row(view: Inventory, host: str) -> tuple[str, int]:
    """One world's row (where, health, unit, server) and its health, asked on its head."""
    nodes = view.serving_nodes()
    where = f"on {', '.join(nodes)}"
    try:
        with connected(view, nodes[0]) as transport:
            health, why = head_client(transport, view, timeout=10, host=host).health_detail()
            handle = server_handle(view, transport)
            unit, pid = handle.unit_state(), handle.read_pid()
            alive = handle.alive(pid)
    except SparkctlError as exc:
        return f"{where}: {nodes[0]} not reachable over ssh: {exc.message}", 0
    return (f"{where}: {_health_text(health, why)}; unit {handle.unit} {unit_summary(unit)}; pid {pid or '-'} "
            f"({'running' if alive else 'gone'})"), health


def _deployment_rows(record: DeploymentRecord) -> list[tuple[str, str]]:
    rows = [("deployment", record.current.summary() if record.current else
             "none recorded (a deployment is recorded once it answered its smoke test)")]
    if record.previous:
        rows.append(("previous", f"{record.previous.summary()} (`sparkctl serve rollback` goes back to it)"))
    if record.switching and not record.switching.same_world(record.current):
        rows.append(("switching", f"to {record.switching.summary()}: begun and not answered; a bootstrap finishes "
                                  "it or puts the one in use back"))
    return rows


def _unit_rows(unit: dict[str, str], exits: list[str], log: list[str]) -> list[tuple[str, str]]:
    """The serving unit: its state, how often it started the world again since sparkctl last started it, and
    how the last run that ended by itself ended, with the likely cause from that run's log (`log`)."""
    rows = [("unit", f"{unit_summary(unit)}, {unit.get('UnitFileState') or '-'}"
                     + (" (stays down at boot: `serve stop`)" if unit.get("UnitFileState") == "disabled" else ""))]
    if unit.get("LoadState") == "not-found":
        return rows
    rows.append(("restarts", unit.get("NRestarts", "0") + " (by the unit, since sparkctl last started it)"))
    failure, latest = last_failure(exits)
    if failure is not None:
        cause = likely_cause(log) if latest else None
        rows.append(("last failure", failure.text() + (f"; likely cause: {cause[0]}" if cause else "")))
    return rows


def _systemd_time(text: str) -> float | None:
    """`systemctl show --timestamp=unix`'s `@1795811499` as epoch seconds (None when unset)."""
    return float(text[1:]) if text.startswith("@") and text[1:].isdigit() else None


def _endpoint_rows(out: ServeStatus, client: ServeClient, figures: ServeClient, health: int,
                   inventory: Inventory) -> None:
    """`figures`: the gateway on the head's loopback, whose /metrics every reader shares."""
    try:
        out.rows.append(("models", ", ".join(client.models()) or "-"))
    except EndpointError:
        out.rows.append(("models", "-"))
    out.rows.append(("version", client.version() or "-"))
    try:
        reading = metrics_reading(figures.metrics_text(), inventory.engine().metrics) if health == 200 else None
        acceptance = acceptance_since(None, reading) if reading is not None else None
    except EndpointError:
        acceptance = None
    out.rows.append(("acceptance length",
                     f"{acceptance:.2f}" if acceptance else "- (no requests since the last read)"))


def _health_text(status: int, why: str) -> str:
    return "200 OK" if status == 200 else str(status) if status else f"no answer: {why}"


def _duration(seconds: float) -> str:
    seconds = int(max(0, seconds))
    hours, rest = divmod(seconds, 3600)
    return f"{hours}h{rest // 60:02d}m{rest % 60:02d}s" if hours else f"{rest // 60}m{rest % 60:02d}s"


# --- logs ---------------------------------------------------------------------------------------------------

@dataclass
class LogRead:
    text: str
    #: serve.log on the head; None for another node (its container's log)
    path: str | None
    #: bytes of serve.log already read (where following goes on)
    offset: int = 0
    missing: bool = False


def world_of(inventory: Inventory, model: str | None) -> Inventory:
    """The inventory as the world of `model` sees it (served_name; a replicated model's first world)."""
    name = served_name(inventory, model)
    world = next(w for m in inventory.served_models() if name in (m.name, *m.aliases) for w in m.worlds)
    return inventory.for_world(world)


def read_log(inventory: Inventory, transport: Transport, node: str, lines: int) -> LogRead:
    """The last `lines` of serve.log on the head of the world `inventory` sees, or of the container's log on another
    node."""
    if node != inventory.serving_nodes()[0]:
        result = transport.run(f"docker logs --tail {int(lines)} {q(inventory.container.name)} 2>&1", timeout=60)
        return LogRead(result.stdout, None)
    path = server_handle(inventory, transport).log_path
    result = transport.run(f"tail -n {int(lines)} {q(path)} 2>/dev/null; wc -c < {q(path)} 2>/dev/null", timeout=60)
    *text, size = result.stdout.splitlines() or ["0"]
    size = size.strip()
    offset = int(size) if size.isdigit() else 0
    return LogRead("\n".join(text) + "\n" if text else "", path, offset, missing=not text and offset == 0)


def follow_log(transport: Transport, container: str, log: LogRead, every: float = 1.0) -> Iterator[str]:
    """New log text as it comes (until the caller stops iterating)."""
    since, offset = int(time.time()), log.offset
    while True:
        time.sleep(every)
        if log.path is None:
            now = int(time.time())
            out = transport.run(f"docker logs --since {since} --until {now} {q(container)} 2>&1", timeout=30)
            since = now
        else:
            out = transport.run(f"tail -c +{offset + 1} {q(log.path)} 2>/dev/null", timeout=30)
            offset += len(out.stdout.encode())
        if out.stdout:
            yield out.stdout


# --- chat and bench -----------------------------------------------------------------------------------------

def served_name(inventory: Inventory, asked: str | None) -> str:
    """The name a client asks for: `asked` when a model of the inventory answers to it (its name or an alias), by
    default the first model's; BadInput naming the models otherwise."""
    models = inventory.served_models()
    if asked is None:
        return models[0].name
    if any(asked in (m.name, *m.aliases) for m in models):
        return asked
    names = ", ".join(name for m in models for name in (m.name, *m.aliases))
    raise BadInput(f"--model {asked}: no model of the inventory answers to that name (served are {names})",
                   hint="name one of them (serve.models' name and aliases in the inventory)")


@contextmanager
def endpoint_client(inventory: Inventory, timeout: float, *, direct_only: bool = False,
                    model: str | None = None) -> Iterator[ServeClient]:
    """A client of `model` (by default the first; served_name) from this machine when the endpoint answers here;
    else one through the head (over SSH, no streaming). `direct_only`: refuse instead (a benchmark through SSH would
    measure SSH)."""
    url = endpoint(inventory)
    model = served_name(inventory, model)
    direct = ServeClient(endpoint_fetch(inventory, endpoint_key(inventory)), timeout=timeout, model=model)
    status, why, refused = direct.reach(timeout=DIRECT_TIMEOUT)
    if refused:
        # a route around it would hide what every other client of the endpoint meets
        raise SparkctlError(why, hint=CERTIFICATE_HINT)
    if status == 200:
        yield direct
        return
    port = inventory.endpoint_port()
    tunnel = (f"open a route, e.g. `ssh -N -L {port}:127.0.0.1:{port} {inventory.head.host}` and point at it, "
              "or see `sparkctl serve status`")
    if direct_only:
        raise SparkctlError(f"{url} does not answer from this machine ({status or why})", hint=tunnel)
    with connected(inventory, inventory.head.name) as transport:
        # one model: its engine itself; several: the gateway on the head's loopback, which routes by the name
        client = (head_client(transport, inventory, timeout=timeout) if len(inventory.worlds()) == 1 else
                  gateway_loopback_client(transport, inventory, timeout=timeout, model=model))
        health, head_why = client.health_detail()
        if health != 200:
            raise SparkctlError(f"{client.base_url}/health answers {health or 'nothing'}"
                                + (f": {head_why}" if head_why else ""),
                                hint="`sparkctl serve status` and `sparkctl serve logs`")
        yield client


# --- stop ---------------------------------------------------------------------------------------------------

@dataclass
class StopResult:
    pid: int | None = None
    leftovers: list[str] = field(default_factory=list)
    unreachable: dict[str, str] = field(default_factory=dict)


def stop_server(inventory: Inventory, forks: int = DEFAULT_FORKS) -> StopResult:
    """Stop and disable the serving unit on the head (its stop TERMs mpirun, which takes its ranks down; disabled,
    it stays down at boot until the next serving bootstrap; with vLLM every serving node's unit), then kill leftover
    ranks on every node with the serve.launch task's own code. A change: it holds the cluster lock."""
    head = inventory.head.name
    with Session(inventory, forks=forks) as session:
        if head not in session.transports:
            raise Unreachable(f"cannot stop the server: {session.unreachable.get(head, f'{head} is not reachable')}",
                              hint=f"the server runs on the head, {head}: stop it once it answers "
                                   "(`sparkctl cluster status` shows what each node says)",
                              kind=session.unreachable_kinds.get(head, "network"), node=head)
        with ClusterLock(inventory.cluster.name, session.transports, Holder.now("serve stop"), forks=forks):
            result = StopResult(unreachable=dict(session.unreachable))
            cluster = ClusterContext(inventory, RunOptions(forks=forks), emit=lambda _event: None)
            for node in inventory.nodes:
                if node.name in session.transports:
                    cluster.add(NodeContext(cluster, node, session.transports[node.name]))
            for world in cluster_worlds(cluster):
                # every world's head, then its workers, those that answer (the others are said with the
                # unreachable); the first world's PID is the one told
                nodes = [n for n in [world.inventory.serving_nodes()[0], *worker_ranks(world.inventory)]
                         if n in cluster.nodes]
                pid = stop_ranks(world, nodes, disable=True).get(world.inventory.serving_nodes()[0])
                result.pid = result.pid if result.pid is not None else pid
                result.leftovers += kill_leftover_ranks(world)
            return result
