"""PURE serve planning: the TensorRT-LLM config (extra_llm_api_options) and the mpirun launch line.

The config is release-aware when the release is known: a key of the preset that the image's TensorRT-LLM
does not have is left out; a key the inventory's `serve.config` asks for that it does not have is refused
(TensorRT-LLM would refuse it at launch, after minutes of loading).
"""

from __future__ import annotations

import copy
import hashlib
import shlex
from dataclasses import dataclass, field

import yaml

from sparkctl.inventory import Inventory
from sparkctl.inventory.presets import DECODING_TYPES
from sparkctl.inventory.serve import deep_merge
from sparkctl.knowledge.serve_client import endpoint_url
from sparkctl.knowledge.trtllm_releases import Release, key_paths, keys_for, unknown_keys, why_unknown, without_keys
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


def serve_config(inventory: Inventory) -> dict:
    spec = inventory.serve_spec()
    config = copy.deepcopy(dict(spec.config or {}))
    config.setdefault("cuda_graph_config", {})["max_batch_size"] = spec.max_batch_size
    decoding = spec.decoding or "none"
    if decoding != "none" and spec.draft:
        config["speculative_config"] = deep_merge(config.get("speculative_config", {}), {
            "decoding_type": DECODING_TYPES[decoding],
            "max_draft_len": spec.max_draft_len,
            "speculative_model_dir": draft_dir(spec.draft) + "/",
        })
    else:
        config.pop("speculative_config", None)
    return deep_merge(config, dict(inventory.serve.config or {}))


def render_serve_config(inventory: Inventory) -> str:
    return yaml.safe_dump(serve_config(inventory), sort_keys=False, default_flow_style=False)


def launch_argv(inventory: Inventory) -> list[str]:
    """mpirun from the head container; each rank takes its node's NCCL/UCX settings from its own container."""
    spec = inventory.serve_spec()
    return [
        "mpirun",
        # Open MPI would otherwise copy the head's OMPI_MCA_* interface names onto every peer's daemon.
        "--mca", "plm_rsh_pass_environ_mca_params", "0",
        "-x", "CPATH=/usr/local/cuda/include",
        "-x", "TRITON_PTXAS_PATH=/usr/local/cuda/bin/ptxas",
        "-x", f"HF_HOME={CONTAINER_HF_HOME}",
        "trtllm-llmapi-launch", "trtllm-serve", spec.model,
        "--backend", "pytorch",
        "--tp_size", str(spec.tp_size),
        "--max_num_tokens", str(spec.max_num_tokens),
        "--extra_llm_api_options", CONFIG_PATH,
        "--port", str(spec.port),
        "--host", "0.0.0.0",
    ]


def launch_command(inventory: Inventory) -> str:
    return shlex.join(launch_argv(inventory))


@dataclass
class ReleaseConfig:
    """The config for one TensorRT-LLM release: what is written, what was left out, what is refused."""

    release: Release | None
    config: dict
    dropped: list[str] = field(default_factory=list)   # preset keys the release does not have
    refused: list[str] = field(default_factory=list)   # one line per override key the release would reject

    def text(self) -> str:
        return yaml.safe_dump(self.config, sort_keys=False, default_flow_style=False)


def release_config(inventory: Inventory, release: Release | None) -> ReleaseConfig:
    """serve_config for the image's release; with an unknown release, nothing is filtered."""
    config = serve_config(inventory)
    if release is None:
        return ReleaseConfig(None, config)
    keys = keys_for(release)
    overrides = set(key_paths(dict(inventory.serve.config or {})))
    unknown = unknown_keys(config, keys)
    refused = [why_unknown(p, release) for p in unknown if p in overrides]
    dropped = [p for p in unknown if p not in overrides]
    return ReleaseConfig(release, without_keys(config, dropped), dropped, refused)


def launch_fingerprint(config_text: str, command: str) -> str:
    """What identifies a running server's setup: the config it read and the line that started it."""
    return hashlib.sha256(f"{config_text}\0{command}".encode()).hexdigest()[:16]
