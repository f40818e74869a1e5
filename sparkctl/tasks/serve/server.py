"""The serving process on the head node: start it detached, know what runs, stop it, read its log.

What runs is recorded in <state>/run/serve/launch.json on the head (config fingerprint, model, mpirun's
PID inside the container, start time), next to serve.log, which outlives the process and the container.
Used by the serve tasks and by `sparkctl serve status|logs|stop`.
"""

from __future__ import annotations

import json
import posixpath
import shlex
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sparkctl.inventory import Inventory
from sparkctl.knowledge.serve_client import NodeFetch, ServeClient, node_http_command, parse_node_http
from sparkctl.plan.paths import CONFIG_PATH, LOG_PATH, PID_PATH
from sparkctl.tasks.context import NodeContext
from sparkctl.tasks.serve.api_key import api_key
from sparkctl.tasks.serve.gateway import head_gateway
from sparkctl.transport.base import CommandResult, Transport, q
from sparkctl.transport.framing import Framing

RunFn = Callable[..., CommandResult]
STOP_WAIT_S = 15.0
#: How long /health may take to answer inside the state read (as ServeClient.health's default)
HEALTH_TIMEOUT_S = 5.0
NCCL_LINES = 2000
STATE_SCRIPT_NAME = "sparkctl-serve-state"


def head_client(transport: Transport, inventory: Inventory, timeout: float = 60.0) -> ServeClient:
    """A client of the engine itself, on the head's loopback behind the gateway: its requests run on the head,
    inside its container (host network), over `transport` (an SSH login: what the controller can route to does not
    matter, and no key is needed there)."""
    spec = inventory.serve_spec()
    fetch = NodeFetch(transport, inventory.container.name, spec.engine_port, inventory.head.name)
    return ServeClient(fetch, timeout=timeout, model=spec.model)


def gateway_client(head: NodeContext, timeout: float = 60.0) -> ServeClient:
    """A client of the endpoint as its users reach it: through the gateway, on the first address it answers on,
    with the key; its requests run on the head, inside its container (host network)."""
    inv = head.inventory
    spec = inv.serve_spec()
    host = head_gateway(head).listen[0]
    fetch = NodeFetch(head.transport, inv.container.name, spec.port, head.name, host=host, api_key=api_key(inv))
    return ServeClient(fetch, timeout=timeout, model=spec.model)


def serve_dir(state_dir: str) -> str:
    return posixpath.join(state_dir, "run", "serve")


@dataclass(frozen=True)
class ServingState:
    """What serve.launch reads of the head in one round trip (ServerHandle.state_script)."""
    record: dict | None       # launch.json, None when absent or unreadable
    alive: bool               # the record's PID is still our mpirun
    health: int               # /health's HTTP status, 0 when nothing answered
    health_why: str           # why nothing answered
    exec_error: str           # what `docker exec` said when it failed (the container not running), else ""
    nccl: str                 # the serve log's NCCL/NET lines


def _is_our_mpirun(cmdline: str) -> bool:
    return "mpirun" in cmdline and CONFIG_PATH in cmdline


class ServerHandle:
    def __init__(self, run: RunFn, put: Callable[..., Any], container: str, state_dir: str):
        self._run, self._put = run, put
        self.container = container
        self.dir = serve_dir(state_dir)
        self.log_path = posixpath.join(self.dir, "serve.log")
        self.record_path = posixpath.join(self.dir, "launch.json")
        self.config_path = posixpath.join(self.dir, "extra-llm-api-config.yml")

    @classmethod
    def of(cls, ctx: NodeContext) -> ServerHandle:
        return cls(ctx.run, ctx.transport.put, ctx.inventory.container.name, ctx.state_dir())

    def _exec(self, script: str, timeout: float = 30.0) -> CommandResult:
        return self._run(f"docker exec {q(self.container)} sh -c {q(script)}", timeout=timeout)

    def read_record(self) -> dict | None:
        result = self._run(f"cat {q(self.record_path)} 2>/dev/null", timeout=30)
        try:
            value = json.loads(result.stdout) if result.stdout.strip() else None
        except ValueError:
            return None
        return value if isinstance(value, dict) else None

    def write_record(self, record: dict) -> None:
        self._put(self.record_path, json.dumps(record, indent=1, sort_keys=True) + "\n", mode=0o644)

    def alive(self, pid: int | None) -> bool:
        """Is `pid` (inside the container) still the mpirun we started?"""
        if not pid:
            return False
        result = self._exec(f"tr '\\0' ' ' < /proc/{int(pid)}/cmdline 2>/dev/null")
        return result.ok and _is_our_mpirun(result.stdout)

    def tail(self, lines: int = 40) -> list[str]:
        result = self._run(f"tail -n {int(lines)} {q(self.log_path)} 2>/dev/null", timeout=30)
        return result.stdout.splitlines()

    def state_script(self, port: int, framing: Framing) -> str:
        """One read of everything serve.launch checks, in one round trip and one `docker exec`: the record, the
        command line of the PID it names, /health, and the serve log's NCCL/NET lines (there with
        NCCL_DEBUG=INFO). The PID is taken from the record as write_record lays it out (`"pid": N,`); what
        `docker exec` itself says (a container that is not running) is its own section."""
        url = f"http://127.0.0.1:{int(port)}/health"
        inside = "\n".join([
            framing.section("cmdline", '[ -n "$1" ] && tr \'\\0\' \' \' < "/proc/$1/cmdline"'),
            # python's stderr kept apart: a warning it prints must not stand before the status line
            framing.section("health", "{ _he=$(" + node_http_command("GET", url, HEALTH_TIMEOUT_S)
                            + " 2>&1 1>&3); } 3>&1"),
            framing.section("health_err", 'printf \'%s\' "$_he"')])
        pid = (f"_pid=$(sed -n 's/^ *\"pid\": *\\([0-9][0-9]*\\),\\{{0,1\\}}$/\\1/p' {q(self.record_path)} "
               "2>/dev/null | head -n 1)")
        # the exec's stdout (the sections inside) goes straight out, its stderr is kept for its own section
        inspect = (f"{{ _e=$(docker exec {q(self.container)} sh -c {q(inside)} {STATE_SCRIPT_NAME} \"$_pid\" "
                   "2>&1 1>&3 </dev/null); _r=$?; } 3>&1")
        return "\n".join([
            framing.section("record", f"cat {q(self.record_path)}"), pid, inspect,
            framing.section("exec", 'printf \'%s\' "$_e"\n(exit "$_r")'),
            framing.section("nccl", f"grep -E 'NCCL|NET/' {q(self.log_path)} 2>/dev/null | tail -n {NCCL_LINES}"),
            "true"])

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
        exec_error = ""
        if "exec" not in found or not found["exec"].ok:
            lines = texts.get("exec", "").strip().splitlines()
            exec_error = f"docker exec: {lines[-1] if lines else 'no answer'}"
        alive = "cmdline" in found and found["cmdline"].ok and _is_our_mpirun(texts["cmdline"])
        health = texts.get("health", "")
        if health.partition("\n")[0].strip().isdigit():  # NODE_HTTP_PY ran: a status, 0 with why nothing answered
            status, body = parse_node_http(health)
            why = "" if status else (body.strip() or "no answer")
        else:
            lines = (texts.get("health_err", "") or health).strip().splitlines() or [exec_error or "no answer"]
            status, why = 0, f"cannot run python3 in the container {self.container} on {node}: {lines[-1]}"
        return ServingState(record, alive, status, why, exec_error, texts.get("nccl", ""))

    def launch(self, command: str, fingerprint: str) -> int:
        """Start `command` detached in the container, logging to serve.log (the last run's log kept as .1)."""
        script = (
            f"echo $$ > {PID_PATH}; "
            f"echo \"=== sparkctl: starting the server $(date -u +%FT%TZ) config {fingerprint}\"; "
            f"exec {command} < /dev/null"
        )
        prepare = (f"rm -f {PID_PATH}; [ -f {LOG_PATH} ] && mv -f {LOG_PATH} {LOG_PATH}.1; "
                   f"touch {LOG_PATH}")
        result = self._exec(prepare)
        if not result.ok:
            raise RuntimeError(f"preparing {LOG_PATH} failed: {result.stderr.strip()}")
        line = (f"docker exec -d {q(self.container)} bash -c "
                f"{q(f'exec >> {LOG_PATH} 2>&1; {script}')}")
        result = self._run(line, timeout=60)
        if not result.ok:
            raise RuntimeError(f"docker exec -d failed: {(result.stderr or result.stdout).strip()[-300:]}")
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            got = self._exec(f"cat {PID_PATH} 2>/dev/null").stdout.strip()
            if got.isdigit():
                return int(got)
            time.sleep(0.2)
        raise RuntimeError(f"the server did not write {PID_PATH} within 10 s")

    def stop(self, pid: int | None) -> bool:
        """TERM mpirun (it takes the ranks on every node down), KILL after a grace period; True if one ran."""
        if not self.alive(pid):
            return False
        self._exec(f"kill -TERM {int(pid)} 2>/dev/null; true")
        deadline = time.monotonic() + STOP_WAIT_S
        while time.monotonic() < deadline:
            if not self.alive(pid):
                return True
            time.sleep(0.3)
        self._exec(f"kill -KILL {int(pid)} 2>/dev/null; true")
        return True


def leftover_ranks_script() -> str:
    """Kill ranks of OUR server (they name our config file) that outlived their mpirun; prints their PIDs."""
    # `[ ]` matches the space in a rank's command line but not this script's own text
    pattern = shlex.quote(f"--extra_llm_api_options[ ]{CONFIG_PATH}")
    return (f"for p in $(pgrep -f -- {pattern}); do "
            "kill -KILL \"$p\" 2>/dev/null && echo \"$p\"; done; true")
