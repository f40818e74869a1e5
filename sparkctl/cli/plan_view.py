"""Text rendering of an offline plan (`sparkctl cluster plan`)."""

from __future__ import annotations

import shlex

from sparkctl.inventory import Inventory
from sparkctl.plan import ClusterPlan
from sparkctl.plan.container import render_entrypoint
from sparkctl.plan.gateway import gateway_spec, offline_listen
from sparkctl.plan.paths import ENTRYPOINT_PATH, node_home, state_dir
from sparkctl.plan.serve import launch_fingerprint
from sparkctl.plan.serve_unit import serve_unit_spec, vllm_unit_spec
from sparkctl.plan.vllm import VLLM_CONFIG_PATH, VllmLaunch
from sparkctl.rules.serving import serving_enabled
from sparkctl.secrets import MASK
from sparkctl.taskgraph import Graph

#: stands for the key in the plan's gateway config (shown masked: the plan never reads or makes a key)
PLAN_KEY = "0" * 43


def _section(title: str) -> str:
    return f"\n== {title} " + "=" * max(3, 74 - len(title))


def render_plan_text(inventory: Inventory, plan: ClusterPlan, graph: Graph | None = None) -> str:
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
        out.append("--- container")
        out.append(" \\\n    ".join(_argv_lines(node.container.run_argv())))
    out.append(_section("cluster"))
    if plan.vllm is not None:
        out += _vllm_lines(plan.vllm)
        if serving_enabled(inventory):
            out += _vllm_unit_lines(inventory, plan.vllm)
            out += _gateway_lines(inventory)
        return "\n".join(out) + "\n"
    out.append(f"--- {ENTRYPOINT_PATH} (every container's command, mounted read-only from the node's state dir: "
               f"it writes the container's sshd config, port {inventory.container.ssh_port}, fabric addresses only)")
    out.append(render_entrypoint(inventory).rstrip())
    out.append("--- /etc/openmpi-hostfile (in every container)")
    out.append(plan.hostfile.rstrip())
    out.append("--- TensorRT-LLM config (extra_llm_api_options)")
    out.append(plan.serve_config.rstrip())
    out.append("--- launch (head container)")
    out.append(plan.launch_command)
    if serving_enabled(inventory):
        out += _unit_lines(inventory, plan)
        out += _gateway_lines(inventory)
    return "\n".join(out) + "\n"


def _vllm_lines(launch: VllmLaunch) -> list[str]:
    release = f"vLLM {launch.release}" if launch.release else "the image's vLLM (release not known from its tag)"
    out = [f"vLLM: {release}, executor {launch.executor} ({launch.why})" + (f"; {launch.note}" if launch.note else ""),
           "no container sshd, mesh or hostfile: vLLM's ranks meet over their own sockets"]
    if launch.dropped:
        out.append(f"left out (the release has no such flag): {', '.join(launch.dropped)}")
    out.append(f"--- {VLLM_CONFIG_PATH} (vllm serve --config, in every serving container)")
    out.append(launch.config_text().rstrip())
    for node, argv in launch.ray.items():
        out.append(f"--- Ray on {node} (in its container)")
        out.append(shlex.join(argv))
    for node, argv in launch.serve.items():
        out.append(f"--- vllm serve on {node} (in its container)")
        out.append(shlex.join(argv))
    return out


def _unit_lines(inventory: Inventory, plan: ClusterPlan) -> list[str]:
    """The serving unit on the head and the script it runs in the container (the host script is its plumbing)."""
    head = inventory.head
    unit = serve_unit_spec(inventory, plan.fabric, state_dir=state_dir(inventory, node_home(inventory, head, None)),
                           user=head.user or inventory.user, command=plan.launch_command,
                           fingerprint=launch_fingerprint(plan.serve_config, plan.launch_command))
    return [f"--- {unit.unit_path} on {head.name} (enabled; `sparkctl serve stop` disables it)",
            unit.unit_text().rstrip(),
            f"--- {unit.world_script} (mounted at /sparkctl/serve/world.sh in the container)",
            unit.world_text().rstrip()]


def _vllm_unit_lines(inventory: Inventory, launch: VllmLaunch) -> list[str]:
    """Every serving node's unit and the script it runs in the container (each node's own rank)."""
    fingerprint = launch_fingerprint(launch.config_text(), launch.command_lines())
    out = []
    for name in inventory.serving_nodes():
        node = inventory.node(name)
        unit = vllm_unit_spec(inventory, launch, name, state_dir=state_dir(inventory, node_home(inventory, node, None)),
                              user=node.user or inventory.user, fingerprint=fingerprint)
        out += [f"--- {unit.unit_path} on {name} (enabled; `sparkctl serve stop` disables it)",
                unit.unit_text().rstrip(),
                f"--- {unit.world_script} on {name} (mounted at /sparkctl/serve/world.sh in the container)",
                unit.world_text().rstrip()]
    return out


def _gateway_lines(inventory: Inventory) -> list[str]:
    """The gateway on the head: its container and its config, the key masked (bootstrap writes the real one)."""
    home = node_home(inventory, inventory.head, None)
    listen = offline_listen(inventory)
    where = ", ".join(listen) if listen else ("every address of the head" if inventory.serve.listen == "all" else
                                              "the head's management address")
    lines = [f"--- gateway on {inventory.head.name} (NGINX; listens on {where} and 127.0.0.1, port "
             f"{inventory.serve_spec().port}; the engine on 127.0.0.1:{inventory.serve_spec().engine_port}; "
             f"auth {inventory.serve.auth})"]
    spec = gateway_spec(inventory, None, state_dir(inventory, home), listen=listen or ["192.0.2.1"])
    lines.append(" \\\n    ".join(_argv_lines(spec.run_argv())))
    lines.append(f"--- {spec.config_path} (mode 600)" + ("" if listen else "; 192.0.2.1 stands for " + where))
    lines.append(spec.config(PLAN_KEY).replace(PLAN_KEY, MASK).rstrip())
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


def plan_data(inventory: Inventory, plan: ClusterPlan, graph: Graph) -> dict:
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
    return {"cluster": inventory.cluster.name, "topology": inventory.topology, "head": inventory.head.name,
            "phases": phases, "nodes": nodes, "hostfile": plan.hostfile, "serve_config": plan.serve_config,
            "launch": plan.launch_command}
