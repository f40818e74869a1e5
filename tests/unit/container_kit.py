"""Two recorded Sparks for the task tests: their facts, a fake transport that records every command, and a
cluster context whose facts are never gathered again."""

from __future__ import annotations

import json
import re

from sparkctl.facts import Address, ContainerInfo, Facts, Interface, RoceDevice
from sparkctl.inventory import Inventory
from sparkctl.plan.container import SPEC_LABEL
from sparkctl.tasks.container.ssh import desired_ssh_files
from sparkctl.tasks.context import ClusterContext, NodeContext, RunOptions
from sparkctl.transport.base import CommandResult
from tests.taskkit import answer, framed

TWINS = {0: ("enp1s0f0np0", "enP2p1s0f0np0"), 1: ("enp1s0f1np1", "enP2p1s0f1np1")}
ROCE = {"enp1s0f0np0": "rocep1s0f0", "enP2p1s0f0np0": "roceP2p1s0f0",
        "enp1s0f1np1": "rocep1s0f1", "enP2p1s0f1np1": "roceP2p1s0f1"}


class FakeTransport:
    """Answers commands by the first matching (regex, result) rule; records every command and file."""

    def __init__(self, node: str, rules: list[tuple[str, CommandResult | str]] | None = None):
        self.node = node
        self.round_trips = 0
        self.rules = rules or []
        self.commands: list[str] = []
        self.files: dict[str, str] = {}
        self.execs: list[tuple[str, str, str | None]] = []

    def _answer(self, cmd: str) -> CommandResult:
        for pattern, result in self.rules:
            if re.search(pattern, cmd):
                if not isinstance(result, CommandResult):
                    result = CommandResult(cmd, 0, answer(result, cmd), "")
                return result
        return CommandResult(cmd, 0, "", "")

    def run(self, cmd, *, sudo=False, timeout=60.0, input=None):
        self.round_trips += 1
        self.commands.append(cmd)
        return self._answer(cmd)

    def put(self, path, content, *, mode=0o644, owner=None, sudo=False):
        self.files[path] = content

    def read(self, path, *, sudo=False):
        return self.files.get(path)

    def exec_in(self, container, cmd, *, timeout=60.0, input=None, env=None):
        self.execs.append((container, cmd, input))
        return self._answer("exec_in " + cmd)

    def close(self):
        pass


def inventory(env: dict | None = None, nodes: int = 2) -> Inventory:
    return Inventory.model_validate({
        "cluster": {"name": "pair"}, "user": "nvidia",
        "nodes": [{"name": f"spark{i}", "host": f"10.0.0.{i}"} for i in range(1, nodes + 1)],
        "fabric": {"topology": "pair"},
        "container": {"image": "nvcr.io/nvidia/tensorrt-llm/release:1.3.0rc12", "env": env or {}},
    })


def node_facts(name: str, index: int, port: int = 1, container: ContainerInfo | None = None,
               listening: dict | None = None, image: bool = True) -> Facts:
    interfaces = {"enP7s7": Interface("enP7s7", 1500, "UP", True,
                                      addresses=[Address(f"10.0.0.{index}", 24, "inet", "global")])}
    roce = []
    for p, twins in TWINS.items():
        for twin, netdev in enumerate(twins):
            up = p == port
            addrs = [Address(f"192.168.{100 + twin}.{9 + index}", 24, "inet", "global")] if up else []
            interfaces[netdev] = Interface(netdev, 9000, "UP" if up else "DOWN", up, addresses=addrs)
            roce.append(RoceDevice(ROCE[netdev], 1, netdev, up))
    return Facts(node=name, hostname=name, user="nvidia", interfaces=interfaces, roce=roce,
                 management_interfaces=["enP7s7"], docker_cli=True, docker_access=True,
                 containers={"trtllm-multinode": container or ContainerInfo("trtllm-multinode", False)},
                 images={"nvcr.io/nvidia/tensorrt-llm/release:1.3.0rc12": "sha256:abc" if image else None},
                 listening_tcp=listening or {22: "sshd"}, hf_cache="/home/nvidia/.cache/huggingface")


def cluster(inv: Inventory, facts: dict[str, Facts], rules: dict[str, list] | None = None):
    events = []
    cctx = ClusterContext(inv, RunOptions(), events.append)
    for node in inv.nodes:
        ctx = NodeContext(cctx, node, FakeTransport(node.name, (rules or {}).get(node.name, [])))
        ctx._facts = facts[node.name]
        ctx.facts = lambda refresh=False, _c=ctx: _c._facts  # recorded facts: never gathered again
        cctx.add(ctx)
    return cctx, events


def running_like_plan(cctx, node: str, **override) -> ContainerInfo:
    spec = cctx.plan().nodes[node].container
    info = ContainerInfo("trtllm-multinode", True, running=True, status="running", image=spec.image,
                         labels={SPEC_LABEL: spec.spec_hash()}, env=dict(spec.env, PATH="/usr/bin"),
                         mounts=[{"Source": h, "Destination": i} for h, i, _ in spec.mounts])
    for key, value in override.items():
        setattr(info, key, value)
    return info


def pair(port2: int = 1, env=None, **containers):
    inv = inventory(env)
    facts = {"spark1": node_facts("spark1", 1), "spark2": node_facts("spark2", 2, port=port2)}
    return inv, facts


def probe_line(hostfile_env: dict) -> str:
    ranks = [{"rank": r, "hostname": f"spark{r + 1}", "env": hostfile_env, "sum_ok": True,
              "tx_bytes": {"enp1s0f1np1": 1 << 20}, "seconds": 0.01} for r in range(2)]
    return json.dumps({"size": 2, "bytes": 1 << 20, "seconds": 0.01, "ranks": ranks})


def ssh_listing(inv, facts, node, pubs, ssh_verdicts: str | None, more: tuple = ()):
    """What container.ssh's read prints; `ssh_verdicts` None: the read tried no pair (they are on record)."""
    cctx0, _ = cluster(inv, facts)
    want = desired_ssh_files(cctx0, pubs)
    tried = [] if ssh_verdicts is None else [("ssh", ssh_verdicts)]
    return framed([("sshd", "listening\n"), ("client", pubs[node][0] + "\n"), ("host", pubs[node][1] + "\n"),
                   ("node-authorized_keys", want["authorized_keys"]), ("node-known_hosts", want["known_hosts"]),
                   ("in-authorized_keys", want["authorized_keys"]), ("in-known_hosts", want["known_hosts"]),
                   *more, *tried])


PUBS = {"spark1": ("ssh-ed25519 AAA1 c@spark1", "ssh-ed25519 HHH1 h"),
        "spark2": ("ssh-ed25519 AAA2 c@spark2", "ssh-ed25519 HHH2 h")}
