"""Exercising tasks without a network: recorded Facts, a recording transport, the real contexts around them.

The contexts are sparkctl's own `ClusterContext`/`NodeContext` (so `plan()`, `must()`, `run_on_all()` are the
real code); only `facts()` is served from recorded Facts instead of a gather round trip. The transport records
every command and file and answers from canned rules; a rule may change what the node shows afterwards
(`then=`), which is how "netplan apply changed the addresses" is simulated.

Fixture files (tests/fixtures/tasks/<task>/<case>.yaml) describe facts with `facts_from_spec`.
"""

from __future__ import annotations

import copy
import hashlib
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from sparkctl.errors import Unreachable
from sparkctl.facts import Address, Facts, Interface, NetplanFile, RoceDevice, facts_from_output
from sparkctl.facts.model import ContainerInfo
from sparkctl.inventory import Inventory, load_inventory
from sparkctl.plan import plan_cluster
from sparkctl.plan.container import SPEC_LABEL
from sparkctl.taskgraph.events import Event
from sparkctl.tasks.context import ClusterContext, NodeContext, RunOptions
from sparkctl.transport.base import CommandResult
from sparkctl.transport.framing import MARKER
from sparkctl.transport.held import HeldCommand

REPO = Path(__file__).resolve().parent.parent
FACT_CAPTURES = REPO / "tests" / "fixtures" / "facts"
TASK_FIXTURES = REPO / "tests" / "fixtures" / "tasks"

# nvidia/connect-two-sparks/README.md, Step 2: the four CX-7 twins of a Spark and their RoCE devices, by port.
SPARK_PORTS: dict[int, tuple[tuple[str, str], tuple[str, str]]] = {
    0: (("enp1s0f0np0", "rocep1s0f0"), ("enP2p1s0f0np0", "roceP2p1s0f0")),
    1: (("enp1s0f1np1", "rocep1s0f1"), ("enP2p1s0f1np1", "roceP2p1s0f1")),
}
MANAGEMENT = "enP7s7"
# What docker printed on a fresh lab node before its image store existed: broken, not a permission problem.
DOCKER_BROKEN = ("Error: overlay: can't stat imageStore dir /var/lib/sparkctl-lab/image-store: stat "
                 "/var/lib/sparkctl-lab/image-store: no such file or directory")
PLANNED = "@planned"


# --- the recording transport --------------------------------------------------------------------------------

@dataclass
class Call:
    kind: str                     # "run" | "put" | "read" | "exec_in" | "hold"
    target: str                   # the command, or the path
    sudo: bool = False
    input: str | None = None
    content: str | bytes | None = None
    mode: int | None = None
    owner: str | None = None


@dataclass
class Rule:
    pattern: re.Pattern[str]
    stdout: str | Callable[[], str] = ""
    exit_code: int = 0
    stderr: str = ""
    then: Callable[[], None] | None = None


class RecordingTransport:
    """Records what a task sends; answers from the first matching rule (default: exit 0, no output)."""

    def __init__(self, node: str, log: list[tuple[str, Call]] | None = None, label: str | None = None):
        self.node = node
        self.log = log if log is not None else []
        self.label = label or node
        self.round_trips = 0
        self.calls: list[Call] = []
        self.rules: list[Rule] = []
        self.files: dict[str, str | bytes] = {}
        self.on_put: list[Callable[[Call], None]] = []
        self.closed = False
        self.dead = False  # the run's connection died under it (keepalives unanswered)

    def respond(self, pattern: str, stdout: str | Callable[[], str] = "", exit_code: int = 0, stderr: str = "",
                then: Callable[[], None] | None = None) -> RecordingTransport:
        """Answer commands matching `pattern` (a regex); `stdout` may be a callable (read at answer time)."""
        self.rules.append(Rule(re.compile(pattern, re.S), stdout, exit_code, stderr, then))
        return self

    def run(self, cmd: str, *, sudo: bool = False, timeout: float = 60.0, input: str | None = None) -> CommandResult:
        self.round_trips += 1
        self._record(Call("run", cmd, sudo=sudo, input=input))
        return self._answer(cmd)

    def _answer(self, cmd: str) -> CommandResult:
        for rule in self.rules:
            if rule.pattern.search(cmd):
                if rule.then:
                    rule.then()
                return CommandResult(cmd, rule.exit_code, answer(rule.stdout, cmd), rule.stderr)
        return CommandResult(cmd, 0, "", "")

    def put(self, path: str, content: str | bytes, *, mode: int = 0o644, owner: str | None = None,
            sudo: bool = False) -> None:
        self.round_trips += 1
        call = Call("put", path, sudo=sudo, content=content, mode=mode, owner=owner)
        self._record(call)
        self.files[path] = content
        for hook in self.on_put:
            hook(call)

    def read(self, path: str, *, sudo: bool = False) -> str | None:
        self.round_trips += 1
        self._record(Call("read", path, sudo=sudo))
        value = self.files.get(path)
        return value.decode() if isinstance(value, bytes) else value

    def exec_in(self, container: str, cmd: str, *, timeout: float = 60.0, input: str | None = None,
                env: dict[str, str] | None = None) -> CommandResult:
        self.round_trips += 1
        self._record(Call("exec_in", f"{container}: {cmd}", input=input))
        return self._answer(cmd)

    def hold(self, script: str, *args: str, what: str = "held command") -> HeldCommand:
        """A held command (the cluster lock) on a node where nobody holds it: granted, released on request."""
        self.round_trips += 1
        self._record(Call("hold", what))
        return HeldCommand(GrantingStream(), what)

    def close(self) -> None:
        self.closed = True

    def connection_dead(self) -> bool:
        return self.dead

    def _record(self, call: Call) -> None:
        self.calls.append(call)
        self.log.append((self.label, call))

    @property
    def commands(self) -> list[str]:
        return [c.target for c in self.calls if c.kind == "run"]

    @property
    def puts(self) -> list[Call]:
        return [c for c in self.calls if c.kind == "put"]


class GrantingStream:
    """The node side of runs.lock's hold script, when the lock is free: `acquired`, then `released` on request."""

    def __init__(self) -> None:
        self.out = b"sparkctl-lock acquired\n"

    def recv(self, timeout: float) -> bytes | None:
        data, self.out = self.out, b""
        return data or None

    def send(self, data: bytes) -> None:
        if data.strip() == b"release":
            self.out += b"sparkctl-lock released\n"

    def close(self) -> None:
        pass


# --- contexts on recorded facts -----------------------------------------------------------------------------

class RecordedNodeContext(NodeContext):
    """The real NodeContext, with facts read from `self.shows` (what the node would report right now)."""

    def __init__(self, cluster: ClusterContext, node: Any, transport: RecordingTransport, facts: Facts):
        super().__init__(cluster, node, transport)
        self.shows = facts
        transport.on_put.append(self._file_written)

    def _file_written(self, call: Call) -> None:
        """A netplan file put on the node shows in its next facts, as a real gather would read it."""
        if call.target.startswith("/etc/netplan/"):
            content = call.content.decode() if isinstance(call.content, bytes) else call.content
            others = [f for f in self.shows.netplan_files if f.path != call.target]
            self.shows.netplan_files = sorted([*others, NetplanFile(call.target, content, call.mode)],
                                              key=lambda f: f.path)

    def _read_facts(self, side_reads: dict[str, tuple[str, float]] | None = None) -> Facts:
        if isinstance(self.shows, BaseException):  # the node stopped answering
            raise self.shows
        return copy.deepcopy(self.shows)  # reads ahead are not run: each task reads for itself


def inspected(kit: Kit, node: str, name: str, line: str) -> None:
    """`node`'s facts show container `name` as `docker inspect` read it: `line` is "RUNNING LABEL POLICY" ("true
    <spec hash> unless-stopped"); empty: no such container."""
    shows = kit.node(node).shows
    kit.node(node).invalidate()  # facts read before this show it too
    if not line.split():
        shows.containers.pop(name, None)
        return
    running, label, policy = (line.split() + ["", ""])[:3]
    shows.containers[name] = ContainerInfo(name, exists=True, running=running == "true",
                                           status="running" if running == "true" else "exited",
                                           labels={SPEC_LABEL: label}, restart_policy=policy or None)


@dataclass
class Kit:
    """One cluster of recorded nodes: contexts, their transports, the events, and the fresh connections."""

    cluster: ClusterContext
    events: list[Event]
    fresh: list[RecordingTransport] = field(default_factory=list)
    log: list[tuple[str, Call]] = field(default_factory=list)   # every call on every transport, in order
    fresh_rules: list[tuple[str, str, int]] = field(default_factory=list)
    refuse_fresh: bool = False

    def node(self, name: str) -> RecordedNodeContext:
        return self.cluster.nodes[name]  # type: ignore[return-value]

    def transport(self, name: str) -> RecordingTransport:
        return self.cluster.nodes[name].transport  # type: ignore[return-value]

    def warnings(self) -> list[str]:
        return [e.message or "" for e in self.events if e.event == "warning"]


def make_kit(inventory: Inventory, facts_by_node: dict[str, Facts], options: RunOptions | None = None) -> Kit:
    events: list[Event] = []
    kit_holder: dict[str, Kit] = {}

    def new_transport(node: str) -> RecordingTransport:
        kit = kit_holder["kit"]
        if kit.refuse_fresh:
            raise Unreachable(f"{node}: connection refused")
        transport = RecordingTransport(node, kit.log, f"{node} (new connection)")
        for pattern, stdout, code in kit.fresh_rules:
            transport.respond(pattern, stdout, code)
        kit.fresh.append(transport)
        return transport

    cluster = ClusterContext(inventory, options or RunOptions(), events.append,
                             new_transport=new_transport)
    kit = Kit(cluster, events, fresh_rules=[(r"touch .*confirmed-", "confirmed\n", 0)])
    kit_holder["kit"] = kit
    for node in inventory.nodes:
        if node.name in facts_by_node:
            cluster.add(RecordedNodeContext(cluster, node, RecordingTransport(node.name, kit.log),
                                            facts_by_node[node.name]))
    return kit


# --- facts --------------------------------------------------------------------------------------------------

def _address(text: str) -> Address:
    ip, _, prefix = text.partition("/")
    family = "inet6" if ":" in ip else "inet"
    scope = "link" if ip.startswith(("169.254.", "fe80:")) else "global"
    return Address(ip=ip, prefixlen=int(prefix or (128 if family == "inet6" else 32)), family=family, scope=scope)


def spark_facts(node: str, *, up_ports: tuple[int, ...] = (1,), addresses: dict[str, list[str]] | None = None,
                mtu: dict[str, int] | int = 1500, user: str = "nvidia", sudo: bool = True,
                dgx: bool = True, docker: str = "ok", session_ip: str = "10.0.0.11",
                netplan_files: list[NetplanFile] | None = None, speed_mbps: int | None = 200_000,
                firewall: str | None = None, time: float = 1_800_000_000.0, set_down: tuple[str, ...] = (),
                no_carrier: tuple[str, ...] = ()) -> Facts:
    """A Spark as it reports itself: four CX-7 twins (those of `up_ports` Up, but those in `no_carrier` without
    carrier and those in `set_down` administratively down), enP7s7 carrying the session. Flags as `ip -j addr`
    shows them."""
    addresses = addresses or {}
    interfaces: dict[str, Interface] = {}
    roce: list[RoceDevice] = []
    for port, twins in SPARK_PORTS.items():
        for netdev, device in twins:
            up = port in up_ports and netdev not in set_down and netdev not in no_carrier
            flags = ["BROADCAST", "MULTICAST"] + ([] if netdev in set_down else ["UP"]) + \
                (["LOWER_UP"] if up else [] if netdev in set_down else ["NO-CARRIER"])
            roce.append(RoceDevice(device=device, port=1, netdev=netdev, up=up))
            interfaces[netdev] = Interface(
                name=netdev, mtu=mtu.get(netdev, 1500) if isinstance(mtu, dict) else mtu,
                operstate="UP" if up else "DOWN", carrier=up if netdev not in set_down else None,
                addresses=[_address(a) for a in addresses.get(netdev, [])],
                speed_mbps=speed_mbps if up else None, flags=flags,
            )
    interfaces[MANAGEMENT] = Interface(name=MANAGEMENT, mtu=1500, operstate="UP", carrier=True,
                                       addresses=[_address(f"{session_ip}/24")], speed_mbps=10_000)
    for name, extra in addresses.items():
        if name not in interfaces:
            interfaces[name] = Interface(name=name, mtu=1500, operstate="UP", carrier=True,
                                         addresses=[_address(a) for a in extra])
    facts = Facts(
        node=node, hostname=node, os_id="ubuntu", os_version="24.04", arch="aarch64",
        dgx_name="DGX Spark" if dgx else None, is_dgx_spark=dgx, user=user, uid=1000,
        groups=[user, "sudo"] + (["docker"] if docker == "ok" else []), sudo_nopasswd=sudo,
        interfaces=interfaces, roce=roce, session_ip=session_ip,
        netplan_files=list(netplan_files or []), docker_cli=docker != "absent", docker_access=docker == "ok",
        docker_error={"denied": "permission denied while trying to connect to the docker daemon socket",
                      "broken": DOCKER_BROKEN}.get(docker),
        time=time, firewall=firewall, hf_cache=f"/home/{user}/.cache/huggingface",
    )
    facts.management_interfaces = [n for n, i in interfaces.items()
                                   if any(a.ip == session_ip for a in i.addresses)]
    return facts


def captured_facts(name: str, node: str = "spark1") -> Facts:
    """Facts parsed from a real gather capture in tests/fixtures/facts (rendered with nonce `fixture`)."""
    return facts_from_output((FACT_CAPTURES / name).read_text(), "fixture", node,
                             container_names=["trtllm-multinode"],
                             image_refs=["nvcr.io/nvidia/tensorrt-llm/release:1.3.0rc12"])


def facts_from_spec(node: str, spec: dict[str, Any]) -> Facts:
    """Facts from a fixture's description: `capture: <file>` (a real capture) or spark_facts keywords."""
    spec = dict(spec)
    if "capture" in spec:
        return captured_facts(spec.pop("capture"), node)
    if "netplan_files" in spec:
        spec["netplan_files"] = [NetplanFile(f["path"], f.get("content"), int(str(f.get("mode", "600")), 8))
                                 for f in spec["netplan_files"]]
    for key in ("up_ports", "set_down", "no_carrier"):
        if key in spec:
            spec[key] = tuple(spec[key])
    return spark_facts(node, **spec)


# --- inventories and fixtures -------------------------------------------------------------------------------

def inventory(name: str = "two-sparks.yaml") -> Inventory:
    path = Path(name)
    return load_inventory(path if path.is_absolute() else REPO / "inventories" / name)


def inventory_from_yaml(text: str, tmp_path: Path, name: str = "inventory.yaml") -> Inventory:
    path = tmp_path / name
    path.write_text(text)
    return load_inventory(path)


def task_cases(task: str) -> list[tuple[str, dict[str, Any]]]:
    """Every fixture case of a task, sorted by name: [(case, data)] for pytest.mark.parametrize."""
    folder = TASK_FIXTURES / task
    return [(p.stem, yaml.safe_load(p.read_text())) for p in sorted(folder.glob("*.yaml"))]


def kit_from_case(case: dict[str, Any], options: RunOptions | None = None) -> Kit:
    """The kit a fixture describes. A netplan file whose content is `@planned` holds what the plan renders."""
    inv = inventory(case.get("inventory", "two-sparks.yaml"))
    facts = {name: facts_from_spec(name, spec or {}) for name, spec in case["facts"].items()}
    if any(f.content == PLANNED for fs in facts.values() for f in fs.netplan_files):
        plan = plan_cluster(inv, facts)
        for name, node_facts in facts.items():
            for f in node_facts.netplan_files:
                if f.content == PLANNED:
                    f.content = plan.nodes[name].netplan
    return make_kit(inv, facts, options)


def install_effects(kit: Kit, node: str, effects: list[dict[str, Any]]) -> None:
    """`{after: <regex>, shows: <facts spec>}`: once a matching command ran, the node shows those interfaces
    (its netplan files stay as written)."""
    ctx = kit.node(node)
    for effect in effects:
        def become(spec=effect["shows"]) -> None:
            new = facts_from_spec(node, spec)
            new.netplan_files = ctx.shows.netplan_files
            ctx.shows = new
        kit.transport(node).respond(effect["after"], then=become)


def ssh_read_output(files: dict[str, str | None], home: str = "/home/nvidia") -> Callable[[str], str]:
    """What ssh.mesh's read script prints for these files (None or missing: absent), as `awk 1` prints them, and
    the `login` section when the dict has one (tasks/ssh/proofs.py); read when the script asks (the dict may change
    in between)."""
    from sparkctl.tasks.ssh.mesh import FILES

    def sections() -> list[tuple]:
        out: list[tuple] = []
        for name in FILES:
            content = files.get(name)
            out.append((name, "", 2) if content is None else (name, content if content.endswith("\n") or not content
                                                               else content + "\n"))
        login = [("login", files["login"])] if files.get("login") is not None else []
        return [*out, ("home", home), *login]

    return framed(sections)


# --- framed output ------------------------------------------------------------------------------------------

_NONCE = re.compile(re.escape(MARKER) + r":([0-9a-f]+):begin ")


def sha256sum_lines(*contents: str) -> str:
    """What a node's `sha256sum FILE...` prints for files holding `contents`, in order."""
    return "".join(f"{hashlib.sha256(c.encode()).hexdigest()}  /file{i}\n" for i, c in enumerate(contents))


def nonce_of(script: str) -> str:
    """The framing nonce a script was written with (the answer must use it)."""
    found = _NONCE.search(script)
    if found is None:
        raise AssertionError(f"not a framed script: {script[:200]!r}")
    return found.group(1)


def framed(sections: list[tuple] | Callable[[], list[tuple]]) -> Callable[[str], str]:
    """An answer to a framed script: (name, output[, exit status]) sections, in order, as the node prints them,
    with the nonce of the script that asks. `sections` may be a callable, read at answer time."""
    def render(script: str) -> str:
        if not _NONCE.search(script):
            return ""  # another command the rule's pattern happens to match: no sections, no output
        nonce = nonce_of(script)
        out = []
        for name, text, *rc in (sections() if callable(sections) else sections):
            out.append(f"{MARKER}:{nonce}:begin {name}@@\n{text}\n{MARKER}:{nonce}:end {name} "
                       f"{rc[0] if rc else 0}@@\n")
        return "".join(out)

    render.wants_script = True  # type: ignore[attr-defined]
    return render


def answer(stdout: str | Callable[..., str], script: str) -> str:
    """A canned answer: text, a callable read at answer time, or a framed answer (given the script)."""
    if getattr(stdout, "wants_script", False):
        return stdout(script)  # type: ignore[operator]
    return stdout() if callable(stdout) else stdout


def normalize_run_id(text: str) -> str:
    """The netplan revert id is a timestamp: replace it so commands compare exactly."""
    return re.sub(r"(revert|confirmed|reverted|applied|guard)-\d+", r"\1-RUNID", text)


# --- reading --json output -----------------------------------------------------------------------------------

def json_lines(stdout: str) -> list[dict]:
    """Every line of a --json output, each checked against the published schema (cli/json_schema.py)."""
    import json

    from sparkctl.cli.json_schema import validate_line

    lines = [json.loads(line) for line in stdout.splitlines() if line.strip()]
    for line in lines:
        validate_line(line)
    return lines


def doctor_report(stdout: str) -> dict:
    """`doctor --json` read back: the report line's fields, and `findings` (those of the last diagnosis)."""
    lines = json_lines(stdout)
    report = lines[-1]
    assert report["event"] == "report" and report["report"] == "doctor", report
    findings = [line for line in lines if line["event"] == "finding"]
    if any(f.get("diagnosis") == "after-fix" for f in findings):
        findings = [f for f in findings if f.get("diagnosis") == "after-fix"]
    return {**report, "findings": findings, "lines": lines}


class Records(dict):
    """Proofs on record in memory (the ProofRecords protocol of tasks/context.py; runs/proofs.py keeps them in a
    file)."""

    def get(self, key):
        return super().get(key)

    def put(self, key, value):
        if value is None:
            self.pop(key, None)
        else:
            self[key] = value
