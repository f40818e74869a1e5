"""Everything doctor looked at, as plain data: the input of the PURE checks (no I/O in here)."""

from __future__ import annotations

import ipaddress
import shlex
from dataclasses import dataclass, field, replace

from sparkctl.doctor.node_probes import SystemProbe
from sparkctl.facts import Facts
from sparkctl.inventory import Inventory, Node
from sparkctl.inventory.placement import World
from sparkctl.plan import ClusterPlan, PlanError, plan_cluster
from sparkctl.plan.fabric import select_ports


@dataclass
class LinkProbe:
    """A don't-fragment ping of MTU-28 bytes from one twin to a peer's address on the same subnet."""

    interface: str
    peer: str
    peer_ip: str
    verdict: str  # "ok" | "mtu" (a small ping passes) | "dead"


@dataclass
class SshProbe:
    """A mesh try (rules/mesh.py: `ssh -N -o BatchMode=yes <target>`, ended once authenticated) from a node (or its
    container) to a peer."""

    peer: str
    target: str
    ok: bool
    error: str = ""
    #: "ok", "fail" (the pair is broken) or "unknown" (the try could not run: the peer's sshd reset or timed out
    #: the handshake)
    state: str = ""

    @property
    def unchecked(self) -> bool:
        return self.state == "unknown"


@dataclass
class ModelCache:
    repo: str
    state: str  # "complete" | "incomplete" | "absent"
    detail: str = ""
    #: files of its snapshot changed since the node verified them against the Hub's hashes (plan/hub_hashes.py)
    changed: int = 0


@dataclass(slots=True)
class NodeProbe:
    """What the active probes of one node returned (one round trip). Empty fields: not probed."""

    error: str | None = None
    #: the node stopped answering between its facts and its probes (the transport said so: errors.Unreachable)
    lost: bool = False
    pings: list[LinkProbe] = field(default_factory=list)
    ssh: list[SshProbe] = field(default_factory=list)
    container_ssh: list[SshProbe] = field(default_factory=list)
    container_hostfile: str | None = None
    container_authorized_keys: str | None = None
    container_logs: str = ""
    #: management addresses on which the container's sshd answered (it must not)
    exposed: list[str] = field(default_factory=list)
    #: (node, its management address, port) that accepted this node's connection over the management network:
    #: another node's listeners, asked from here (doctor's exposure check); a lone node's, asked from the controller
    answered: list[tuple[str, str, int]] = field(default_factory=list)
    port_owners: dict[int, str] = field(default_factory=dict)
    hf_token_file: bool | None = None
    models: list[ModelCache] = field(default_factory=list)
    serve_log_exists: bool = False
    serve_log_tail: str = ""
    nccl_log: str = ""
    health_status: int | None = None  # HTTP status of /health; 0: no answer; None: not probed (not the head)
    health_error: str = ""
    completion: str | None = None
    completion_error: str = ""
    #: the gateway container's `docker inspect` state ("running", "exited", ...), "absent"; None: not probed
    gateway: str | None = None
    #: what `ss -ltnH` lists at the serve port (the gateway's)
    gateway_ss: str = ""
    #: what the gateway shows a TLS client (serve.tls): its certificate in PEM, or "no TLS: why"; None: not probed
    served_certificate: str | None = None
    #: the figures collector's `docker inspect` state, "absent"; None: not probed (the engine needs none)
    collector: str | None = None
    #: `systemctl show` of the serving unit (LoadState=not-found when absent); None: not probed
    unit: dict[str, str] | None = None
    #: the unit's last runs, from exits.log (plan/serve_unit.py parse_exits)
    unit_exits: str = ""
    #: a launch with Ray (plan/launch.py programs): whether the container has `ray`; None: not probed
    ray_found: bool | None = None
    #: a worker whose rank connects to the head's rendezvous (plan/launch.py): (address:port, whether it answers
    #: from this node); None: not probed
    rendezvous: tuple[str, bool] | None = None
    #: kernel, driver, CUDA, RoCE devices and GIDs, settings that override sparkctl's
    system: SystemProbe = field(default_factory=SystemProbe)
    #: with several worlds, the node as each other world sees it (by World.key; the fields of WORLD_FIELDS are that
    #: world's, the rest the node's); the probe's own world fields are the first world's
    worlds: dict[str, NodeProbe] = field(default_factory=dict)


#: What a node's probe reads of one world: its unit, log, /health and completion, its figures collector, a worker's
#: rendezvous.
WORLD_FIELDS = ("serve_log_exists", "serve_log_tail", "nccl_log", "health_status", "health_error", "completion",
                "completion_error", "collector", "unit", "unit_exits", "rendezvous")


def without_world(probe: NodeProbe) -> NodeProbe:
    """The probe with no world's fields read (a node outside a world, as that world sees it)."""
    blank = NodeProbe()
    return replace(probe, worlds={}, **{name: getattr(blank, name) for name in WORLD_FIELDS})


@dataclass
class Snapshot:
    """One look at the cluster: facts of each reachable node, the probes, and the plan built from them."""

    inventory: Inventory
    facts: dict[str, Facts]
    unreachable: dict[str, str] = field(default_factory=dict)
    probes: dict[str, NodeProbe] = field(default_factory=dict)
    plan: ClusterPlan | None = None
    plan_error: str | None = None
    become_password_given: bool = False
    #: the recorded `fabric bench` results of this cluster, newest first (runs/bench_records.py)
    bench_history: list[dict] = field(default_factory=list)
    #: --limit: the nodes diagnosed (every node is read: the plan is the whole cluster's); None: all
    limit: frozenset[str] | None = None
    #: why each unreachable node was (errors.Unreachable.kind): network, auth, host_key, lost
    unreachable_kinds: dict[str, str] = field(default_factory=dict)
    #: a run holding the cluster lock while doctor looked (what it saw may be mid-change)
    busy: str | None = None
    #: serve.tls's certificate as it is on this machine now (PEM); None: no serve.tls, or unreadable
    tls_certificate: str | None = None

    @property
    def order(self) -> list[str]:
        """Reachable nodes, head first, in inventory order."""
        return [n.name for n in self.inventory.nodes if n.name in self.facts]

    @property
    def all_nodes(self) -> list[str]:
        return [n.name for n in self.inventory.nodes]

    @property
    def diagnosed(self) -> list[str]:
        """The nodes whose findings are reported (--limit), in inventory order."""
        return [n for n in self.all_nodes if self.limit is None or n in self.limit]

    def probe(self, node: str) -> NodeProbe:
        return self.probes.get(node) or NodeProbe()

    def for_world(self, world: World) -> Snapshot:
        """The snapshot as one world of several sees it: its inventory (Inventory.for_world) and each node's probe
        with that world's fields (NodeProbe.worlds; the first world's are the probe's own)."""
        probes = {node: probe if not world.key else probe.worlds.get(world.key) or without_world(probe)
                  for node, probe in self.probes.items()}
        return replace(self, inventory=self.inventory.for_world(world), probes=probes)

    def node(self, name: str) -> Node:
        return self.inventory.node(name)

    def path_broken(self, node: str, target: str) -> bool:
        """The far end of a probe is already explained: the node is lost, or the address (`user@ip` or `ip`)
        is not on an Up interface of it (the fabric findings say why)."""
        f = self.facts.get(node)
        if f is None:
            return True
        ip = target.rpartition("@")[2]
        try:
            ipaddress.ip_address(ip)
        except ValueError:
            return False
        if ip in self.duplicated_ips():
            return True  # two nodes answer for it: fabric.address_duplicate says which
        holders = f.interfaces_holding(ip)
        return not holders or not any(f.interface_up(h) for h in holders)

    def duplicated_ips(self) -> set[str]:
        """IPv4 addresses (not link-local) that more than one node holds."""
        owners: dict[str, set[str]] = {}
        for node, f in self.facts.items():
            for iface in f.interfaces.values():
                for a in iface.ipv4():
                    if not a.is_link_local and not a.ip.startswith("127."):
                        owners.setdefault(a.ip, set()).add(node)
        return {ip for ip, nodes in owners.items() if len(nodes) > 1}

    def link_broken(self, node: str, peer: str, target: str) -> bool:
        """path_broken at the far end, or the near end lacks its own planned address on the target's subnet."""
        if self.path_broken(peer, target):
            return True
        ip = target.rpartition("@")[2]
        if self.plan is None or node not in self.facts:
            return False
        try:
            address = ipaddress.ip_address(ip)
        except ValueError:
            return False
        mine = [a for a in self.plan.fabric.addresses.get(node, {}).values() if address in a.network]
        return any(self.path_broken(node, str(a.ip)) for a in mine)

    def user_of(self, name: str) -> str:
        return self.node(name).user or self.inventory.user

    def bootstrap(self, only: str) -> str:
        """The command that repairs a finding: bootstrap limited to the tasks or phase that own it."""
        source = shlex.quote(str(self.inventory.source or "inventory.yaml"))
        return f"sparkctl cluster bootstrap {source} --only {shlex.quote(only)}"


def doctor_plan(inventory: Inventory, facts: dict[str, Facts]) -> tuple[ClusterPlan | None, str | None]:
    """The desired state from the facts; a node whose facts allow no plan (no Up port) is planned from the
    inventory alone, so the others are still diagnosed against a plan. (plan, why a node could not be)."""
    try:
        return plan_cluster(inventory, facts), None
    except PlanError:
        pass
    usable = dict(facts)
    why = None
    for node in inventory.nodes:
        if node.name not in usable:
            continue
        try:
            select_ports(inventory, node, usable[node.name])
        except PlanError as exc:
            why = why or str(exc)
            usable.pop(node.name)
    try:
        return plan_cluster(inventory, usable), why
    except PlanError as exc:
        try:
            return plan_cluster(inventory, {}), str(exc)
        except PlanError as again:
            return None, str(again)
