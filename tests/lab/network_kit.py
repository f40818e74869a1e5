"""Shared by the bootstrap-network lab modules: run a bootstrap in-process, snapshot what it may touch.

No tests here (not named test_*, so pytest does not collect it).
"""

from __future__ import annotations

import json
import socket
from dataclasses import dataclass, field
from pathlib import Path

from click.testing import CliRunner

from sparkctl.cli.main import cli
from sparkctl.inventory import load_inventory
from sparkctl.lab.naming import ALL_TWINS
from sparkctl.plan.paths import network_state_dir
from sparkctl.runs.session import Session
from sparkctl.tasks.context import ClusterContext, NodeContext, RunOptions
from sparkctl.transport.connect import open_transport

PHASES = "preflight,network,ssh"
USER_SSH_DIR = "/home/nvidia/.ssh"

# Runs inside a node with the machine's python: one call reads everything bootstrap's first phases may touch.
SNAPSHOT_SCRIPT = r"""
import json, os, subprocess, sys
def files(d):
    out = {}
    if os.path.isdir(d):
        for n in sorted(os.listdir(d)):
            p = os.path.join(d, n)
            if os.path.isfile(p):
                with open(p) as fh:
                    out[n] = [oct(os.stat(p).st_mode & 0o7777), fh.read()]
    return out
twins = set(sys.argv[2].split(","))
links = json.loads(subprocess.run(["ip", "-j", "addr"], capture_output=True, text=True, check=True).stdout)
fabric = {l["ifname"]: {"mtu": l["mtu"], "inet": sorted("%s/%s" % (a["local"], a["prefixlen"])
          for a in l.get("addr_info", []) if a["family"] == "inet")} for l in links if l["ifname"] in twins}
print(json.dumps({"netplan": files("/etc/netplan"), "ssh": files(sys.argv[1]), "fabric": fabric}))
"""


@dataclass
class Run:
    """One `sparkctl ... --json` run, parsed."""

    exit_code: int
    events: list[dict]
    output: str
    recap: dict = field(default_factory=dict)

    @property
    def changed_total(self) -> int:
        return sum(row["changed"] for row in self.recap.get("nodes", {}).values())

    def results(self, status: str | None = None) -> list[dict]:
        return [e for e in self.events if e.get("event") == "task_result"
                and (status is None or e.get("status") == status)]

    def changed(self) -> set[tuple[str, str | None]]:
        """(task, node) of every changed outcome; node None for cluster-scope tasks."""
        return {(e["task"], e.get("node")) for e in self.results("changed")}

    def change_summaries(self, task: str) -> list[str]:
        return [c["summary"] for e in self.results() if e.get("task") == task for c in e.get("changes", [])]

    def describe(self) -> str:
        failed = [f"{e.get('task')}@{e.get('node')}: {e.get('message')} {e.get('details')}"
                  for e in self.results() if e.get("status") in ("failed", "unreachable")]
        return f"exit {self.exit_code}; failed: {failed}; recap: {self.recap}\n{self.output[-3000:]}"


def sparkctl(lab, *args: str, json_events: bool = True) -> Run:
    """`sparkctl ARGS` in-process; the run journal goes under the lab's directory, not the user's home."""
    runner = CliRunner(env={"XDG_STATE_HOME": str(Path(lab.dir) / "xdg-state")})
    argv = [*args, "--json"] if json_events else list(args)
    result = runner.invoke(cli, argv, catch_exceptions=False)
    events = []
    for line in result.stdout.splitlines():
        if line.startswith("{"):
            events.append(json.loads(line))
    recap = next((e for e in reversed(events) if e.get("event") == "recap"), {})
    return Run(result.exit_code, events, result.output, recap)


def bootstrap(lab, *extra: str, json_events: bool = True) -> Run:
    return sparkctl(lab, "cluster", "bootstrap", str(lab.inventory_path), "--only", PHASES, *extra,
                    json_events=json_events)


def snapshot_node(lab, node: str) -> dict:
    result = lab.exec(node, ["python3", "-c", SNAPSHOT_SCRIPT, USER_SSH_DIR, ",".join(ALL_TWINS)], check=True)
    return json.loads(result.stdout)


def snapshot(lab) -> dict[str, dict]:
    """Per node: /etc/netplan and ~/.ssh files (mode, content), fabric twins' IPv4 addresses and MTU."""
    return {n.name: snapshot_node(lab, n.name) for n in lab.nodes}


def fabric_of(lab, node: str) -> dict[str, dict]:
    return snapshot_node(lab, node)["fabric"]


def node_context(lab, node: str, confirm_timeout: float, connect_timeout: float = 5) -> NodeContext:
    """A task's view of one lab node, as a run builds it: a session, and a way to open a NEW connection."""
    inventory = load_inventory(lab.inventory_path)
    specs = {n.name: Session(inventory).address(n.name) for n in inventory.nodes}
    options = dict(known_hosts_path=inventory.ssh.known_hosts, use_ssh_config=False, connect_timeout=connect_timeout)
    cluster = ClusterContext(inventory, RunOptions(netplan_confirm_timeout=confirm_timeout), emit=lambda _e: None,
                             new_transport=lambda name: open_transport(specs[name], **options))
    ctx = NodeContext(cluster, next(n for n in inventory.nodes if n.name == node),
                      open_transport(specs[node], **options))
    cluster.add(ctx)
    return ctx


def state_files(lab, node: str, cluster: str) -> list[str]:
    return lab.exec(node, ["ls", network_state_dir(cluster)]).stdout.split()


def port_open(host: str, port: int = 22, timeout: float = 1) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def mgmt_addresses(lab, node: str) -> list[str]:
    out = lab.exec(node, ["ip", "-4", "-o", "addr", "show", "dev", "enP7s7"]).stdout
    return sorted(line.split()[3] for line in out.splitlines())
