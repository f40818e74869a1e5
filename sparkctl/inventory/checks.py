"""Inventory checks that span fields: duplicates, topology against node count, subnets, tp_size, secrets.

Each check reads an InventoryParts, in which a section that failed its own validation is None, so one pass
over a broken file still reports what is wrong elsewhere. A problem is (location, message); the location is a
pydantic-style tuple such as ("nodes", 1, "host"), turned into file:line by the loader.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterator
from dataclasses import dataclass

from sparkctl.inventory.sections import (
    ENV_NAME_RE,
    FIRST_HOST_NUMBER,
    ContainerSettings,
    FabricSettings,
    Node,
    ServeSettings,
    default_subnets,
    resolve_topology,
    subnet_count,
)
from sparkctl.inventory.serve import resolve_serve
from sparkctl.secrets import is_secret_name, looks_like_credential

Loc = tuple
Problem = tuple[Loc, str]
# The validation context key that makes the model skip cross-field checks (the loader runs them itself,
# with locations, on whatever parts did validate).
SKIP_CROSS_CHECKS = "sparkctl_skip_cross_checks"
# What each topology needs: (fits(node_count), in words, what to use instead)
TOPOLOGY_FIT = {
    "single": (lambda n: n == 1, "exactly 1 node", "pair for 2 nodes, ring or switch for more"),
    "pair": (lambda n: n == 2, "exactly 2 nodes", "single for 1 node, ring or switch for more"),
    "ring": (lambda n: n >= 3, "3 or more nodes", "single for 1 node, pair for 2"),
    "switch": (lambda n: n >= 2, "2 or more nodes", "single for 1 node"),
}
SECRET_HINT = ("secrets are never stored in the inventory: export it in your shell; for the Hugging Face "
               "token serve.hf_token_env names the variable")


@dataclass
class InventoryParts:
    """The sections of an inventory that validated; None where a section did not."""

    node_count: int | None  # None when `nodes` itself is unusable
    nodes: list[Node | None]
    fabric: FabricSettings | None
    serve: ServeSettings | None
    container: ContainerSettings | None


def field_path(loc: Loc) -> str:
    """("nodes", 1, "host") -> "nodes[1].host"."""
    text = ""
    for part in loc:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text or "top level"


def cross_check_problems(parts: InventoryParts) -> list[Problem]:
    return [*_node_problems(parts), *_fabric_problems(parts), *_serve_problems(parts),
            *_container_problems(parts)]


def _node_problems(parts: InventoryParts) -> Iterator[Problem]:
    names: dict[str, int] = {}
    hosts: dict[tuple[str, int | None], int] = {}
    local: int | None = None
    for index, node in enumerate(parts.nodes):
        if node is None:
            continue
        if node.name in names:
            yield (("nodes", index, "name"),
                   f"duplicate node name {node.name!r}, also nodes[{names[node.name]}] "
                   "(give each node its own name)")
        names.setdefault(node.name, index)
        # The same address on another port is a different machine (port-forwarded nodes).
        key = (node.host.lower(), node.port)
        if key in hosts:
            first = parts.nodes[hosts[key]]
            yield (("nodes", index, "host"),
                   f"duplicate host {node.host}, also nodes[{hosts[key]}] ({first.name}) "
                   "(each node needs its own management address)")
        hosts.setdefault(key, index)
        if node.local:
            if local is not None:
                yield (("nodes", index, "local"),
                       f"only one node can be local, nodes[{local}] already is "
                       "(sparkctl runs on one machine)")
            else:
                local = index


def _fabric_problems(parts: InventoryParts) -> Iterator[Problem]:
    fabric, count = parts.fabric, parts.node_count
    if fabric is None or not count:
        return
    topology = resolve_topology(fabric.topology, count)
    if topology is None:
        yield (("fabric", "topology"),
               f"required for {count} nodes (ring: port 0 of each node cabled to port 1 of the next; "
               "switch: every node cabled to a switch)")
        return
    fits, needs, instead = TOPOLOGY_FIT[topology]
    if not fits(count):
        yield (("fabric", "topology"), f"{topology} needs {needs}, the inventory has {count} (use {instead})")
        return

    if fabric.subnets is None:
        subnets = default_subnets(topology, count)
        explicit = False
    else:
        subnets = [ipaddress.IPv4Network(s) for s in fabric.subnets]
        explicit = True
        yield from _explicit_subnet_problems(subnets, topology, count)

    for index, node in enumerate(parts.nodes):
        address = _ip_literal(node.host) if node else None
        if address is None:
            continue
        for position, subnet in enumerate(subnets):
            if address in subnet:
                loc = ("fabric", "subnets", position) if explicit else ("nodes", index, "host")
                yield (loc, f"{subnet} overlaps the management network: node {node.name} is reached at "
                            f"{address} (choose fabric.subnets apart from the management addresses)")


def _explicit_subnet_problems(subnets: list[ipaddress.IPv4Network], topology: str,
                              count: int) -> Iterator[Problem]:
    expected = subnet_count(topology, count)
    if len(subnets) != expected:
        layout = {"single": "a single Spark has no fabric: remove the key",
                  "ring": "one per twin of each cable: cable i uses subnets[2i] and [2i+1]"}.get(
            topology, "one per twin of the cabled port")
        yield (("fabric", "subnets"),
               f"{topology} of {count} node(s) needs {expected} subnets, {len(subnets)} given ({layout}; "
               "or leave fabric.subnets out for the defaults)")
    for later, subnet in enumerate(subnets):
        for earlier in range(later):
            if subnet.overlaps(subnets[earlier]):
                yield (("fabric", "subnets", later),
                       f"{subnet} overlaps {subnets[earlier]} (subnets[{earlier}]) (each twin needs its own "
                       "subnet: two interfaces in one subnet confuse routing and NCCL)")
        # pair/switch number hosts .10 and up; a ring cable needs two hosts
        needed = FIRST_HOST_NUMBER + count if topology in ("pair", "switch") else 3
        if subnet.num_addresses - 1 < needed:
            yield (("fabric", "subnets", later),
                   f"{subnet} is too small for {count} nodes (use a /24)")


def _ip_literal(host: str) -> ipaddress.IPv4Address | None:
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return None
    return address if isinstance(address, ipaddress.IPv4Address) else None


def _serve_problems(parts: InventoryParts) -> Iterator[Problem]:
    serve, count = parts.serve, parts.node_count
    if serve is None or not count:
        return
    spec = resolve_serve(serve, count)
    if spec.tp_size > count:
        if serve.tp_size:
            loc, origin = ("serve", "tp_size"), ""
        elif serve.preset:
            loc, origin = ("serve", "preset"), f" (from preset {spec.preset})"
        else:
            loc, origin = ("serve",), f" (from the default preset {spec.preset})"
        yield (loc, f"tp_size {spec.tp_size}{origin} needs {spec.tp_size} nodes, the inventory has {count} "
                    f"(add nodes, or set serve.tp_size to {count} or less)")
    if serve.draft and serve.decoding is None and spec.preset is None:
        yield (("serve", "draft"), "a draft without serve.decoding (set decoding: eagle3 or draft-target)")
    if spec.decoding != "none" and spec.draft is None:
        yield (("serve", "decoding"),
               f"{spec.decoding} needs a draft model (set serve.draft, or decoding: none)")
    if serve.draft and spec.decoding == "none":
        yield (("serve", "draft"), "set while decoding is none (remove it, or set decoding: eagle3 or "
                                   "draft-target)")


def _container_problems(parts: InventoryParts) -> Iterator[Problem]:
    container = parts.container
    if container is None:
        return
    # Values are never repeated here: they may be secrets.
    for key, value in container.env.items():
        loc = ("container", "env", key)
        if not ENV_NAME_RE.match(key):
            yield (loc, "not an environment variable name (letters, digits and '_', "
                        "not starting with a digit)")
        elif (is_secret_name(key) and value) or looks_like_credential(value):
            yield (loc, f"a secret in the inventory is refused ({SECRET_HINT})")
    for index, arg in enumerate(container.docker_args):
        if looks_like_credential(arg):
            loc = ("container", "docker_args", index)
            yield (loc, f"a secret in the inventory is refused ({SECRET_HINT})")
