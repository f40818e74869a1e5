"""A run: connect to every node once, build the task contexts, walk the graph, report through events."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from sparkctl.engine import Event, Graph, Runner, RunResult
from sparkctl.errors import BadInput
from sparkctl.tasks.context import ClusterContext, NodeContext, RunOptions
from sparkctl.transport.connect import connect_all, open_transport


@dataclass
class RunRequest:
    options: RunOptions = field(default_factory=RunOptions)
    limit: set[str] | None = None
    only: set[str] | None = None
    skip: set[str] | None = None
    forks: int = 32


def transport_options(inventory: Any, options: RunOptions) -> dict:
    ssh = inventory.ssh
    return dict(known_hosts_path=ssh.known_hosts, use_ssh_config=ssh.use_ssh_config,
                connect_timeout=ssh.connect_timeout, become_password=options.become_password)


def node_specs(inventory: Any) -> list[Any]:
    """What the transport needs per node: per-node overrides, else the inventory's ssh defaults."""
    from sparkctl.transport.connect import NodeAddress

    ssh = inventory.ssh
    return [NodeAddress(node=n.name, host=str(n.host), user=n.user or inventory.user,
                        port=n.port or ssh.port, identity_file=n.identity_file or ssh.identity_file,
                        local=bool(n.local)) for n in inventory.nodes]


def run_playbook(inventory: Any, graph: Graph, request: RunRequest, emit: Callable[[Event], None]) -> RunResult:
    known = {n.name for n in inventory.nodes}
    if request.limit:
        unknown = sorted(request.limit - known)
        if unknown:
            raise BadInput(f"--limit: no node named {', '.join(unknown)} in the inventory",
                           hint=f"nodes: {', '.join(sorted(known))}")
    try:
        graph = graph.select(request.only, request.skip)
    except ValueError as exc:
        raise BadInput(str(exc)) from exc
    options = request.options
    wanted = [s for s in node_specs(inventory) if not request.limit or s.node in request.limit]
    topts = transport_options(inventory, options)
    transports, unreachable = connect_all(wanted, forks=request.forks, **topts)
    specs = {s.node: s for s in node_specs(inventory)}

    def fresh(node: str):
        return open_transport(specs[node], **topts)

    cluster = ClusterContext(inventory, options, emit, new_transport=fresh)
    for node in inventory.nodes:
        if node.name in transports:
            cluster.add(NodeContext(cluster, node, transports[node.name]))
    try:
        runner = Runner(graph, nodes=[s.node for s in wanted], node_contexts=cluster.nodes,
                        cluster_context=cluster, unreachable={n: str(e) for n, e in unreachable.items()},
                        forks=request.forks, check_mode=options.check, emit=emit)
        result = runner.run()
    finally:
        for t in transports.values():
            t.close()
    result.round_trips = {n: getattr(t, "round_trips", 0) for n, t in transports.items()}
    return result


def gather_cluster(inventory: Any, request: RunRequest,
                   also: Callable[[Any, Any], Any] | None = None) -> tuple[dict[str, Any], dict[str, str]]:
    """Connect to every node and read its facts once: (facts by node, unreachable reason by node).

    `also(transport, facts)` runs on the same connection right after, its result stored as facts.extra."""
    from concurrent.futures import ThreadPoolExecutor

    from sparkctl.facts import gather_facts

    specs = [s for s in node_specs(inventory) if not request.limit or s.node in request.limit]
    transports, unreachable = connect_all(specs, forks=request.forks, **transport_options(inventory, request.options))

    def one(name: str):
        facts = gather_facts(transports[name], name, container_names=(inventory.container.name,),
                             image_refs=(inventory.container.image,), hf_cache=inventory.container.hf_cache,
                             reach_addrs=(str(inventory.node(name).host),))
        if also is not None:
            facts.extra = also(transports[name], facts)
        return facts

    try:
        with ThreadPoolExecutor(max_workers=max(1, min(request.forks, len(transports) or 1))) as pool:
            facts = dict(zip(transports, pool.map(one, transports), strict=True))
    finally:
        for t in transports.values():
            t.close()
    return facts, {n: str(e) for n, e in unreachable.items()}
