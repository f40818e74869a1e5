"""`sparkctl inventory init`: reach the given hosts, read their facts, and write a commented inventory from what
the nodes say about themselves.

Never guesses silently: every assumption is returned (and written as a comment) so the CLI can show it.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field

import yaml

from sparkctl.errors import SparkctlError, Unreachable
from sparkctl.facts import Facts, gather_facts, gather_local_controller_addrs
from sparkctl.rules.cabling import Proposal, propose
from sparkctl.transport.connect import DEFAULT_KNOWN_HOSTS, NodeAddress, connect_all


@dataclass
class InitResult:
    text: str
    assumptions: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    #: what LLDP showed about the cabling (not assumed: seen on the wire)
    seen: list[str] = field(default_factory=list)


def _node_name(hostname: str, used: set[str], index: int) -> str:
    name = re.sub(r"[^a-z0-9-]+", "-", hostname.split(".")[0].lower()).strip("-")[:63] or f"spark{index + 1}"
    base, n = name, 2
    while name in used:
        name, n = f"{base}-{n}", n + 1
    used.add(name)
    return name


def describe_cluster(hosts: list[str], facts: list[Facts], *, cluster: str = "sparks",
                     controller_addrs: frozenset[str] = frozenset(), ssh: dict[str, str] | None = None) -> InitResult:
    """hosts[i] was reached as facts[i]; returns the inventory text, what was assumed, and what is wrong.
    `ssh`: the inventory's ssh section, as the nodes were reached (identity_file, known_hosts)."""
    assumptions: list[str] = []
    problems: list[str] = []
    users = {f.user for f in facts}
    if len(users) > 1:
        problems.append("the username differs between nodes (" + ", ".join(
            f"{h}: {f.user}" for h, f in zip(hosts, facts, strict=True)) + "); use one user everywhere")
    count = len(hosts)
    wire = propose(list(hosts), dict(zip(hosts, facts, strict=True)), {h: h for h in hosts}) if count > 1 \
        else Proposal()
    seen: list[str] = []
    if wire.order:
        # the head stays first; the others follow the cables (a ring: port 0 to the next node's port 1)
        by_host = dict(zip(hosts, facts, strict=True))
        hosts, facts = list(wire.order), [by_host[h] for h in wire.order]
    up = [f.up_ports() for f in facts]
    port: int | str  # a QSFP port number, or "auto"
    if count == 1:
        topology, port = "single", "auto"
    elif wire.topology == "ring" and wire.order:
        topology, port = "ring", "auto"
    elif wire.problems:
        topology, port = "ring", "auto"
        problems.extend(wire.problems)
    elif wire.topology == "pair":
        topology, port = "pair", wire.port if wire.port is not None else "auto"
        seen.append("the two nodes are cabled to each other" + (f" on port {port}" if port != "auto" else ""))
    elif wire.topology == "switch" and count > 2:
        topology, port = "switch", _one_port(up)
        seen.extend(wire.evidence)
    elif all(set(u) == {0, 1} for u in up) and count >= 3:
        topology, port = "ring", "auto"
        assumptions.append("both QSFP ports are Up on every node and LLDP shows nothing: assumed a ring in the order "
                           "given (port 0 to the next node's port 1)")
    else:
        topology = "pair" if count == 2 else "switch"
        if count > 2:
            assumptions.append(f"{count} nodes with one port Up each: assumed they meet at a switch")
        ports = {p for u in up for p in u}
        if any(not u for u in up):
            problems.append("no QSFP port is Up on " + ", ".join(
                h for h, u in zip(hosts, up, strict=True) if not u) + ": plug the cable and run init again")
            port = "auto"
        elif len(ports) == 1:
            port = next(iter(ports))
        else:
            port = "auto"
            assumptions.append("the nodes use different Up ports: fabric.port is auto and each node uses its own "
                               "interface names")
    used: set[str] = set()
    names = [_node_name(f.hostname or h, used, i) for i, (h, f) in enumerate(zip(hosts, facts, strict=True))]
    nodes: list[dict[str, str | bool]] = [{"name": name, "host": h} for name, h in zip(names, hosts, strict=True)]
    if topology == "ring" and wire.order:
        seen.append(f"a ring, cabled in the order {' -> '.join(names)} -> {names[0]} (port 0 to the next node's "
                    "port 1); the nodes are listed in that order")
    for node in nodes:
        if node["host"] in controller_addrs:
            node["local"] = True  # sparkctl runs on this node: commands run there without ssh
            assumptions.append(f"{node['host']} is this machine: marked local (commands run without ssh)")
    not_spark = [h for h, f in zip(hosts, facts, strict=True) if not f.is_dgx_spark]
    if not_spark:
        assumptions.append(f"not recognised as DGX Spark: {', '.join(not_spark)} (kept; check /etc/dgx-release)")
    doc = {
        "cluster": {"name": cluster},
        "user": next(iter(users)) if users else "nvidia",
        **({"ssh": dict(ssh)} if ssh else {}),
        "nodes": nodes,
        "fabric": {"topology": topology, "port": port, "mtu": 9000},
    }
    header = ["# Written by `sparkctl inventory init` from what the nodes reported.",
              f"# The first node ({names[0]}) is the head: MPI rank 0, serves HTTP.",
              "# Subnets default to one /24 per twin (192.168.100.0/24 + 192.168.101.0/24 for a pair or switch).",
              "# serve: defaults to the preset for this node count; set serve.preset or serve.model to change it."]
    header += [f"# seen with LLDP: {a}" for a in seen]
    header += [f"# assumed: {a}" for a in assumptions]
    text = "\n".join(header) + "\n" + yaml.safe_dump(doc, sort_keys=False, default_flow_style=False)
    return InitResult(text=text, assumptions=assumptions, problems=problems, seen=seen)


def _one_port(up: list[dict[int, list[str]]]) -> int | str:
    ports = {p for u in up for p in u}
    return next(iter(ports)) if len(ports) == 1 else "auto"


def ssh_section(identity_file: str | None, known_hosts: str) -> dict[str, str]:
    """What bootstrap needs to log in the way init did: the key and the known_hosts file it was given, absolute
    (a relative path would be read from wherever bootstrap runs); `~/...` stays as given."""
    section = {}
    if identity_file:
        section["identity_file"] = _absolute(identity_file)
    if os.path.expanduser(known_hosts) != os.path.expanduser(DEFAULT_KNOWN_HOSTS):
        section["known_hosts"] = _absolute(known_hosts)
    return section


def _absolute(path: str) -> str:
    return path if path.startswith("~") else os.path.abspath(path)


def login_failures(hosts: list[str], unreachable: dict[str, Unreachable],
                   known_hosts: str = DEFAULT_KNOWN_HOSTS) -> Unreachable:
    """Every host that could not be logged in to, one line each, with the hint of the commonest cause. No inventory
    is written; the hosts that did log in had their host keys recorded (or found) in known_hosts, and it says so."""
    kinds = [unreachable[h].kind for h in hosts if h in unreachable]
    logged_in = [h for h in hosts if h not in unreachable]
    if logged_in:
        keys = "its host key is" if len(logged_in) == 1 else "their host keys are"
        written = f"no inventory was written ({', '.join(logged_in)} logged in: {keys} in {known_hosts})"
    else:
        written = "nothing was written"
    hint = next((unreachable[h].hint for h in hosts if h in unreachable and unreachable[h].hint), None)
    if "auth" in kinds:
        hint = ("pass the key the nodes accept with --identity-file (it is written to the inventory's ssh: "
                "section), or load it into ssh-agent; --user if the login name differs")
    elif "host_key" in kinds:
        hint = next(unreachable[h].hint for h in hosts if h in unreachable and unreachable[h].kind == "host_key")
    return Unreachable(f"{len(kinds)} of {len(hosts)} host(s) could not be logged in to; {written}",
                       hint=hint, kind=kinds[0], details=[unreachable[h].message for h in hosts if h in unreachable])


def draft_inventory(hosts: list[str], *, user: str | None, identity_file: str | None, known_hosts: str,
                    cluster: str) -> InitResult:
    """The inventory text for `hosts` (head first), with what had to be assumed; raises naming every host that
    cannot be logged in to. A host key is recorded in known_hosts only after its login worked."""
    specs = [NodeAddress(node=h, host=h, user=user, identity_file=identity_file) for h in hosts]
    transports, unreachable = connect_all(specs, known_hosts_path=known_hosts)
    try:
        if unreachable:
            raise login_failures(hosts, unreachable, known_hosts)
        facts = [gather_facts(transports[h], h) for h in hosts]
    finally:
        for t in transports.values():
            t.close()
    result = describe_cluster(list(hosts), facts, cluster=cluster,
                              controller_addrs=frozenset(gather_local_controller_addrs(include_loopback=False)),
                              ssh=ssh_section(identity_file, known_hosts))
    if result.problems:
        raise SparkctlError("; ".join(result.problems))
    return result
