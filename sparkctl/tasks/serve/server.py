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
from typing import Any

from sparkctl.inventory import Inventory
from sparkctl.knowledge.serve_client import NodeFetch, ServeClient
from sparkctl.plan.paths import CONFIG_PATH, LOG_PATH, PID_PATH
from sparkctl.tasks.context import NodeContext
from sparkctl.transport.base import CommandResult, Transport, q

RunFn = Callable[..., CommandResult]
STOP_WAIT_S = 15.0


def head_client(transport: Transport, inventory: Inventory, timeout: float = 60.0) -> ServeClient:
    """A client of the server that runs its requests on the head, inside its container (host network), over
    `transport`: what the controller can route to does not matter."""
    spec = inventory.serve_spec()
    fetch = NodeFetch(transport, inventory.container.name, spec.port, inventory.head.name)
    return ServeClient(fetch, timeout=timeout, model=spec.model)


def serve_dir(state_dir: str) -> str:
    return posixpath.join(state_dir, "run", "serve")


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
        return result.ok and "mpirun" in result.stdout and CONFIG_PATH in result.stdout

    def tail(self, lines: int = 40) -> list[str]:
        result = self._run(f"tail -n {int(lines)} {q(self.log_path)} 2>/dev/null", timeout=30)
        return result.stdout.splitlines()

    def nccl_lines(self, lines: int = 2000) -> str:
        """The NCCL/NET lines of the running server's log (there with NCCL_DEBUG=INFO; empty without)."""
        return self._run(f"grep -E 'NCCL|NET/' {q(self.log_path)} 2>/dev/null | tail -n {int(lines)}",
                         timeout=30).stdout

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
