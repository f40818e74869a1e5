"""Shared by the fault lab modules: a controller run as its own process (its --json stream read as it comes, so a
fault lands at a chosen task, not after a sleep), the lab's management links, and what a fault may leave behind.

No tests here (not named test_*, so pytest does not collect it).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from sparkctl.plan.paths import network_state_dir
from sparkctl.runs.playbooks import bootstrap_graph
from sparkctl.shipped import shipped_text
from sparkctl.taskgraph.task import Scope
from tests.lab.conftest import poll, ssh
from tests.lab.network_kit import Run, sparkctl

#: Where a fault lands: the start of this task on the faulted node (a cluster task: on the cluster).
POINTS = {
    "preflight": "preflight.node",
    "network": "network.netplan",
    "ssh": "ssh.keys",
    "container": "container.run",
    "mpi": "mpi.hostfile",
}
#: What a fault at each point needs undone first, so the run still has work there: `cluster down` (containers) or
#: `cluster down --network` (containers, keys, netplan: a fresh pair).
RESET = {"preflight": "--network", "network": "--network", "ssh": "--network", "container": "", "mpi": "",
         "verify": ""}
NODE_TASKS = [t.name for t in bootstrap_graph().ordered() if t.scope is Scope.NODE]
CLUSTER_TASKS = [t.name for t in bootstrap_graph().ordered() if t.scope is Scope.CLUSTER]
PHASE_ORDER = [t.name for t in bootstrap_graph().ordered()]


def xdg_state(lab) -> Path:
    return Path(lab.dir) / "xdg-state"


@dataclass
class Controller:
    """`sparkctl cluster bootstrap INVENTORY --json` in a process of its own, its events read as they come."""

    lab: object
    args: tuple[str, ...] = ()
    events: list[tuple[float, dict]] = field(default_factory=list)
    #: another inventory than the lab's own (one that serves), and the environment it needs (HF_TOKEN)
    inventory: str | None = None
    env: dict[str, str] | None = None

    def __post_init__(self) -> None:
        env = {**(self.env or os.environ), "XDG_STATE_HOME": str(xdg_state(self.lab))}
        argv = [sys.executable, "-m", "sparkctl.cli.main", "cluster", "bootstrap",
                str(self.inventory or self.lab.inventory_path), "--json", *self.args]
        self.started = time.monotonic()
        self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        self._changed = threading.Condition()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        self.stderr = ""
        self.ended: float | None = None

    def _read(self) -> None:
        for line in self.proc.stdout:
            if not line.startswith("{"):
                continue
            with self._changed:
                self.events.append((time.monotonic(), json.loads(line)))
                self._changed.notify_all()
        with self._changed:
            self.ended = time.monotonic()
            self._changed.notify_all()

    def wait_for(self, wanted: Callable[[dict], bool], timeout: float = 120) -> dict:
        """The first event `wanted` accepts, waiting for it; fails with what came instead."""
        deadline = time.monotonic() + timeout
        with self._changed:
            while True:
                for _, event in self.events:
                    if wanted(event):
                        return event
                if self.ended is not None or time.monotonic() > deadline:
                    raise AssertionError(f"no such event; got {[e for _, e in self.events][-5:]}, "
                                         f"stderr: {self.proc.stderr.read() if self.ended else ''}")
                self._changed.wait(0.5)

    def wait_for_start(self, task: str, node: str | None) -> dict:
        return self.wait_for(lambda e: e.get("event") == "task_start" and e.get("task") == task
                             and e.get("node") == node)

    def send(self, signum: int) -> None:
        self.proc.send_signal(signum)

    def finish(self, timeout: float = 180) -> int:
        try:
            code = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            raise
        self._reader.join(10)
        self.stderr = self.proc.stderr.read()
        self.proc.stdout.close()
        self.proc.stderr.close()
        return code

    # --- what the run said ---------------------------------------------------------------------------
    @property
    def stream(self) -> list[dict]:
        return [e for _, e in self.events]

    @property
    def recap(self) -> dict:
        return next((e for e in reversed(self.stream) if e.get("event") == "recap"), {})

    def results(self, status: str | None = None) -> list[dict]:
        return [e for e in self.stream if e.get("event") == "task_result" and e.get("task")
                and (status is None or e.get("status") == status)]

    def status_of(self, task: str, node: str | None) -> str | None:
        return next((e["status"] for e in self.results() if e["task"] == task and e.get("node") == node), None)

    def when(self, wanted: Callable[[dict], bool]) -> float | None:
        return next((t for t, e in self.events if wanted(e)), None)

    def describe(self) -> str:
        rows = [f"{e.get('status')} {e.get('node')} {e.get('task')}: {e.get('message')}" for e in self.results()
                if e.get("status") not in ("ok", "changed")]
        return f"recap: {self.recap}\nnot ok: {rows}\nstderr: {self.stderr[-2000:]}"


# --- the lab --------------------------------------------------------------------------------------------------

def bootstrap_all(lab) -> Run:
    """A whole bootstrap, in process (the run journal under the lab's directory)."""
    return sparkctl(lab, "cluster", "bootstrap", str(lab.inventory_path))


def reset(lab, point: str) -> None:
    """Undo enough that a run has work at `point` and after it."""
    down = sparkctl(lab, "cluster", "down", str(lab.inventory_path), *([RESET[point]] if RESET[point] else []))
    assert down.exit_code == 0, down.describe()


def mgmt_veth(lab, node: str) -> str:
    return lab.names.mgmt_host_veth(lab.state.node(node).index)


def cut_link(lab, node: str) -> None:
    """The node's management cable pulled: its port on the lab's management bridge goes down (this lab's own)."""
    subprocess.run(["ip", "link", "set", mgmt_veth(lab, node), "down"], check=True, timeout=30)


def bootstrapped_pair(lab_factory):
    """The fault modules' lab: a pair, bootstrapped once (each test resets what its fault needs redone)."""
    lab = lab_factory(2, "pair")
    first = bootstrap_all(lab)
    assert first.exit_code == 0, first.describe()
    return lab


def restore_link(lab, node: str) -> None:
    """The cable back. The cut run's cluster lock on the node (runs/lock.py) is still held there (no FIN reached
    the node, so it waits out its lease); the rerun, from this controller where that run's process is gone, ends it
    at once instead of being refused as busy."""
    subprocess.run(["ip", "link", "set", mgmt_veth(lab, node), "up"], check=True, timeout=30)
    assert poll(lambda: ssh(lab, node, "true", timeout=10).returncode == 0, timeout=60), f"{node} did not come back"


def reachable(lab, node: str) -> bool:
    return ssh(lab, node, "true", timeout=15).returncode == 0


def pending_guards(lab, node: str) -> list[str]:
    """Netplan revert guards armed on the node and neither confirmed nor reverted (their process still waits)."""
    base = network_state_dir(lab.names.cluster_name)
    return lab.exec(node, ["sh", "-c", shipped_text("netplan-guards.sh"), "sh", base]).stdout.split()


def applied_marker(lab, node: str) -> bool:
    """A netplan apply of this run is done on the node (safe_apply touches applied-<id> right after it)."""
    directory = lab.node_path(node, network_state_dir(lab.names.cluster_name))
    try:
        return any(p.name.startswith("applied-") and not (directory / f"confirmed-{p.name[8:]}").exists()
                   for p in directory.iterdir())
    except OSError:
        return False


def half_written(lab, node: str) -> list[str]:
    """What a write cut short leaves: temp files sparkctl writes before renaming (`.NAME.sparkctl-XXXX`,
    `KEY.sparkctl-XXXX`, the network records' `.NAME.tmp`) anywhere it writes (the netplan dir, the user's home:
    keys, state dir; its root state), and a network record that is there but not whole: an empty netplan original
    or revert backup, an interfaces record that is not JSON."""
    found = lab.exec(node, ["find", "/etc/netplan", "/home/nvidia", "/var/lib/sparkctl", "(", "-name", "*.sparkctl-*",
                            "-o", "-path", "/var/lib/sparkctl/*", "-name", ".*.tmp", ")"]).stdout.split()
    network = network_state_dir(lab.names.cluster_name)
    records = lab.exec(node, ["find", network, "-type", "f", "-empty", "-name", "*.yaml"]).stdout.split()
    interfaces = lab.exec(node, f"f={network}/original/interfaces.json; [ ! -e $f ] || "
                                f"{{ [ \"$(head -c 1 $f)$(tail -c 2 $f)\" = '{{}}' ] || echo $f; }}").stdout.split()
    return found + records + interfaces


def stop_process(pid: int, signum: int = signal.SIGSTOP) -> None:
    os.kill(pid, signum)
