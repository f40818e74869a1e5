"""Text rendering of an offline plan (`sparkctl cluster plan`)."""

from __future__ import annotations

import shlex

from sparkctl.facts.firewall_files import RULES_PATH, UNIT_NAME
from sparkctl.inventory import Inventory
from sparkctl.plan import ClusterPlan
from sparkctl.plan.collector import SCRIPT_NAME, collector_spec
from sparkctl.plan.deployment import COPY_KEY, DeploymentRecord
from sparkctl.plan.firewall import firewall_spec
from sparkctl.plan.gateway import gateway_spec, offline_listen
from sparkctl.plan.launch import Launch
from sparkctl.plan.paths import ENTRYPOINT_PATH, node_home, state_dir
from sparkctl.plan.serve import launch_fingerprint
from sparkctl.rules.serving import serving_enabled
from sparkctl.runs.proofs import ProofFile
from sparkctl.secrets import MASK
from sparkctl.taskgraph import Graph

#: stands for the key in the plan's gateway config (shown masked: the plan never reads or makes a key)
PLAN_KEY = "0" * 43


def _section(title: str) -> str:
    return f"\n== {title} " + "=" * max(3, 74 - len(title))


def render_plan_text(inventory: Inventory, plan: ClusterPlan, graph: Graph | None = None,
                     recorded: DeploymentRecord | None = None) -> str:
    out: list[str] = [f"cluster {inventory.cluster.name}: {len(inventory.nodes)} node(s), topology "
                      f"{inventory.topology}, head {inventory.head.name}"]
    if graph is not None:
        out.append(_section("phases and tasks"))
        phase = None
        for task in graph.ordered():
            if task.phase != phase:
                phase = task.phase
                out.append(f"{phase}:")
            out.append(f"  {task.name:<22} {task.scope.value:<8} {task.description}")
    for name, node in plan.nodes.items():
        ports = plan.fabric.ports[name]
        out.append(_section(f"node {name} (rank {node.rank})"))
        where = {"pinned": "pinned in the inventory", "facts": "cabled (read from the node)",
                 "inventory": "fabric.port in the inventory", "default": "default port 1 (not connected: "
                 "bootstrap reads the cabled port from the node)",
                 "peer": "the peer's port (no carrier on this node: preflight says why)",
                 "ring": "both ports: the ring's port 0 to the next node, port 1 to the previous"}[ports.source]
        out.append(f"fabric interfaces: {', '.join(ports.interfaces) or '-'}  ({where})")
        env = node.container.env
        mpi = env.get("OMPI_MCA_btl_tcp_if_include")
        if inventory.topology == "ring" and mpi and mpi != env.get("NCCL_SOCKET_IFNAME"):
            out.append(f"Open MPI (TCP):    {mpi}  (one interface, the same name on every node: Open MPI 4.1 pairs "
                       "a peer's addresses with its own interfaces by list order; the ring's routes carry it to "
                       "every node. NCCL and UCX use all the twins)")
        if node.sysctl:
            out.append(f"forwarding:        {', '.join(k for k in node.sysctl if k.endswith('.forwarding'))} = 1 "
                       "(relays between its neighbours; rp_filter 2 on the same twins)")
        if ports.roce_devices:
            out.append(f"RoCE devices:      {', '.join(ports.roce_devices)}")
        for iface, addr in plan.fabric.addresses.get(name, {}).items():
            out.append(f"  {iface:<16} {addr}")
        if node.netplan:
            out.append(f"--- {inventory.fabric.netplan_file} (mode 600)")
            out.append(node.netplan.rstrip())
        out += _firewall_lines(inventory, plan, name)
        out.append("--- container")
        out.append(" \\\n    ".join(_argv_lines(node.container.run_argv())))
    out.append(_section("cluster"))
    if plan.entrypoint:
        out.append(f"--- {ENTRYPOINT_PATH} (every container's command, mounted read-only from the node's state dir: "
                   f"it writes the container's sshd config, port {inventory.container.ssh_port}, fabric addresses "
                   "only)")
        out.append(plan.entrypoint.rstrip())
        out.append("--- /etc/openmpi-hostfile (in every container)")
        out.append(plan.hostfile.rstrip())
    worlds = inventory.worlds()
    for world in worlds:
        view, launch = inventory.for_world(world), plan.launches[world.key]
        if len(worlds) > 1:
            out.append(_section(f"world {world.key or '(the first)'}: {view.serve_spec().served_name} on "
                                f"{', '.join(world.nodes)}"))
        out += launch.describe()
        if serving_enabled(inventory):
            out += _unit_lines(view, launch)
    if serving_enabled(inventory):
        if len(worlds) > 1:
            out.append(_section("endpoint"))
        out += _gateway_lines(inventory, plan)
        out += _deployment_lines(inventory, recorded)
    return "\n".join(out) + "\n"


def _models(inventory: Inventory) -> str:
    """The models a deployment serves, by repo id."""
    return ", ".join(m.spec.model for m in inventory.served_models())


def recorded_deployments(inventory: Inventory) -> DeploymentRecord | None:
    """The head's record of deployments as this machine's last run read or wrote it (offline)."""
    text = ProofFile(inventory.cluster.name).get(COPY_KEY)
    return DeploymentRecord.parse(text) if isinstance(text, str) else None


def _deployment_lines(inventory: Inventory, recorded: DeploymentRecord | None) -> list[str]:
    """The deployment this inventory names, and the one in use as this machine last recorded it."""
    lines = [f"--- deployment: image {inventory.container.image}, {inventory.engine().name} "
             f"{_models(inventory)} (bootstrap switches to it only once the image has one ID on every "
             "node, and puts the one in use back if it does not answer)",
             f"model revision: {inventory.serve.revision or 'main'}, pinned by model.pin on every serving node at "
             "the commit it is resolved to once (a later run serves that commit until serve.revision changes or "
             "a run is given --refresh)"]
    pinned = recorded.current.revision if recorded is not None and recorded.current is not None else None
    if pinned:
        lines.append(f"pinned at {pinned} (the commit in use, as this machine last recorded it)")
    if recorded is None or recorded.current is None:
        return [*lines, "in use: not recorded from this machine (`sparkctl serve status` reads the head)"]
    lines.append(f"in use (as this machine last recorded it): {recorded.current.summary()}")
    if recorded.previous is not None:
        lines.append(f"previous: {recorded.previous.summary()} (`sparkctl serve rollback` goes back to it)")
    return lines


def _firewall_lines(inventory: Inventory, plan: ClusterPlan, node: str) -> list[str]:
    spec = firewall_spec(inventory, node, plan.fabric, serving_enabled(inventory))
    if spec is None:
        return ["firewall:          off (the node's own rules are left alone)"]
    return [f"firewall:          on the management side only {spec.summary()}; the fabric keeps everything",
            f"--- {RULES_PATH} (loaded by {UNIT_NAME} at boot; with a revert unless a new connection proves "
            "the way in)", spec.rules().rstrip()]


def _unit_lines(inventory: Inventory, launch: Launch) -> list[str]:
    """Each serving unit and the script it runs in the container (the host script is its plumbing)."""
    fingerprint = launch_fingerprint(launch.config_text(), launch.command_lines())
    out = []
    for name in launch.commands():
        node = inventory.node(name)
        unit = launch.unit(inventory, name, state_dir=state_dir(inventory, node_home(inventory, node, None)),
                           user=node.user or inventory.user, fingerprint=fingerprint)
        out += [f"--- {unit.unit_path} on {name} (enabled; `sparkctl serve stop` disables it)",
                unit.unit_text().rstrip(),
                f"--- {unit.world_script} on {name} (mounted at {unit.names.in_container('world.sh')} in the "
                "container)",
                unit.world_text().rstrip()]
    return out


def _gateway_lines(inventory: Inventory, plan: ClusterPlan) -> list[str]:
    """The gateway on the head: its container and its config, the key masked (bootstrap writes the real one)."""
    home = node_home(inventory, inventory.head, None)
    listen = offline_listen(inventory)
    where = ", ".join(listen) if listen else ("every address of the head" if inventory.serve.listen == "all" else
                                              "the head's management address")
    spec = gateway_spec(inventory, None, state_dir(inventory, home), listen=listen or ["192.0.2.1"], hosts=plan.hosts)
    engines = "; ".join(f"{m.name} on " + ", ".join(f"{host}:{port}" for host, port in m.servers) for m in spec.models)
    engines = engines if len(spec.models) > 1 else "the engine on " + engines.partition(" on ")[2]
    lines = [f"--- gateway on {inventory.head.name} (NGINX; listens on {where} and 127.0.0.1, port "
             f"{spec.port}; {engines}; auth {inventory.serve.auth})"]
    lines.append(" \\\n    ".join(_argv_lines(spec.run_argv())))
    lines.append(f"--- {spec.config_path} (mode 600)" + ("" if listen else "; 192.0.2.1 stands for " + where))
    lines.append(spec.config(PLAN_KEY).replace(PLAN_KEY, MASK).rstrip())
    lines.append(f"--- {spec.router_path} (njs: the model a request names picks its world)")
    lines.append(spec.router().rstrip())
    for world in inventory.worlds():
        view = inventory.for_world(world)
        head = inventory.node(view.serving_nodes()[0])
        collector = collector_spec(view, state_dir(inventory, node_home(inventory, head, None)), plan.hosts[world.key])
        if collector is None:
            continue
        lines.append(f"--- figures collector {collector.container} on {head.name} (the one reader of the engine's "
                     f"/metrics, which a read empties; on {collector.host}:{collector.port}"
                     + (", the gateway's /metrics with the key" if not world.key else "")
                     + f"; {collector.script_path} is templates/{SCRIPT_NAME})")
        lines.append(" \\\n    ".join(_argv_lines(collector.run_argv())))
    return lines


def _argv_lines(argv: list[str]) -> list[str]:
    """Group flags with their values so a long docker command reads one option per line."""
    lines: list[str] = []
    i = 0
    head = []
    while i < len(argv) and not argv[i].startswith("-"):
        head.append(argv[i])
        i += 1
    lines.append(shlex.join(head))
    while i < len(argv):
        token = argv[i]
        if token.startswith("-") and i + 1 < len(argv) and not argv[i + 1].startswith("-") and token != "-d":
            lines.append(shlex.join(argv[i:i + 2]))
            i += 2
        elif token.startswith("-"):
            lines.append(token)
            i += 1
        else:
            lines.append(shlex.join(argv[i:]))
            break
    return lines


def plan_data(inventory: Inventory, plan: ClusterPlan, graph: Graph, recorded: DeploymentRecord | None = None) -> dict:
    """The same plan as data (`cluster plan --json`)."""
    phases: list[dict] = []
    for task in graph.ordered():
        if not phases or phases[-1]["phase"] != task.phase:
            phases.append({"phase": task.phase, "tasks": []})
        phases[-1]["tasks"].append({"name": task.name, "scope": task.scope.value, "needs": list(task.needs),
                                    "description": task.description})
    nodes = {}
    for name, node in plan.nodes.items():
        ports = plan.fabric.ports[name]
        nodes[name] = {"rank": node.rank, "interfaces": list(ports.interfaces), "interfaces_from": ports.source,
                       "roce_devices": list(ports.roce_devices),
                       "addresses": {iface: str(addr) for iface, addr in plan.fabric.addresses.get(name, {}).items()},
                       "netplan": node.netplan, "container": {"image": node.container.image,
                                                              "env": dict(node.container.env),
                                                              "argv": node.container.run_argv()}}
    worlds = [{"key": world.key, "model": world.model, "nodes": list(world.nodes),
               "serve_config": plan.launches[world.key].config_text(),
               "launch": plan.launches[world.key].head_command()} for world in inventory.worlds()]
    return {"cluster": inventory.cluster.name, "topology": inventory.topology, "head": inventory.head.name,
            "phases": phases, "nodes": nodes, "hostfile": plan.hostfile, "serve_config": plan.launch.config_text(),
            "launch": plan.launch.head_command(), "worlds": worlds,
            "deployment": _deployment_data(inventory, recorded)}


def _deployment_data(inventory: Inventory, recorded: DeploymentRecord | None) -> dict | None:
    if not serving_enabled(inventory):
        return None
    current = recorded.current if recorded is not None else None
    previous = recorded.previous if recorded is not None else None
    return {"image": inventory.container.image, "engine": inventory.engine().name,
            "model": _models(inventory), "in_use": current.data() if current else None,
            "previous": previous.data() if previous else None}
