"""PURE vLLM planning: the `--config` file, and each serving node's `vllm serve` (and Ray's) line, per the
image's vLLM release.

Two ways the ranks meet, both from vLLM's own source (sparkctl/knowledge/vllm_releases.json):
- mp: one `vllm serve` per serving node with `--nnodes/--node-rank/--master-addr/--master-port`, every node but the
  head `--headless` (vLLM 0.11.1 and later have the flags; Ray is refused with --nnodes > 1);
- ray: a Ray cluster on the serving nodes (`ray start --head` on the head, `ray start --address` on the others), then
  `vllm serve --distributed-executor-backend ray` on the head. Up to 0.10.x the only way across nodes.
Every node's own settings (VLLM_HOST_IP, the socket interfaces, NCCL_IB_HCA) are in its container's environment
(plan/container.py), never passed from the head.
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass, field
from typing import ClassVar, Literal

import yaml

from sparkctl.engines import ENGINES
from sparkctl.inventory import Inventory
from sparkctl.knowledge.vllm_releases import VllmSchema, VllmVersion, judged_note, release_of, schema_for
from sparkctl.plan.fabric import FabricPlan
from sparkctl.plan.launch import Launch
from sparkctl.plan.paths import draft_dir
from sparkctl.plan.serve_unit import UnitRun, leftovers_script, own_pattern
from sparkctl.plan.world import WorldNames, config_pattern, engine_host, world_names

#: The --config file, in the world's run/serve dir (mounted in the container at CONTAINER_STATE)
VLLM_CONFIG_FILE = "vllm.yaml"
#: the first world's (plan/world.py)
VLLM_CONFIG_PATH = WorldNames("").in_container(VLLM_CONFIG_FILE)
#: vLLM names its processes `VLLM::EngineCore`, `VLLM::Worker_TP0`... (set_process_title, prefix
#: VLLM_PROCESS_NAME_PREFIX, default VLLM: vllm/utils/system_utils.py at v0.20.1): the ones left in our container
#: after their `vllm serve` ended are ours
VLLM_TITLE = "^VLLM::"
#: a Ray worker node's unit runs `ray start --block`
RAY_WORKER = r"ray.* start .*--block"


class VllmPlanError(ValueError):
    """The inventory asks for a launch the image's release cannot do (the loader refuses it with file:line)."""


@dataclass(frozen=True, kw_only=True)
class VllmLaunch(Launch):
    config_file: ClassVar[str] = VLLM_CONFIG_FILE

    executor: Literal["mp", "ray"]
    why: str                            # why that executor, in words
    config: dict                        # the --config file's content
    serve: dict[str, list[str]]         # serving node -> its `vllm serve` argv (ray: the head only)
    ray: dict[str, list[str]] = field(default_factory=dict)  # ray: serving node -> `ray start ... --block`

    def config_text(self) -> str:
        return yaml.safe_dump(self.config, sort_keys=False, default_flow_style=False)

    def commands(self) -> dict[str, list[str]]:
        """Every serving node's line: its `vllm serve`, or a Ray worker node's `ray start --block`."""
        return {node: self.serve.get(node) or self.ray[node] for node in dict.fromkeys([*self.serve, *self.ray])}

    def command_lines(self) -> str:
        """Every serving node's lines, one per line (`node: ...`, Ray's first): what a launch is started from, so
        that a worker's changed line restarts the world too."""
        lines = [f"{node}: ray: {shlex.join(argv)}" for node, argv in self.ray.items()]
        lines += [f"{node}: {shlex.join(argv)}" for node, argv in self.serve.items()]
        return "\n".join(lines)

    @classmethod
    def leftovers(cls, names: WorldNames) -> str:
        # `[ ]` matches the space in a process's command line but not the script's own text
        return leftovers_script((f"--config[ ]{names.in_container(VLLM_CONFIG_FILE)}", VLLM_TITLE), names.marker)

    @classmethod
    def servers(cls, names: WorldNames | None = None) -> tuple[str, ...]:
        return own_pattern("vllm", config_pattern(names, VLLM_CONFIG_FILE)), RAY_WORKER

    def unit_run(self, inventory: Inventory, node: str) -> UnitRun:
        """`node`'s own `vllm serve` (or its Ray node; the head's Ray node in the background, under its vllm serve)."""
        spec = inventory.serve_spec()
        names = inventory.serving_nodes()
        rank = names.index(node)
        command, before, ours = self.serve.get(node), "", self.servers(self.names)[0]
        if self.executor == "ray" and command is None:
            command, ours = self.ray[node], RAY_WORKER
        elif self.executor == "ray":
            before = shlex.join([a for a in self.ray[node] if a != "--block"])
        assert command is not None
        role = "the API server" if rank == 0 else "headless"
        return UnitRun(
            command=shlex.join(command), config=self.names.in_container(VLLM_CONFIG_FILE), ours=ours,
            world=f"vLLM TP={spec.tp_size} x PP={spec.pp_size}, rank {rank} of {len(names)} ({role}, {self.executor})",
            leftovers=self.leftovers(self.names),
            rank=rank, before=before, after="ray stop --force" if self.executor == "ray" else "")

    def describe(self) -> list[str]:
        release = f"vLLM {self.release}" if self.release else "the image's vLLM (release not known from its tag)"
        out = [f"vLLM: {release}, executor {self.executor} ({self.why})" + (f"; {self.note}" if self.note else ""),
               "no container sshd, mesh or hostfile: vLLM's ranks meet over their own sockets"]
        if self.dropped:
            out.append(f"left out (the release has no such flag): {', '.join(self.dropped)}")
        out.append(f"--- {self.config_path} (vllm serve --config, in every serving container)")
        out.append(self.config_text().rstrip())
        for node, argv in self.ray.items():
            out.append(f"--- Ray on {node} (in its container)")
            out.append(shlex.join(argv))
        for node, argv in self.serve.items():
            out.append(f"--- vllm serve on {node} (in its container)")
            out.append(shlex.join(argv))
        return out

    def rendezvous(self) -> str | None:
        head = next(iter(self.serve.values()))
        if "--master-addr" not in head:
            return None
        return f"{head[head.index('--master-addr') + 1]}:{head[head.index('--master-port') + 1]}"

    def programs(self) -> tuple[str, ...]:
        return ("ray",) if self.executor == "ray" else ()

    def configured(self, inventory: Inventory, labels: dict[str, str]) -> VllmLaunch:
        return self  # judged by the image's tag: NVIDIA's vLLM images carry no version label sparkctl reads


def image_release(inventory: Inventory) -> VllmVersion | None:
    return release_of(inventory.container.image)


def choose_executor(inventory: Inventory, schema: VllmSchema | None) -> tuple[Literal["mp", "ray"], str]:
    """(executor, why): serve.vllm.executor, or for auto the release's multi-node launcher where it has one."""
    asked = inventory.serve.vllm.executor
    single = inventory.serve_spec().world_size == 1
    if single:
        return "mp", "one node: no rendezvous"
    if asked == "mp" and schema is not None and not schema.has_nnodes:
        raise VllmPlanError(f"serve.vllm.executor mp: vLLM {schema.version} has no --nnodes (0.11.1 and later): "
                            "use ray, or an image with a later vLLM")
    if asked != "auto":
        return asked, f"serve.vllm.executor: {asked}"
    if schema is None or schema.has_nnodes:
        return "mp", "the release starts one vllm serve per node itself (--nnodes)"
    return "ray", f"vLLM {schema.version} has no --nnodes: across nodes it needs Ray"


def vllm_config(inventory: Inventory, schema: VllmSchema | None) -> tuple[dict, list[str]]:
    """The --config file (flag -> value) and the preset's flags the release lacks (left out, not the user's to
    fix; a flag the user wrote and the release lacks is refused by the inventory loader)."""
    spec = inventory.serve_spec()
    config = json.loads(json.dumps(spec.config))  # a plain deep copy
    if spec.decoding != "none" and spec.draft and isinstance(config.get("speculative-config"), dict):
        config["speculative-config"]["model"] = draft_dir(spec.draft)
    written = {key.replace("_", "-") for key in inventory.serve.config}
    dropped = [key for key in config
               if schema is not None and schema.canonical(f"--{key}") is None and key not in written]
    return {k: v for k, v in config.items() if k not in dropped}, dropped


def vllm_launch(inventory: Inventory, fabric: FabricPlan, release: VllmVersion | None = None) -> VllmLaunch:
    """Every serving node's command, for `release` (the image tag's when None)."""
    release = release or image_release(inventory)
    schema = schema_for(release) if release else None
    executor, why = choose_executor(inventory, schema)
    config, dropped = vllm_config(inventory, schema)
    spec = inventory.serve_spec()
    nodes = inventory.serving_nodes()
    head = nodes[0]
    names, host = world_names(inventory), engine_host(inventory, fabric)
    master = str(fabric.first_address(head) or inventory.node(head).host)
    common = ["vllm", "serve", spec.model, "--config", names.in_container(VLLM_CONFIG_FILE),
              "--tensor-parallel-size", str(spec.tp_size),
              *(["--pipeline-parallel-size", str(spec.pp_size)] if spec.pp_size > 1 else [])]
    front = ["--served-model-name", spec.served_name, *spec.aliases, "--host", host,
             "--port", str(spec.engine_port)]
    serve: dict[str, list[str]] = {}
    ray: dict[str, list[str]] = {}
    if executor == "mp":
        for rank, node in enumerate(nodes):
            multi = ["--nnodes", str(len(nodes)), "--node-rank", str(rank), "--master-addr", master,
                     "--master-port", str(inventory.serve.vllm.master_port)] if len(nodes) > 1 else []
            serve[node] = [*common, *multi, *(front if rank == 0 else ["--headless"]), *spec.args]
    else:
        port = str(inventory.serve.vllm.ray_port)
        for rank, node in enumerate(nodes):
            own = str(fabric.first_address(node) or inventory.node(node).host)
            # one GPU per Spark, said to Ray: a placement group's bundles of one GPU each then land one per node
            # (Ray's own count could be more where a node exposes more devices, and PACK would fill it first)
            own_node = ["--node-ip-address", own, "--num-gpus", "1", "--block"]
            ray[node] = (["ray", "start", "--head", "--port", port, *own_node] if rank == 0
                         else ["ray", "start", "--address", f"{master}:{port}", *own_node])
        serve[head] = [*common, "--distributed-executor-backend", "ray", *front, *spec.args]
    return VllmLaunch(engine=ENGINES["vllm"], names=names, host=host, release=release, dropped=dropped,
                      note=judged_note(release, schema) if release and schema else "", executor=executor, why=why,
                      config=config, serve=serve, ray=ray)
