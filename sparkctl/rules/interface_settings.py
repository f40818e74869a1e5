"""PURE: a container's ACTUAL NCCL/UCX/Open MPI settings against its node's real interfaces (verify.fabric and
doctor).

Every mismatch names the node, the setting, what it names, what the node really has, and the fix.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from typing import Literal

from sparkctl.engines import DEFAULT_ENGINE, ENGINES, Engine
from sparkctl.facts import Facts
from sparkctl.knowledge.nccl import match_ifname, parse_nccl_list
from sparkctl.rules.fabric import management_names

INTERFACE_SETTINGS = ("NCCL_SOCKET_IFNAME", "UCX_NET_DEVICES", "OMPI_MCA_btl_tcp_if_include",
                      "OMPI_MCA_oob_tcp_if_include")


@dataclass(frozen=True)
class Mismatch:
    node: str
    setting: str
    names: str
    has: str
    fix: str
    severity: Literal["error", "warning"] = "error"

    def line(self) -> str:
        return f"{self.node}: {self.setting}={self.names}: {self.has} (fix: {self.fix})"


def fabric_up(facts: Facts) -> list[str]:
    """The node's Up interfaces that have a RoCE device: what the settings should name."""
    return [n for n in facts.fabric_interfaces() if facts.interface_up(n)] or \
        [n for twins in facts.up_ports().values() for n in twins]


def _has(facts: Facts) -> str:
    return f"the node's Up fabric interfaces are {', '.join(fabric_up(facts)) or 'none'}"


def _fix(facts: Facts, setting: str) -> str:
    return f"set {setting}={','.join(fabric_up(facts)) or '<the Up twins>'} (rerun bootstrap)"


def _interface_problems(node: str, setting: str, value: str, names: list[str], facts: Facts) -> list[Mismatch]:
    out = []
    mgmt = management_names(facts)
    for name in names:
        if name in mgmt:
            out.append(Mismatch(node, setting, value, f"{name} is the management/Wi-Fi interface",
                                _fix(facts, setting)))
        elif name not in facts.interfaces:
            out.append(Mismatch(node, setting, value, f"{name} does not exist; {_has(facts)}", _fix(facts, setting)))
        elif not facts.interface_up(name):
            out.append(Mismatch(node, setting, value, f"{name} is Down; {_has(facts)}", _fix(facts, setting)))
    return out


def check_socket_ifname(node: str, env: dict[str, str], facts: Facts) -> list[Mismatch]:
    setting = "NCCL_SOCKET_IFNAME"
    value = env.get(setting)
    if not value:
        return [Mismatch(node, setting, "(unset)", "NCCL picks any interface, the management one included",
                         _fix(facts, setting), "warning")]
    selector = parse_nccl_list(value)
    selected = match_ifname(value, list(facts.interfaces))
    out = []
    if not selector.exclude:
        for prefix, _ in selector.entries:
            if not match_ifname(("=" if selector.exact else "") + prefix, list(facts.interfaces)):
                out.append(Mismatch(node, setting, value, f"no interface matches {prefix!r} (NCCL: `Bootstrap : no "
                                    f"socket interface found`); {_has(facts)}", _fix(facts, setting)))
    if not selected and not out:
        out.append(Mismatch(node, setting, value, f"selects no interface; {_has(facts)}", _fix(facts, setting)))
    return out + _interface_problems(node, setting, value, [n for n in selected if n != "lo"], facts)


def _entries(value: str) -> list[str]:
    return [e.strip() for e in value.split(",") if e.strip()]


def check_ucx(node: str, env: dict[str, str], facts: Facts) -> list[Mismatch]:
    setting = "UCX_NET_DEVICES"
    value = env.get(setting)
    if not value or value == "all":
        return [Mismatch(node, setting, value or "(unset)", "UCX may use any device, the management one included",
                         _fix(facts, setting), "warning")]
    out, netdevs = [], []
    roce = {d.device: d for d in facts.roce}
    for entry in _entries(value):
        device, sep, _port = entry.partition(":")
        if sep and not device.startswith("en"):
            if device not in roce:
                out.append(Mismatch(node, setting, value, f"RDMA device {device} does not exist "
                                    f"(UCX WARN: network device is not available); the node has "
                                    f"{', '.join(roce) or 'none'}", _fix(facts, setting)))
            elif not facts.interface_up(roce[device].netdev):
                out.append(Mismatch(node, setting, value, f"{device} maps to {roce[device].netdev}, which is Down",
                                    _fix(facts, setting)))
        else:
            netdevs.append(device)
    return out + _interface_problems(node, setting, value, netdevs, facts)


def check_ompi(node: str, env: dict[str, str], facts: Facts, setting: str) -> list[Mismatch]:
    value = env.get(setting)
    if not value:
        why = ("ORTE may run its out-of-band traffic over the management network" if "oob" in setting
               else "the TCP BTL may use any interface, the management one included")
        return [Mismatch(node, setting, "(unset)", why, _fix(facts, setting))]
    out, names = [], []
    for entry in _entries(value):
        if "/" in entry:
            net = ipaddress.ip_network(entry, strict=False)
            holders = [n for n, i in facts.interfaces.items() if i.up and any(
                a.family == "inet" and ipaddress.ip_address(a.ip) in net for a in i.addresses)]
            if not holders:
                out.append(Mismatch(node, setting, value, f"no Up interface has an address in {entry}",
                                    _fix(facts, setting)))
            names += holders
        else:
            names.append(entry)
    return out + _interface_problems(node, setting, value, names, facts)


def check_ib_hca(node: str, env: dict[str, str], facts: Facts) -> list[Mismatch]:
    setting = "NCCL_IB_HCA"
    value = env.get(setting)
    up_devices = [d.device for d in facts.roce if facts.interface_up(d.netdev)]
    if not value:
        if up_devices:
            return [Mismatch(node, setting, "(unset)", f"NCCL chooses among {', '.join(up_devices)} by itself",
                             f"set {setting}={','.join(up_devices)}", "warning")]
        return []
    selector = parse_nccl_list(value)
    out = []
    if not selector.exclude:
        for name, port in selector.entries:
            hits = [d for d in facts.roce if (d.device == name if selector.exact else d.device.startswith(name))
                    and (port is None or d.port == port)]
            if not hits:
                out.append(Mismatch(node, setting, value, f"device {name}{f':{port}' if port else ''} does not "
                                    f"exist: NCCL silently falls back to TCP (`NET/IB : No device found`); the "
                                    f"node's RoCE devices: {', '.join(d.device for d in facts.roce) or 'none'}",
                                    f"set {setting}={','.join(up_devices) or '<the Up twins devices>'}"))
            for dev in hits:
                if not facts.interface_up(dev.netdev):
                    out.append(Mismatch(node, setting, value, f"{dev.device} maps to {dev.netdev}, which is Down",
                                        f"set {setting}={','.join(up_devices)}"))
    chosen = {d.device for d in facts.roce if selector.matches(d.device, d.port)}
    missing = [d for d in up_devices if d not in chosen]
    if not out and missing and chosen:
        out.append(Mismatch(node, setting, value, f"leaves out {', '.join(missing)} (Up): NCCL uses only part of "
                            "the link", f"set {setting}={','.join(up_devices)}", "warning"))
    return out


def _first_fabric_address(facts: Facts) -> str | None:
    for name in fabric_up(facts):
        for a in facts.addresses_of(name):
            if a.family == "inet" and not a.is_link_local:
                return a.ip
    return None


def check_host_ip(node: str, env: dict[str, str], facts: Facts, engine: Engine) -> list[Mismatch]:
    """The engine's host-IP variable (VLLM_HOST_IP): the address this rank tells the others (unset, the engine
    takes the address of the default route's interface: the management network)."""
    assert engine.host_ip_env is not None
    setting = engine.host_ip_env
    value = env.get(setting, "")
    want = _first_fabric_address(facts)
    fix = f"set {setting}={want or '<an address on an Up twin>'} (rerun bootstrap)"
    if not value:
        return [Mismatch(node, setting, "(unset)", f"{engine.label} takes the address of the default route's "
                         "interface (the management network)", fix)]
    held = facts.interfaces_holding(value)
    if not held:
        return [Mismatch(node, setting, value, f"the node does not own {value}: the other ranks cannot reach this "
                         f"one; {_has(facts)}", fix)]
    up = fabric_up(facts)
    if not any(name in up for name in held):
        return [Mismatch(node, setting, value, f"{value} is on {', '.join(held)}, not an Up fabric twin; "
                         f"{_has(facts)}", fix)]
    return []


def check_one_interface(node: str, env: dict[str, str], facts: Facts, setting: str) -> list[Mismatch]:
    """GLOO_SOCKET_IFNAME / TP_SOCKET_IFNAME: the interface vLLM's control traffic (Gloo, TensorPipe) uses."""
    value = env.get(setting, "")
    if not value:
        return [Mismatch(node, setting, "(unset)", "Gloo/TensorPipe pick an interface by themselves, the "
                         "management one included", f"set {setting}={(fabric_up(facts) or ['<an Up twin>'])[0]} "
                         "(rerun bootstrap)")]
    return _interface_problems(node, setting, value, _entries(value), facts)


def node_mismatches(node: str, env: dict[str, str], facts: Facts,
                    engine: Engine = ENGINES[DEFAULT_ENGINE]) -> list[Mismatch]:
    """The container's settings against its node: the engine's own (its host IP, its control interfaces), and Open
    MPI's out-of-band channel only where mpirun starts the ranks."""
    out = check_socket_ifname(node, env, facts) + check_ucx(node, env, facts) + check_ib_hca(node, env, facts)
    out += check_ompi(node, env, facts, "OMPI_MCA_btl_tcp_if_include")
    if engine.host_ip_env:
        out += check_host_ip(node, env, facts, engine)
    for setting in engine.control_ifname_envs:
        out += check_one_interface(node, env, facts, setting)
    if engine.needs_mpi:
        out += check_ompi(node, env, facts, "OMPI_MCA_oob_tcp_if_include")
    return out


def included_interfaces(env: dict[str, str], facts: Facts) -> list[str]:
    names = []
    for entry in _entries(env.get("OMPI_MCA_btl_tcp_if_include", "")):
        if "/" in entry:
            net = ipaddress.ip_network(entry, strict=False)
            names += [n for n, i in facts.interfaces.items()
                      if any(a.family == "inet" and ipaddress.ip_address(a.ip) in net for a in i.addresses)]
        else:
            names.append(entry)
    return names


def _networks(env: dict[str, str], facts: Facts) -> set:
    return {a.network for n in included_interfaces(env, facts) for a in facts.addresses_of(n)
            if a.family == "inet" and not a.is_link_local}


def hostfile_mismatches(order: list[str], hostfile: str, envs: dict[str, dict[str, str]],
                        facts_by_node: dict[str, Facts]) -> list[Mismatch]:
    """Line i of the hostfile must be an address node i owns on an interface in its btl_tcp_if_include."""
    lines = [ln.split()[0] for ln in hostfile.splitlines() if ln.strip() and not ln.startswith("#")]
    out = []
    for i, node in enumerate(order):
        facts, env = facts_by_node.get(node), envs.get(node)
        if facts is None or env is None:
            continue
        line = lines[i] if i < len(lines) else None
        owned = {a.ip: n for n in included_interfaces(env, facts) for a in facts.addresses_of(n)}
        if line is None:
            out.append(Mismatch(node, "hostfile", f"line {i + 1}", "missing (the hostfile has fewer lines than "
                                "nodes)", "rerun bootstrap (mpi.hostfile)"))
        elif line not in owned:
            held = facts.interfaces_holding(line)
            where = f"it is on {', '.join(held)}, not in btl_tcp_if_include" if held else "the node does not own it"
            out.append(Mismatch(node, "hostfile", f"line {i + 1} {line}", where + f"; addresses on the included "
                                f"interfaces: {', '.join(sorted(owned)) or 'none'}", "rerun bootstrap (mpi.hostfile)"))
    return out


def _fabric_networks(facts: Facts) -> set:
    return {a.network for n in fabric_up(facts) for a in facts.addresses_of(n)
            if a.family == "inet" and not a.is_link_local}


def subnet_mismatches(pairs: list[tuple[str, str]], envs: dict[str, dict[str, str]],
                      facts_by_node: dict[str, Facts], routed: bool = False) -> list[Mismatch]:
    """Peers that must talk directly need a subnet in common on their included interfaces.

    routed (a ring): Open MPI uses one interface per node and the neighbour host routes carry it over the
    cable the two nodes share, so the subnet in common is looked for on all the Up fabric twins.
    """
    out = []
    networks = _fabric_networks if routed else None
    for a, b in pairs:
        if a not in envs or b not in envs:
            continue
        if networks is not None:
            mine, theirs = networks(facts_by_node[a]), networks(facts_by_node[b])
        else:
            mine, theirs = _networks(envs[a], facts_by_node[a]), _networks(envs[b], facts_by_node[b])
        if not mine & theirs:
            out.append(Mismatch(a, "OMPI_MCA_btl_tcp_if_include", envs[a].get("OMPI_MCA_btl_tcp_if_include", ""),
                                f"no subnet in common with {b} ({', '.join(map(str, sorted(mine, key=str))) or 'none'}"
                                f" vs {', '.join(map(str, sorted(theirs, key=str))) or 'none'})",
                                "check the cabling and rerun bootstrap (network.netplan)"))
    return out


def peer_pairs(order: list[str], topology: str) -> list[tuple[str, str]]:
    if topology == "ring" and len(order) > 3:
        return [(order[i], order[(i + 1) % len(order)]) for i in range(len(order))]
    return [(a, b) for i, a in enumerate(order) for b in order[i + 1:]]

