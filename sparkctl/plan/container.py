"""PURE container planning: per-node env from that node's own interfaces, the docker run spec, the hostfile."""

from __future__ import annotations

import hashlib
import json
import posixpath
from dataclasses import dataclass, field

from sparkctl.facts import Facts
from sparkctl.inventory import Inventory, Node
from sparkctl.plan.fabric import FabricPlan
from sparkctl.plan.paths import (
    CONTAINER_HF_HOME,
    CONTAINER_STATE,
    ENTRYPOINT_PATH,
    HOSTFILE_PATH,
    expand_home,
    node_home,
    state_dir,
)
from sparkctl.plan.render import render

SPEC_LABEL = "sparkctl.spec"
#: The addresses the container's sshd listens on (the entrypoint reads it).
SSHD_LISTEN_ENV = "SPARKCTL_SSHD_LISTEN"
CLUSTER_LABEL = "sparkctl.cluster"


def cluster_label(cluster: str) -> str:
    """`key=value` of the label every container sparkctl runs for `cluster` carries (a filter's and docker run's)."""
    return f"{CLUSTER_LABEL}={cluster}"


# The settings each node must get from its OWN container (sshd SetEnv), never copied from the head by `mpirun -x`.
PER_NODE_SETTINGS = (
    "NCCL_SOCKET_IFNAME", "NCCL_IB_HCA", "UCX_NET_DEVICES",
    "OMPI_MCA_btl_tcp_if_include", "OMPI_MCA_oob_tcp_if_include",
)
# Forwarded to ranks started over ssh: the per-node settings and the static ones the playbook sets.
FORWARDED_ENV = PER_NODE_SETTINGS + (
    "CPATH", "TRITON_PTXAS_PATH", "HF_HOME", "HF_HUB_OFFLINE", "OMPI_ALLOW_RUN_AS_ROOT",
    "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM",
)


def ring_mpi_interface(fabric: FabricPlan, node: str) -> str | None:
    """In a ring, the ONE interface Open MPI's TCP transports use: the node's first twin (port 0 twin 1, the
    cable to the next node), the same NAME on every node.

    Why one: Open MPI 4.1's TCP BTL rates any two private IPv4 addresses as connected ("PRIVATE DIFFERENT
    NETWORK" still has a weight; the reachable framework is not consulted, so `reachable=netlink` changes
    nothing) and hands the matches to its per-interface modules by list position, not by the module's own
    interface. With four interfaces on two cables a module bound to one cable connects to a peer address on
    the other: "Network is unreachable" without routes; with the neighbour /32 routes the connection leaves on
    another cable than its source address, the two ends file it under different endpoints and the first
    collective hangs ("Match incoming connection ... failed"). One interface is one module and one address
    per peer: nothing to mis-pair; the neighbour routes (plan/fabric.py) carry it over the direct cable both
    ways. Why the same name: mpirun copies the head's OMPI_MCA_* environment into every rank, over what the
    node's sshd set, so a per-node name would silently become the head's. MPI over TCP is control traffic on
    a Spark; NCCL's RDMA path still uses every twin (NCCL_IB_HCA).
    """
    return fabric.first_interface(node)


def container_env(inventory: Inventory, node: str, fabric: FabricPlan) -> dict[str, str]:
    """A container's settings from its node's own Up twins (never one interface name typed on every node), as
    NVIDIA's two-Spark playbooks set them (nvidia/trt-llm/README.md, nvidia/vllm/README.md). NCCL and UCX take
    every twin (NCCL_IB_HCA: their RoCE devices). Where mpirun starts the ranks, Open MPI's out-of-band channel
    and its hostfile; where each node starts its own rank, the address the rank advertises and its control
    traffic's interface (Gloo, TensorPipe: one interface), both on the node's first twin."""
    engine = inventory.engine()
    ports = fabric.ports[node]
    env: dict[str, str] = {}
    if ports.interfaces:
        ifaces = ",".join(ports.interfaces)
        ring = inventory.topology == "ring" and engine.needs_mpi
        mpi_ifaces = (ring_mpi_interface(fabric, node) if ring else None) or ifaces
        env.update({
            "UCX_NET_DEVICES": ifaces,
            "NCCL_SOCKET_IFNAME": ifaces,
            "NCCL_IB_HCA": ",".join(d for d in ports.roce_devices if d),
            "OMPI_MCA_btl_tcp_if_include": mpi_ifaces,
        })
        if engine.needs_mpi:
            env["OMPI_MCA_oob_tcp_if_include"] = mpi_ifaces
        if not env["NCCL_IB_HCA"]:
            del env["NCCL_IB_HCA"]
    own = fabric.first_interface(node)
    if own is not None and engine.host_ip_env:
        env[engine.host_ip_env] = str(fabric.addresses[node][own].ip)
        env.update(dict.fromkeys(engine.control_ifname_envs, own))
    if engine.needs_mpi:
        env.update({
            "OMPI_MCA_orte_default_hostfile": HOSTFILE_PATH,
            "OMPI_MCA_rmaps_ppr_n_pernode": "1",
            "OMPI_ALLOW_RUN_AS_ROOT": "1",
            "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
        })
    env.update(dict(engine.static_env))
    env["HF_HOME"] = CONTAINER_HF_HOME
    # the engines load the pinned snapshot from the cache and never ask the Hub at start (plan/revisions.py)
    env["HF_HUB_OFFLINE"] = "1"
    env.update({str(k): str(v) for k, v in (inventory.container.env or {}).items()})
    if engine.needs_mpi:
        # sparkctl's own variables last, so no inventory key can override them (the inventory checks refuse
        # SPARKCTL_* keys too): the container mesh needs its sshd on the fabric only, never on the management LAN
        env[SSHD_LISTEN_ENV] = " ".join(str(a.ip) for a in fabric.addresses.get(node, {}).values()) or "127.0.0.1"
    return env


#: Docker's policy that brings a container back when its node boots or it dies, and keeps one stopped by hand
#: stopped (docs.docker.com/engine/containers/start-containers-automatically/). NVIDIA's procedure starts the
#: container with --rm, which cannot carry a restart policy: sparkctl does not remove it on exit.
RESTART_POLICY = "unless-stopped"


@dataclass
class ContainerSpec:
    name: str
    image: str
    env: dict[str, str]
    mounts: list[tuple[str, str, str]]      # (host path, container path, mode)
    docker_args: list[str]
    command: list[str]
    labels: dict[str, str] = field(default_factory=dict)
    #: sha256 of the files mounted into the container whose content is part of its spec (the entrypoint)
    content_hash: str = ""
    #: the node's docker starts it again at boot and when it dies, unless someone stopped it by hand
    restart: str = RESTART_POLICY

    def spec_hash(self) -> str:
        body = json.dumps(
            {"image": self.image, "env": self.env, "mounts": self.mounts, "args": self.docker_args,
             "command": self.command, "content": self.content_hash, "restart": self.restart},
            sort_keys=True,
        )
        return hashlib.sha256(body.encode()).hexdigest()[:16]

    def run_argv(self) -> list[str]:
        """`docker run` as NVIDIA's multi-node procedure does it (NVIDIA/dgx-spark-playbooks,
        nvidia/trt-llm/README.md), with sparkctl's deliberate changes (tests/unit/test_plan_golden.py lists them)."""
        argv = [
            "docker", "run", "-d", "--name", self.name, "--restart", self.restart,
            "--gpus", '"device=all"', "--network", "host",
            "--ulimit", "memlock=-1", "--ulimit", "stack=67108864",
            "--device", "/dev/infiniband:/dev/infiniband",
        ]
        for key in sorted(self.env):
            argv += ["-e", f"{key}={self.env[key]}"]
        for host, inside, mode in self.mounts:
            argv += ["-v", f"{host}:{inside}" + (f":{mode}" if mode else "")]
        labels = dict(self.labels, **{SPEC_LABEL: self.spec_hash()})
        for key in sorted(labels):
            argv += ["--label", f"{key}={labels[key]}"]
        argv += list(self.docker_args)
        argv += [self.image, *self.command]
        return argv


def container_spec(inventory: Inventory, node: Node, fabric: FabricPlan, facts: Facts | None = None) -> ContainerSpec:
    home = node_home(inventory, node, facts)
    state = state_dir(inventory, home)
    hf_cache = expand_home(inventory.container.hf_cache, home)
    if not inventory.engine().needs_mpi:
        # no sshd and no mesh: the ranks meet over the engine's own sockets; each node's server is started by its
        # serving unit with `docker exec`, so the container only has to stay up. `--init`: what a stopped rank
        # leaves (its workers, Ray's processes) is reaped by the container's init, never kept as a zombie by `sleep`
        return ContainerSpec(
            name=inventory.container.name, image=inventory.container.image,
            env=container_env(inventory, node.name, fabric),
            mounts=[(hf_cache.rstrip("/") + "/", CONTAINER_HF_HOME + "/", ""),
                    (posixpath.join(state, "run"), CONTAINER_STATE, "")],
            docker_args=["--init", *inventory.engine().docker_args, *(inventory.container.docker_args or [])],
            command=["sleep", "infinity"],
            labels={CLUSTER_LABEL: inventory.cluster.name})
    return ContainerSpec(
        name=inventory.container.name,
        image=inventory.container.image,
        env=container_env(inventory, node.name, fabric),
        mounts=[
            (hf_cache.rstrip("/") + "/", CONTAINER_HF_HOME + "/", ""),
            (posixpath.join(state, "container-ssh"), "/tmp/.ssh", "ro"),
            (posixpath.join(state, "entrypoint.sh"), ENTRYPOINT_PATH, "ro"),
            (posixpath.join(state, "run"), CONTAINER_STATE, ""),
        ],
        docker_args=[*inventory.engine().docker_args, *(inventory.container.docker_args or [])],
        command=["bash", ENTRYPOINT_PATH],
        labels={CLUSTER_LABEL: inventory.cluster.name},
        # sshd reads the entrypoint only at start: a new entrypoint means a new container
        content_hash=hashlib.sha256(render_entrypoint(inventory).encode()).hexdigest()[:16],
    )


def render_entrypoint(inventory: Inventory) -> str:
    return render(
        "container-entrypoint.sh.j2",
        cluster=inventory.cluster.name, container_name=inventory.container.name,
        ssh_port=inventory.container.ssh_port,
        # the inventory's own env must reach the ranks mpirun starts over ssh too
        forwarded_env=FORWARDED_ENV + tuple(k for k in sorted(inventory.container.env or {}) if k not in FORWARDED_ENV),
    )


def hostfile_addresses(inventory: Inventory, fabric: FabricPlan) -> list[str]:
    """Head first, then inventory order: the address each node owns on its first included interface that the
    head can reach. In a ring that is the node's address on its one MPI interface (ring_mpi_interface), which
    the neighbour routes make reachable from the head whichever cable it is on."""
    out = []
    head = inventory.nodes[0].name
    for node in inventory.nodes:
        if node.name == head or inventory.topology == "ring":
            ip = fabric.first_address(node.name)
        else:
            ip = fabric.address_facing(node.name, head)
        out.append(str(ip) if ip is not None else node.host)
    return out


def serving_hosts(inventory: Inventory, fabric: FabricPlan) -> list[str]:
    """The hostfile addresses of the nodes the model runs on, in rank order (mpirun --host)."""
    by_node = dict(zip((n.name for n in inventory.nodes), hostfile_addresses(inventory, fabric), strict=True))
    return [by_node[name] for name in inventory.serving_nodes() if name in by_node]


def render_hostfile(inventory: Inventory, fabric: FabricPlan) -> str:
    return render("openmpi-hostfile.j2", addresses=hostfile_addresses(inventory, fabric))
