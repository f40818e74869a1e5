"""PURE TensorRT-LLM planning: the config (extra_llm_api_options) and the mpirun launch line, for the image's release.

The config is release-aware: `decoding_type` is spelled as the image's TensorRT-LLM release spells it, a key of
the preset that the release does not have is left out, and a key the inventory's `serve.config` asks for that it
does not have, at any depth, is refused (TensorRT-LLM would refuse it at launch, after minutes of loading). The
inventory loader refuses the same keys up front (sparkctl/inventory/release_check.py), with their file:line.

The head's unit runs mpirun, which starts one rank per serving node through the containers' sshd (the mesh and
the hostfile are the cluster's: plan/container.py).
"""

from __future__ import annotations

import copy
import dataclasses
import shlex
from dataclasses import dataclass, field
from typing import ClassVar

import yaml

from sparkctl.engines import ENGINES
from sparkctl.inventory import Inventory
from sparkctl.inventory.release_check import spell_decoding, without_paths
from sparkctl.inventory.serve import deep_merge
from sparkctl.knowledge.trtllm_releases import Release, judged_note, release_of, schema_for
from sparkctl.plan.container import serving_hosts
from sparkctl.plan.fabric import FabricPlan
from sparkctl.plan.gateway import ENGINE_HOST
from sparkctl.plan.launch import Launch
from sparkctl.plan.paths import CONTAINER_HF_HOME, draft_dir
from sparkctl.plan.serve_unit import Peer, UnitRun, leftovers_script, own_pattern
from sparkctl.plan.world import WorldNames, config_pattern, engine_host, world_names

#: The config file, in the world's run/serve dir
TRTLLM_CONFIG_FILE = "extra-llm-api-config.yml"
#: the first world's (plan/world.py)
TRTLLM_CONFIG_PATH = WorldNames("").in_container(TRTLLM_CONFIG_FILE)


def serve_config(inventory: Inventory, release: Release | None = None) -> dict:
    """The preset's config under serve.config, decoding_type spelled for `release` (the image's tag's when None)."""
    spec = inventory.serve_spec()
    config = copy.deepcopy(dict(spec.config or {}))
    config.setdefault("cuda_graph_config", {})["max_batch_size"] = spec.max_batch_size
    decoding = spec.decoding or "none"
    if decoding != "none" and spec.draft:
        config["speculative_config"] = deep_merge(config.get("speculative_config", {}), {
            "max_draft_len": spec.max_draft_len,
            "speculative_model_dir": draft_dir(spec.draft) + "/",
        })
    else:
        config.pop("speculative_config", None)
    config = deep_merge(config, dict(inventory.serve.config or {}))
    release = release or image_release(inventory)
    return spell_decoding(config, decoding, schema_for(release) if release else None,
                          user_set="decoding_type" in (inventory.serve.config or {}).get("speculative_config", {}))


def image_release(inventory: Inventory) -> Release | None:
    """The release the inventory's image tag names (bootstrap prefers the running image's label)."""
    return release_of(inventory.container.image)


def launch_argv(inventory: Inventory, hosts: list[str] | None = None, host: str = ENGINE_HOST) -> list[str]:
    """mpirun from the head container; each rank takes its node's NCCL/UCX settings from its own container.

    One rank per serving node. When the model runs on other nodes than all of the cluster's in its order (tp_size x
    pp_size below the node count, or a world of several on its own nodes), `-np` and `--host` (the serving nodes'
    hostfile addresses, `hosts`, its head first) keep the launch on them: trtllm-serve refuses a world size that is
    not tp_size x pp_size, and the cluster's hostfile lists every node. The server answers at `host`
    (world.engine_host)."""
    spec = inventory.serve_spec()
    ranks: list[str] = []
    if inventory.serving_nodes() != [node.name for node in inventory.nodes]:
        ranks = ["-np", str(spec.world_size)] + (["--host", ",".join(hosts)] if hosts else [])
    return [
        "mpirun", *ranks,
        # Open MPI would otherwise copy the head's OMPI_MCA_* interface names onto every peer's daemon.
        "--mca", "plm_rsh_pass_environ_mca_params", "0",
        "-x", "CPATH=/usr/local/cuda/include",
        "-x", "TRITON_PTXAS_PATH=/usr/local/cuda/bin/ptxas",
        "-x", f"HF_HOME={CONTAINER_HF_HOME}",
        "trtllm-llmapi-launch", "trtllm-serve", spec.model,
        "--backend", "pytorch",
        "--tp_size", str(spec.tp_size),
        # NVIDIA's trtllm-serve docs (docs/source/commands/trtllm-serve.rst): --tp_size <tp> --pp_size <pp>
        *(["--pp_size", str(spec.pp_size)] if spec.pp_size > 1 else []),
        "--max_num_tokens", str(spec.max_num_tokens),
        # Every release's trtllm-serve has the flag; cuda_graph_config.max_batch_size only bounds graph capture.
        "--max_batch_size", str(spec.max_batch_size),
        "--extra_llm_api_options", world_names(inventory).in_container(TRTLLM_CONFIG_FILE),
        "--port", str(spec.engine_port),
        # only the gateway on the head reaches it (sparkctl/plan/gateway.py); NVIDIA's playbook: 0.0.0.0
        "--host", host,
    ]


@dataclass
class ReleaseConfig:
    """The config for one TensorRT-LLM release: what is written, what was left out, what is refused."""

    release: Release | None
    config: dict
    dropped: list[str] = field(default_factory=list)   # preset keys the release does not have
    refused: list[str] = field(default_factory=list)   # one line per override key the release would reject
    note: str = ""                                     # which known release an unknown one is judged as

    def text(self) -> str:
        return yaml.safe_dump(self.config, sort_keys=False, default_flow_style=False)


def release_config(inventory: Inventory, release: Release | None) -> ReleaseConfig:
    """serve_config for the image's release, checked at every depth; with no release, nothing is checked."""
    config = serve_config(inventory, release)
    if release is None:
        return ReleaseConfig(None, config)
    schema = schema_for(release)
    user = dict(inventory.serve.config or {})
    dropped, refused = [], []
    for problem in schema.validate(config):
        if _written_by_user(user, problem.path):
            refused.append(f"serve.config.{problem.dotted()}: {problem.message}"
                           + (f" ({problem.hint})" if problem.hint else ""))
        else:
            dropped.append(problem.dotted())
    return ReleaseConfig(release, without_paths(config, dropped), dropped, refused, judged_note(release, schema))


def _written_by_user(user: dict, path: tuple[str, ...]) -> bool:
    node: object = user
    for key in path:
        if not isinstance(node, dict) or key not in node:
            return False
        node = node[key]
    return True


@dataclass(frozen=True, kw_only=True)
class TrtllmLaunch(Launch):
    """mpirun from the head's container: one rank per serving node, each with its node's own settings."""

    config_file: ClassVar[str] = TRTLLM_CONFIG_FILE

    config: dict
    head: str
    argv: list[str]
    peers: tuple[Peer, ...]   # the other serving nodes' containers, where mpirun reaches them

    def config_text(self) -> str:
        return yaml.safe_dump(self.config, sort_keys=False, default_flow_style=False)

    def commands(self) -> dict[str, list[str]]:
        return {self.head: self.argv}

    def command_lines(self) -> str:
        return shlex.join(self.argv)

    @classmethod
    def leftovers(cls, names: WorldNames) -> str:
        # ranks that outlived their mpirun name their world's config file; `[ ]` matches the space in their command
        # line but not the script's own text
        return leftovers_script((f"--extra_llm_api_options[ ]{names.in_container(TRTLLM_CONFIG_FILE)}",),
                                names.marker)

    @classmethod
    def servers(cls, names: WorldNames | None = None) -> tuple[str, ...]:
        return (own_pattern("mpirun", config_pattern(names, TRTLLM_CONFIG_FILE)),)

    def unit_run(self, inventory: Inventory, node: str) -> UnitRun:
        return UnitRun(
            command=shlex.join(self.argv), config=self.names.in_container(TRTLLM_CONFIG_FILE),
            world=self.world(inventory), ours=self.servers(self.names)[0], leftovers=self.leftovers(self.names),
            mpirun=True, peers=self.peers)

    def describe(self) -> list[str]:
        return ["--- TensorRT-LLM config (extra_llm_api_options)", self.config_text().rstrip(),
                "--- launch (head container)", self.head_command()]

    def configured(self, inventory: Inventory, labels: dict[str, str]) -> TrtllmLaunch:
        release = release_of(inventory.container.image, labels)
        if release == self.release:
            return self
        return dataclasses.replace(self, **_config_fields(release_config(inventory, release)))


def _config_fields(rc: ReleaseConfig) -> dict:
    return {"release": rc.release, "config": rc.config, "dropped": rc.dropped, "refused": rc.refused,
            "note": rc.note}


def trtllm_launch(inventory: Inventory, fabric: FabricPlan) -> TrtllmLaunch:
    """The launch for the release the image's tag names (serve.config checks the running image's label)."""
    nodes = inventory.serving_nodes()
    hosts = serving_hosts(inventory, fabric)
    addresses = dict(zip(nodes, hosts, strict=True))
    head, host = nodes[0], engine_host(inventory, fabric)
    return TrtllmLaunch(
        engine=ENGINES["trtllm"], names=world_names(inventory), host=host, head=head,
        argv=launch_argv(inventory, hosts, host),
        peers=tuple(Peer(name, addresses[name]) for name in nodes if name != head),
        **_config_fields(release_config(inventory, image_release(inventory))))
