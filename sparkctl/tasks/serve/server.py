"""The serving process on the head node: start it detached, know what runs, stop it, read its log.

What runs is recorded in <state>/run/serve/launch.json on the head (config fingerprint, model, mpirun's
PID inside the container, start time), next to serve.log, which outlives the process and the container.
Used by the serve tasks and by `sparkctl serve status|logs|stop`.
"""

from __future__ import annotations

import json
import posixpath
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sparkctl.facts.model import ContainerInfo
from sparkctl.inventory import Inventory
from sparkctl.knowledge.nccl import log_lines_script
from sparkctl.knowledge.serve_client import NodeFetch, ServeClient, node_http_command, parse_node_http
from sparkctl.plan.deployment import DeploymentRecord, deployments_path
from sparkctl.plan.gateway import ENGINE_HOST
from sparkctl.plan.launches import is_our_server
from sparkctl.plan.serve import endpoint_tls
from sparkctl.plan.serve_unit import EXITS_LOG, STOP_WAIT_S, parse_show, show_command
from sparkctl.plan.world import WorldNames, world_names
from sparkctl.tasks.context import NodeContext
from sparkctl.tasks.serve.api_key import api_key
from sparkctl.tasks.serve.gateway import head_gateway
from sparkctl.transport.base import CommandResult, Transport, q, text_of
from sparkctl.transport.framing import Framing

RunFn = Callable[..., CommandResult]
#: How long /health may take to answer inside the state read (as ServeClient.health's default)
HEALTH_TIMEOUT_S = 5.0
NCCL_LINES = 2000
STATE_SCRIPT_NAME = "sparkctl-serve-state"


def head_client(transport: Transport, inventory: Inventory, timeout: float = 60.0,
                host: str = ENGINE_HOST) -> ServeClient:
    """A client of the engine itself, behind the gateway, on the world's head (the head's loopback, or `host`:
    world.engine_host): its requests run there, inside its container (host network), over `transport` (an SSH
    login: what the controller can route to does not matter, and no key is needed there)."""
    spec = inventory.serve_spec()
    fetch = NodeFetch(transport, inventory.container.name, spec.engine_port, inventory.serving_nodes()[0], host=host)
    return ServeClient(fetch, timeout=timeout, model=spec.served_name)


def figures_client(transport: Transport, inventory: Inventory, timeout: float = 10.0) -> ServeClient:
    """A client of the gateway on the head's own loopback, with the key: its /metrics is what every reader of the
    engine's figures shares (the collector's, for an engine whose own /metrics a read empties)."""
    return gateway_loopback_client(transport, inventory, timeout)


def gateway_loopback_client(transport: Transport, inventory: Inventory, timeout: float = 10.0,
                            model: str | None = None) -> ServeClient:
    """A client of the gateway on the head's own loopback, with the key, asking for `model` (by default the first):
    the endpoint as the head itself reaches it, routed by the name like any request."""
    fetch = NodeFetch(transport, inventory.container.name, inventory.endpoint_port(), inventory.head.name,
                      host=ENGINE_HOST, api_key=api_key(inventory))
    return ServeClient(fetch, timeout=timeout, model=model or inventory.served_models()[0].name)


def gateway_client(head: NodeContext, timeout: float = 60.0, model: str | None = None) -> ServeClient:
    """A client of the endpoint as its users reach it: through the gateway, on the first address it answers on,
    with the key, asking for `model` (by default the first); its requests run on the head, inside its container
    (host network)."""
    inv = head.inventory
    first = inv.served_models()[0].spec
    host = head_gateway(head).listen[0]
    fetch = NodeFetch(head.transport, inv.container.name, first.port, head.name, host=host, api_key=api_key(inv),
                      tls=endpoint_tls(inv))
    return ServeClient(fetch, timeout=timeout, model=model or first.served_name)


@dataclass(frozen=True)
class ServingState:
    """What serve.launch reads of the head in one round trip (ServerHandle.state_script)."""
    record: dict | None       # launch.json, None when absent or unreadable
    pid: int | None           # the server's PID in the container (mpirun's, vllm serve's), from serve.pid (the
    #                           unit's latest run writes it)
    alive: bool               # that PID is still our server
    unit: dict[str, str]      # `systemctl show` of the serving unit
    health: int               # /health's HTTP status, 0 when nothing answered
    health_why: str           # why nothing answered
    exec_error: str           # what `docker exec` said when it failed (the container not running), else ""
    nccl: str                 # the serve log's NCCL/NET lines


#: a container's id as docker and podman print it (what goes into the node's shell, checked)
_CONTAINER_ID = re.compile(r"[0-9a-f]{12,64}")


def find_server(container_id: str) -> str:
    """bash on the node: $_found set and $_cl the command line (NULs as spaces) of the process whose PID in its
    own namespace (the last of its NSpid) is serve.pid's ($_pid), among those whose cgroup names the container."""
    return "\n".join([
        "_cl=; _found=",
        'if [ -n "$_pid" ]; then for _d in /proc/[0-9]*; do',
        '  _cg=; IFS= read -r -d \'\' _cg 2>/dev/null <"$_d/cgroup"',
        f"  case $_cg in *{container_id}*) ;; *) continue ;; esac",
        '  _ns=; while read -r _k _v; do [ "$_k" = NSpid: ] && { _ns=$_v; break; }; done 2>/dev/null <"$_d/status"',
        '  [ "${_ns##*[[:space:]]}" = "$_pid" ] || continue',
        '  _c=(); mapfile -d \'\' _c 2>/dev/null <"$_d/cmdline"; _cl="${_c[*]}"; _found=1; break',
        "done; fi"])


def host_reads(framing: Framing, host: str, port: int) -> str:
    """bash on the node, once find_server found the server: the sections `cmdline` and `health` as the
    container's own reads print them. health: a GET of /health on bash's own TCP connection, printed as
    node-http.py prints it (the status, then why when nothing answered): a `timeout` and a bash, not a
    `docker exec`."""
    hostport = f"{host}:{int(port)}"
    # in a bash of its own under `timeout`: a server that stopped answering leaves connections in its listen
    # queue, and once that is full the connect itself waits (bash's /dev/tcp has no timeout of its own)
    within = f"{HEALTH_TIMEOUT_S:g} s"
    ask = "\n".join([
        f"if ! exec 7<>{q(f'/dev/tcp/{host}/{int(port)}')}; then printf '0\\nnothing answers on %s\\n' {q(hostport)}",
        f"elif printf 'GET /health HTTP/1.0\\r\\nHost: %s\\r\\nConnection: close\\r\\n\\r\\n' {q(hostport)} >&7 &&",
        f"  IFS=' ' read -r -t {HEALTH_TIMEOUT_S:g} _ s _ <&7; then printf '%s\\n' \"$s\"",
        f"else printf '0\\nno answer from %s within %s\\n' {q(hostport)} {q(within)}; fi"])
    health = ("# shellcheck disable=SC2016 # the text of a bash of its own\n"
              f"timeout -k 1 {HEALTH_TIMEOUT_S + 1:g} bash -c {q(ask)} 2>/dev/null || "
              f"printf '0\\nno answer from %s within %s (it takes no connection)\\n' {q(hostport)} {q(within)}")
    return "\n".join([framing.section("cmdline", 'printf \'%s\' "$_cl"'), framing.section("health", health)])


class ServerHandle:
    """A world's server on one of its nodes: what runs (serve.pid, written by world.sh run inside the container),
    what it was started from (launch.json, on the world's head), its log, and its unit (plan/serve_unit.py), which
    starts and stops it. `names`: the world's (plan/world.py)."""

    def __init__(self, run: RunFn, put: Callable[..., Any], container: str, state_dir: str, names: WorldNames):
        self._run, self._put = run, put
        self.container = container
        self.names = names
        self.unit = names.unit_name
        self.cluster = names.cluster
        self.dir = names.node_dir(state_dir)
        self.log_path = posixpath.join(self.dir, "serve.log")
        self.record_path = posixpath.join(self.dir, "launch.json")
        self.pid_path = posixpath.join(self.dir, "serve.pid")
        self.exits_path = posixpath.join(self.dir, EXITS_LOG)
        self.deployments_path = deployments_path(self.dir)

    @classmethod
    def of(cls, ctx: NodeContext) -> ServerHandle:
        return cls(ctx.run, ctx.transport.put, ctx.inventory.container.name, ctx.state_dir(),
                   world_names(ctx.inventory))

    def _exec(self, script: str, timeout: float = 30.0) -> CommandResult:
        return self._run(f"docker exec {q(self.container)} sh -c {q(script)}", timeout=timeout)

    def read_record(self) -> dict | None:
        result = self._run(f"cat {q(self.record_path)} 2>/dev/null", timeout=30)
        try:
            value = json.loads(result.stdout) if result.stdout.strip() else None
        except ValueError:
            return None
        return value if isinstance(value, dict) else None

    def read_deployments(self) -> DeploymentRecord:
        """The deployments kept on the head (sparkctl/plan/deployment.py): the one in use, the one before."""
        return DeploymentRecord.parse(self._run(f"cat {q(self.deployments_path)} 2>/dev/null; true", timeout=30).stdout)

    def write_record(self, record: dict) -> None:
        self._put(self.record_path, json.dumps(record, indent=1, sort_keys=True) + "\n", mode=0o644)

    def read_pid(self) -> int | None:
        text = self._run(f"cat {q(self.pid_path)} 2>/dev/null", timeout=30).stdout.strip()
        return int(text) if text.isdigit() else None

    def alive(self, pid: int | None) -> bool:
        """Is `pid` (inside the container) still the server we started (mpirun, vllm serve)?"""
        if not pid:
            return False
        result = self._exec(f"tr '\\0' ' ' < /proc/{int(pid)}/cmdline 2>/dev/null")
        return result.ok and is_our_server(result.stdout)

    def unit_state(self) -> dict[str, str]:
        return parse_show(self._run(show_command(self.cluster, self.names.key), timeout=30).stdout)

    def exits(self, lines: int = 5) -> list[str]:
        """The unit's last runs, one line each: `<time> <epoch> <result> <code> <status> <seconds>` (unit.sh)."""
        return self._run(f"tail -n {int(lines)} {q(self.exits_path)} 2>/dev/null", timeout=30).stdout.splitlines()

    def tail(self, lines: int = 40, previous: bool = False) -> list[str]:
        """The serve log's last lines (`previous`: the run before, serve.log.1)."""
        path = self.log_path + (".1" if previous else "")
        result = self._run(f"tail -n {int(lines)} {q(path)} 2>/dev/null", timeout=30)
        return result.stdout.splitlines()

    def state_script(self, port: int, framing: Framing, host: str = ENGINE_HOST,
                     container: ContainerInfo | None = None) -> str:
        """One read of everything serve.launch checks, in one round trip: the record, the unit's state, the command
        line of the PID serve.pid names, /health, and the serve log's NCCL/NET lines (there with NCCL_DEBUG=INFO).

        The server's command line and /health are read from the node itself when it finds the server among the
        container's processes (`container`: running, as the facts inspected it): its `docker exec` was most of
        what a rerun cost the head. Else (the server gone, the node hiding other users' processes: /proc's
        hidepid) they are read in one `docker exec`, whose own word (a container that is not running) is its own
        section."""
        pid = f"_pid=; read -r -N 12 _pid 2>/dev/null <{q(self.pid_path)}; _pid=${{_pid//[!0-9]/}}"
        inspect = self._exec_reads(framing, host, port)
        if (container is not None and container.running and container.id and container.pid
                and _CONTAINER_ID.fullmatch(container.id)):
            # the container's first process visible here (no hidepid): the server found here, else (gone, or
            # hidden after all) the docker exec has the last word
            inspect = "\n".join([
                "_found=", f"if [ -r /proc/{int(container.pid)}/status ]; then\n{find_server(container.id)}\nfi",
                f'if [ -n "$_found" ]; then\n{host_reads(framing, host, port)}\n_e=; _r=0\nelse\n{inspect}\nfi'])
        return "\n".join([
            framing.section("record", text_of(q(self.record_path))), pid,
            framing.section("pid", 'printf \'%s\' "$_pid"'),
            framing.section("unit", show_command(self.cluster, self.names.key)), inspect,
            framing.section("exec", 'printf \'%s\' "$_e"\n(exit "$_r")'),
            framing.section("nccl", log_lines_script(q(self.log_path), NCCL_LINES)),
            "true"])

    def _exec_reads(self, framing: Framing, host: str, port: int) -> str:
        """The command line and /health read inside the container, in one `docker exec` (python3 there asks
        /health); its stderr kept in $_e, its exit status in $_r."""
        url = f"http://{host}:{int(port)}/health"
        inside = "\n".join([
            framing.section("cmdline", '[ -n "$1" ] && tr \'\\0\' \' \' < "/proc/$1/cmdline"'),
            # python's stderr kept apart: a warning it prints must not stand before the status line
            framing.section("health", "{ _he=$(" + node_http_command("GET", url, HEALTH_TIMEOUT_S)
                            + " 2>&1 1>&3); } 3>&1"),
            framing.section("health_err", 'printf \'%s\' "$_he"')])
        # the exec's stdout (the sections inside) goes straight out, its stderr is kept for its own section
        return (f"{{ _e=$(docker exec {q(self.container)} sh -c {q(inside)} {STATE_SCRIPT_NAME} \"$_pid\" "
                "2>&1 1>&3 </dev/null); _r=$?; } 3>&1")

    def parse_state(self, stdout: str, framing: Framing, node: str) -> ServingState:
        found = framing.split(stdout)
        texts = Framing.texts_of(found)
        record = None
        if "record" in found and found["record"].ok and texts["record"].strip():
            try:
                value = json.loads(texts["record"])
            except ValueError:
                value = None
            record = value if isinstance(value, dict) else None
        pid_text = texts.get("pid", "").strip()
        exec_error = ""
        if "exec" not in found or not found["exec"].ok:
            lines = texts.get("exec", "").strip().splitlines()
            exec_error = f"docker exec: {lines[-1] if lines else 'no answer'}"
        alive = "cmdline" in found and found["cmdline"].ok and is_our_server(texts["cmdline"])
        health = texts.get("health", "")
        if health.partition("\n")[0].strip().isdigit():  # node-http.py ran: a status, 0 with why nothing answered
            status, body = parse_node_http(health)
            why = "" if status else (body.strip() or "no answer")
        else:
            lines = (texts.get("health_err", "") or health).strip().splitlines() or [exec_error or "no answer"]
            status, why = 0, f"cannot run python3 in the container {self.container} on {node}: {lines[-1]}"
        return ServingState(record, int(pid_text) if pid_text.isdigit() else None, alive,
                            parse_show(texts.get("unit", "")), status, why, exec_error, texts.get("nccl", ""))

    def start(self, host_script: str) -> None:
        """Start the unit without waiting for its start (it may wait minutes for the other nodes): serve.launch
        waits for /health itself. The run sparkctl asks for starts at once, whatever runs ended before it."""
        self._run(f"sh {q(host_script)} asked >/dev/null 2>&1; true", timeout=30)
        result = self._run(f"systemctl reset-failed {q(self.unit)} >/dev/null 2>&1; "
                           f"systemctl start --no-block {q(self.unit)}", sudo=True, timeout=60)
        if not result.ok:
            raise RuntimeError(f"systemctl start {self.unit}: {(result.stderr or result.stdout).strip()[-300:]}")

    def stop(self, *, disable: bool = False) -> int | None:
        """Stop the unit (its stop TERMs mpirun, which takes the ranks on every node down); a server still running
        outside it (one started before the unit existed) is stopped too. `disable`: it stays stopped at boot.
        Returns the PID that ran, if one did."""
        pid = self.read_pid()
        was = pid if self.alive(pid) else None
        verb = "disable --now" if disable else "stop"
        self._run(f"systemctl {verb} {q(self.unit)} >/dev/null 2>&1; true", sudo=True, timeout=STOP_WAIT_S + 45)
        if was is not None and self.alive(was):
            self._exec(f"kill -TERM {was} 2>/dev/null; true")
            deadline = time.monotonic() + STOP_WAIT_S
            while self.alive(was) and time.monotonic() < deadline:
                time.sleep(0.3)
            if self.alive(was):
                self._exec(f"kill -KILL {was} 2>/dev/null; true")
        return was
