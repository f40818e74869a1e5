"""PURE serve planning: the TensorRT-LLM config (extra_llm_api_options) and the mpirun launch line.

The config is release-aware: `decoding_type` is spelled as the image's TensorRT-LLM release spells it, a key of
the preset that the release does not have is left out, and a key the inventory's `serve.config` asks for that it
does not have, at any depth, is refused (TensorRT-LLM would refuse it at launch, after minutes of loading). The
inventory loader refuses the same keys up front (sparkctl/inventory/release_check.py), with their file:line.
"""

from __future__ import annotations

import copy
import hashlib
import shlex
from dataclasses import dataclass, field

import yaml

from sparkctl.inventory import Inventory
from sparkctl.inventory.release_check import spell_decoding, without_paths
from sparkctl.inventory.serve import deep_merge
from sparkctl.knowledge.serve_client import endpoint_url
from sparkctl.knowledge.trtllm_releases import Release, judged_note, release_of, schema_for
from sparkctl.plan.gateway import ENGINE_HOST
from sparkctl.plan.paths import CONFIG_PATH, CONTAINER_HF_HOME, draft_dir


def endpoint(inventory: Inventory) -> str:
    """The endpoint as clients see it: http://<head's inventory host>:<port> (shown, and tried from here)."""
    return endpoint_url(str(inventory.head.host), inventory.serve_spec().port)


def wanted_repos(inventory: Inventory) -> list[tuple[str, str | None]]:
    """(repo, local dir in the container or None for the hub cache): the model, then the draft."""
    spec = inventory.serve_spec()
    out: list[tuple[str, str | None]] = [(spec.model, None)]
    if spec.draft and spec.decoding != "none":
        out.append((spec.draft, draft_dir(spec.draft)))
    return out


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


def render_serve_config(inventory: Inventory) -> str:
    return release_config(inventory, image_release(inventory)).text()


def launch_argv(inventory: Inventory, hosts: list[str] | None = None) -> list[str]:
    """mpirun from the head container; each rank takes its node's NCCL/UCX settings from its own container.

    One rank per serving node. When the model runs on fewer nodes than the cluster has (tp_size x pp_size
    below the node count), `-np` and `--host` (the serving nodes' hostfile addresses, `hosts`) keep the launch
    on them: trtllm-serve refuses a world size that is not tp_size x pp_size."""
    spec = inventory.serve_spec()
    ranks: list[str] = []
    if spec.world_size < len(inventory.nodes):
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
        "--extra_llm_api_options", CONFIG_PATH,
        "--port", str(spec.engine_port),
        # only the gateway on the head reaches it (sparkctl/plan/gateway.py); NVIDIA's playbook: 0.0.0.0
        "--host", ENGINE_HOST,
    ]


def launch_command(inventory: Inventory, hosts: list[str] | None = None) -> str:
    return shlex.join(launch_argv(inventory, hosts))


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


def launch_fingerprint(config_text: str, command: str) -> str:
    """What identifies a running server's setup: the config it read and the line that started it."""
    return hashlib.sha256(f"{config_text}\0{command}".encode()).hexdigest()[:16]
