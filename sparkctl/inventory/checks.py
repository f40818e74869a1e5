"""Inventory checks that span fields: duplicates, topology against node count, subnets, tp_size, secrets.

Each check reads an InventoryParts, in which a section that failed its own validation is None, so one pass
over a broken file still reports what is wrong elsewhere. A problem is (location, message); the location is a
pydantic-style tuple such as ("nodes", 1, "host"), turned into file:line by the loader.
"""

from __future__ import annotations

import ipaddress
import json
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from typing import Any

from sparkctl.engines import ENGINES, EngineName
from sparkctl.inventory.models_check import entry_loc, models_problems
from sparkctl.inventory.placement import model_sources
from sparkctl.inventory.presets import PRESETS, Preset, default_preset_name, get_preset
from sparkctl.inventory.release_check import release_problems
from sparkctl.inventory.sections import (
    ENV_NAME_RE,
    FIRST_HOST_NUMBER,
    ContainerSettings,
    FabricSettings,
    FirewallSettings,
    Node,
    ServeSettings,
    SshSettings,
    default_subnets,
    resolve_topology,
    subnet_count,
)
from sparkctl.inventory.serve import (
    SPECULATIVE_FLAGS,
    collector_port,
    engine_of,
    engine_port,
    flag_key,
    resolve_serve,
    serve_port,
)
from sparkctl.inventory.sglang_check import sglang_release_problems
from sparkctl.inventory.vllm_check import vllm_release_problems
from sparkctl.knowledge.vllm_releases import json_flags
from sparkctl.secrets import credential_service, is_secret_name, looks_like_credential

Loc = tuple
Problem = tuple[Loc, str]
_PLAIN_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]{0,63}\Z")
# The validation context key that makes the model skip cross-field checks (the loader runs them itself,
# with locations, on whatever parts did validate).
SKIP_CROSS_CHECKS = "sparkctl_skip_cross_checks"
#: The largest ring sparkctl builds (plan/ring.py RING_SIZES).
MAX_RING = 8
# What each topology needs: (fits(node_count), in words, what to use instead)
TOPOLOGY_FIT = {
    "single": (lambda n: n == 1, "exactly 1 node", "pair for 2 nodes, ring or switch for more"),
    "pair": (lambda n: n == 2, "exactly 2 nodes", "single for 1 node, ring or switch for more"),
    "ring": (lambda n: 3 <= n <= MAX_RING, f"3 to {MAX_RING} nodes", "single for 1 node, pair for 2"),
    "switch": (lambda n: n >= 2, "2 or more nodes", "single for 1 node"),
}
#: serve.config sections that are mappings in every TensorRT-LLM release (llm_args.py): never a plain value.
MAPPING_SECTIONS = frozenset({"speculative_config", "kv_cache_config", "cuda_graph_config", "scheduler_config",
                              "moe_config", "attention_dp_config"})
#: The prefix of the container variables sparkctl sets itself (plan/container.py SSHD_LISTEN_ENV).
OWN_ENV_PREFIX = "SPARKCTL_"
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
    ssh: SshSettings | None = None
    #: the inventory has a serve: section (serving is set up, so the server's port is taken on the head)
    serving: bool = False
    firewall: FirewallSettings | str | None = None
    #: where the model checked is written when it is one of several in serve.models (its world need not hold the
    #: head: the gateway reaches it)
    entry: tuple[str | int, ...] | None = None


def field_path(loc: Loc) -> str:
    """("nodes", 1, "host") -> "nodes[1].host"; a key that is not a plain word is shown quoted and escaped, so a
    message stays one line whatever the file's keys hold."""
    text = ""
    for part in loc:
        if isinstance(part, int):
            text += f"[{part}]"
        elif _PLAIN_KEY.match(str(part)):
            text += f".{part}" if text else str(part)
        else:
            text += f"[{json.dumps(str(part)[:40])}]"
    return text or "top level"


def cross_check_problems(parts: InventoryParts) -> list[Problem]:
    problems = [*_node_problems(parts), *_fabric_problems(parts), *_per_model(parts, _serve_problems),
                *_container_problems(parts), *_per_model(parts, _port_problems)]
    names = [n.name for n in parts.nodes if n is not None]
    if parts.serve is not None and parts.serve.models and names and len(names) == parts.node_count and not problems:
        problems += models_problems(parts.serve, names, parts.fabric.topology if parts.fabric else None,
                                    parts.container.image if parts.container else "")
    return list(dict.fromkeys(problems))  # a shared setting's problem is met once per model


def _per_model(parts: InventoryParts, check: Callable[[InventoryParts], Iterator[Problem]]) -> Iterator[Problem]:
    """A check of serve: run on each model with serve:'s shared settings around it; an entry's problems are
    placed at its own fields."""
    if parts.serve is None or not parts.serve.models:
        yield from check(parts)
        return
    several = len(parts.serve.models) > 1
    for source in model_sources(parts.serve):
        for loc, message in check(replace(parts, serve=source.settings, entry=source.loc if several else None)):
            yield entry_loc(loc, source.loc), message


def cross_check_warnings(parts: InventoryParts) -> list[Problem]:
    """What is allowed but most likely a mistake."""
    out: list[Problem] = []
    firewall = parts.firewall
    if isinstance(firewall, FirewallSettings) and firewall.ssh_from and parts.ssh is not None:
        ssh_ports = {parts.ssh.port} | {n.port for n in parts.nodes if n and n.port}
        for i, span in enumerate(firewall.spans()):
            opened = sorted(p for p in ssh_ports if span.holds(p))
            if opened:
                out.append((("firewall", "allow", i), f"lets sshd's port {opened[0]} in from anywhere, so "
                                                      "firewall.ssh_from narrows nothing (remove it from allow)"))
    if parts.firewall == "off":
        out.append((("firewall",), "off: the nodes' own rules are left alone, and what the engines, Open MPI and "
                                   "Ray listen on answers on the management network too (remove `firewall: off` to "
                                   "let sparkctl close it: docs/firewall.md)"))
    if parts.serve is not None:
        service = credential_service(parts.serve.hf_token_env)
        if service:
            out.append((("serve", "hf_token_env"),
                        f"{parts.serve.hf_token_env} names a credential of {service}, not a Hugging Face token: "
                        "sparkctl writes the token to every node's HF cache (name the variable that holds your HF "
                        "token, e.g. HF_TOKEN)"))
        if parts.serve.auth == "none":
            out.append((("serve", "auth"), "the endpoint is open: anyone who reaches it can use the cluster "
                                           "(remove `auth: none` to want a key on every path but /health)"))
        if parts.serve.listen == "all":
            out.append((("serve", "listen"), "the endpoint answers on every address of the head, the fabric and "
                                             "Wi-Fi included (name the addresses instead, e.g. [10.0.0.11])"))
    return out


#: Fields whose own validator says better what a pasted token there means.
OWN_TOKEN_CHECK = {("serve", "hf_token_env")}


def credential_problems(data: Any, loc: Loc = ()) -> list[Problem]:
    """Every key or value, anywhere in the file, shaped like a credential (never repeated)."""
    out: list[Problem] = []
    stack: list[tuple[Loc, Any]] = [(loc, data)]
    while stack:
        where, value = stack.pop()
        if where in OWN_TOKEN_CHECK:
            continue
        if isinstance(value, dict):
            for key, item in value.items():
                if isinstance(key, str) and looks_like_credential(key):
                    out.append((where, f"a key there is a secret: it is refused ({SECRET_HINT})"))
                stack.append(((*where, key), item))
        elif isinstance(value, list):
            stack.extend(((*where, index), item) for index, item in enumerate(value))
        elif isinstance(value, str) and looks_like_credential(value):
            out.append((where, f"a secret in the inventory is refused ({SECRET_HINT})"))
    return out


def _node_problems(parts: InventoryParts) -> Iterator[Problem]:
    names: dict[str, int] = {}
    hosts: dict[tuple[str, int | None], tuple[int, str]] = {}
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
            first, first_name = hosts[key]
            yield (("nodes", index, "host"),
                   f"duplicate host {node.host}, also nodes[{first}] ({first_name}) "
                   "(each node needs its own management address)")
        hosts.setdefault(key, (index, node.name))
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
    if topology == "ring" and count > MAX_RING:
        yield (("fabric", "topology"), f"a ring of {count} nodes cannot work well: its farthest nodes would be "
                                       f"{count // 2} hops apart, relayed by the nodes in between; sparkctl builds "
                                       f"rings of 3 to {MAX_RING} (use a switch)")
        return
    if not fits(count):
        yield (("fabric", "topology"), f"{topology} needs {needs}, the inventory has {count} (use {instead})")
        return
    if topology == "ring":
        yield from _ring_problems(parts)

    if fabric.subnets is None:
        subnets = default_subnets(topology, count)
        explicit = False
    else:
        subnets = [ipaddress.IPv4Network(s) for s in fabric.subnets]
        explicit = True
        yield from _explicit_subnet_problems(subnets, topology, count)

    for index, node in enumerate(parts.nodes):
        address = _ip_literal(node.host) if node else None
        if node is None or address is None:
            continue
        for position, subnet in enumerate(subnets):
            if address in subnet:
                loc = ("fabric", "subnets", position) if explicit else ("nodes", index, "host")
                yield (loc, f"{subnet} overlaps the management network: node {node.name} is reached at "
                            f"{address} (choose fabric.subnets apart from the management addresses)")


def _ring_problems(parts: InventoryParts) -> Iterator[Problem]:
    """What a ring cannot be: a ring cables BOTH ports of every node (port 0 to the next node, port 1 to the
    previous), so one port, or two pinned twin names, cannot describe it."""
    fabric = parts.fabric
    if fabric is not None and fabric.port != "auto":
        yield (("fabric", "port"), f"a ring uses both ports of every node (port 0 to the next node, port 1 to the "
                                   f"previous), not port {fabric.port} alone (remove fabric.port)")
    for index, node in enumerate(parts.nodes):
        if node is not None and node.fabric.interfaces:
            yield (("nodes", index, "fabric", "interfaces"),
                   f"{node.name}: a ring uses the four twins of both ports; two pinned names cannot describe it "
                   "(remove nodes[].fabric.interfaces)")


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


def _serving_nodes_problems(parts: InventoryParts, names: list[str], world: int) -> Iterator[Problem]:
    """serve.nodes against the inventory; a plain serve:'s world starts on the head (the gateway's node), an entry
    of serve.models may run anywhere."""
    known = [n.name for n in parts.nodes if n is not None]
    for i, name in enumerate(names):
        if name not in known:
            yield (("serve", "nodes", i), f"no node named {name!r} (nodes: {', '.join(known)})")
        elif name in names[:i]:
            yield (("serve", "nodes", i), f"{name} is listed twice")
    if len(names) != world:
        yield (("serve", "nodes"), f"lists {len(names)} node(s), the launch has {world} rank(s) (tp_size x "
                                   "pp_size): name exactly that many")
    elif names and known and names[0] != known[0] and parts.entry is None:
        yield (("serve", "nodes", 0), f"must start with the head {known[0]} (MPI rank 0 serves HTTP): put it first, "
                                      f"or make {names[0]} the first node of the inventory")


def _serve_problems(parts: InventoryParts) -> Iterator[Problem]:
    serve, count = parts.serve, parts.node_count
    if serve is None or not count:
        return
    preset = get_preset(serve.preset) if serve.preset else None
    engine = engine_of(serve, count)
    if serve.engine and preset and preset.engine != serve.engine:
        others = ", ".join(p.name for p in PRESETS.values() if p.engine == serve.engine)
        yield (("serve", "engine"), f"{serve.engine}, but preset {preset.name} runs on {preset.engine} (remove "
                                    f"serve.engine, or choose a {serve.engine} preset: {others})")
        return
    if serve.model is None and preset is None and default_preset_name(count, engine) is None:
        yield (("serve",), f"no {engine} preset fits {count} node(s): name the model (serve.model)")
        return
    if serve.args and not ENGINES[engine].takes_args:
        taking = [e for e in ENGINES.values() if e.takes_args]
        yield (("serve", "args"), f"are {' or '.join(e.server for e in taking)} flags: {ENGINES[engine].label}'s "
                                  f"settings go in serve.config ({ENGINES[engine].config_is}), or set serve.engine: "
                                  f"{' or '.join(e.name for e in taking)}")
    wrong = list(_config_shape_problems(serve, preset, engine))
    yield from wrong
    if wrong:
        return
    spec = resolve_serve(serve, count)
    if spec.world_size > count:
        loc: tuple[str, ...]
        if serve.tp_size:
            loc, origin = ("serve", "tp_size"), ""
        elif serve.preset:
            loc, origin = ("serve", "preset"), f" (from preset {spec.preset})"
        else:
            loc, origin = ("serve",), f" (from the default preset {spec.preset})"
        ranks = f"tp_size {spec.tp_size}" + (f" x pp_size {spec.pp_size}" if spec.pp_size > 1 else "")
        fix = (f"set serve.tp_size to {count} or less" if spec.pp_size == 1 else
               f"make serve.tp_size x serve.pp_size {count} or less")
        yield (loc, f"{ranks}{origin} needs {spec.world_size} nodes, the inventory has {count} (add nodes, or {fix})")
    elif serve.nodes is not None:
        yield from _serving_nodes_problems(parts, serve.nodes, spec.world_size)
    if serve.draft and serve.decoding is None and spec.preset is None:
        yield (("serve", "draft"), "a draft without serve.decoding (set decoding: eagle3 or draft-target)")
    if spec.decoding != "none" and spec.draft is None:
        yield (("serve", "decoding"),
               f"{spec.decoding} needs a draft model (set serve.draft, or decoding: none)")
    spoken = [k for k in serve.config if ENGINES[engine].config_flags and flag_key(k) in SPECULATIVE_FLAGS]
    if spoken and spec.decoding == "none":
        yield (("serve", "config", spoken[0]), "set while decoding is none (set serve.decoding: eagle3 and "
                                               "serve.draft, or remove it)")
    if serve.draft and spec.decoding == "none":
        yield (("serve", "draft"), "set while decoding is none (remove it, or set decoding: eagle3 or "
                                   "draft-target)")
    image = parts.container.image if parts.container is not None else None
    if image is not None:
        env = dict(parts.container.env if parts.container else {})
        yield from RELEASE_CHECKS[engine](serve, image, count, env)


def _config_shape_problems(serve: ServeSettings, preset: Preset | None, engine: EngineName) -> Iterator[Problem]:
    """serve.config's sections that must be mappings (what resolving the preset's config merges into)."""
    yield from CONFIG_SHAPES[engine](serve, preset)


def _vllm_config_shapes(serve: ServeSettings, preset: Preset | None) -> Iterator[Problem]:
    for key, value in serve.config.items():
        if flag_key(key) in json_flags() and not isinstance(value, dict):
            yield (("serve", "config", key), f"must be a mapping of {key}'s own keys (e.g. speculative-config: "
                                             "{num_speculative_tokens: 3})")


def _flag_values(serve: ServeSettings, preset: Preset | None) -> Iterator[Problem]:
    """A flag's value on a command line: a number, a string, true/false (an on/off flag) or a list."""
    for key, value in serve.config.items():
        if isinstance(value, dict):
            yield (("serve", "config", key), "must be a flag's value (a number, a string, true/false or a list), "
                                             "not a mapping")


def _trtllm_config_shapes(serve: ServeSettings, preset: Preset | None) -> Iterator[Problem]:
    shapes = {key for key, value in (preset.config_dict() if preset else {}).items() if isinstance(value, dict)}
    for key, value in serve.config.items():
        if (key in shapes or key in MAPPING_SECTIONS) and not isinstance(value, dict):
            example = {"speculative_config": "{max_draft_len: 3}", "cuda_graph_config": "{max_batch_size: 1}",
                       "kv_cache_config": "{free_gpu_memory_fraction: 0.9}"}.get(key, "{...}")
            yield (("serve", "config", key), f"must be a mapping of {key}'s own keys (e.g. {key}: {example})")


def _container_problems(parts: InventoryParts) -> Iterator[Problem]:
    container = parts.container
    if container is None:
        return
    # Values are never repeated here: they may be secrets. Credential-shaped values anywhere in the file are
    # credential_problems'; this is about what a name says.
    for key, value in container.env.items():
        loc = ("container", "env", key)
        if not ENV_NAME_RE.match(key):
            yield (loc, "not an environment variable name (letters, digits and '_', "
                        "not starting with a digit)")
        elif key.upper().startswith(OWN_ENV_PREFIX):
            yield (loc, f"{OWN_ENV_PREFIX}* variables are sparkctl's own: it sets them itself, e.g. where the "
                        "container's sshd listens (remove the key)")
        elif is_secret_name(key) and value and not looks_like_credential(value):
            yield (loc, f"a secret in the inventory is refused ({SECRET_HINT})")


def _port_problems(parts: InventoryParts) -> Iterator[Problem]:
    """Every container and the server run on the nodes' host network: their ports are the nodes' ports."""
    container, serve = parts.container, parts.serve
    ssh_ports = {parts.ssh.port if parts.ssh else 22} | {n.port for n in parts.nodes if n and n.port}
    if container is not None and container.ssh_port in ssh_ports:
        yield (("container", "ssh_port"), f"{container.ssh_port} is the nodes' own sshd port (the container runs "
                                          "on the host network: choose another, e.g. 2233)")
    if serve is None or not (parts.serving or "port" in serve.model_fields_set):
        return
    written = "port" in serve.model_fields_set
    try:
        port = serve_port(serve, parts.node_count or 1)
    except KeyError:  # an unknown preset: its own problem
        return
    taken = ssh_ports | ({container.ssh_port} if container is not None else set())
    free = next(p for p in range(8355, 8500) if p not in taken)
    if container is not None and port == container.ssh_port:
        if written:
            yield (("serve", "port"), f"{port} is container.ssh_port too (choose another, e.g. {free})")
        else:
            free_ssh = next(p for p in range(2233, 2400) if p not in ssh_ports | {port})
            yield (("container", "ssh_port"), f"{port} is the port the server listens on (serve.port, the "
                                              f"preset's when not written): choose another, e.g. {free_ssh} "
                                              "(or set serve.port)")
    elif port in ssh_ports:
        loc = ("serve", "port") if written else ("serve",)
        yield (loc, f"{port} is the nodes' sshd port (choose another serve.port, e.g. {free})")
    engine = engine_port(serve, parts.node_count or 1)
    if engine in taken | {port}:
        loc = ("serve", "engine_port") if serve.engine_port is not None else ("serve",)
        what = "the serve port" if engine == port else "an ssh port"
        yield (loc, f"the engine's port {engine} is {what} too: the gateway and the engine each need their own "
                    "(set serve.engine_port to a free one)")
        return
    collector = collector_port(serve, parts.node_count or 1)
    if collector in taken | {port} and ENGINES[engine_of(serve, parts.node_count or 1)].metrics_drained:
        loc = ("serve", "engine_port") if serve.engine_port is not None else ("serve",)
        what = "the serve port" if collector == port else "an ssh port"
        yield (loc, f"the figures collector answers on the port after the engine's, {collector}, which is {what}: "
                    "set serve.engine_port so that neither it nor the next port is taken")


CONFIG_SHAPES: dict[EngineName, Callable[[ServeSettings, Preset | None], Iterator[Problem]]] = {
    "trtllm": _trtllm_config_shapes, "vllm": _vllm_config_shapes, "sglang": _flag_values}
RELEASE_CHECKS: dict[EngineName, Callable[[ServeSettings, str, int, dict[str, str]], list[Problem]]] = {
    "trtllm": release_problems, "vllm": vllm_release_problems, "sglang": sglang_release_problems}
