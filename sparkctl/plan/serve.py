"""PURE serve planning: the TensorRT-LLM config (extra_llm_api_options) and the mpirun launch line."""

from __future__ import annotations

import copy
import shlex
from typing import Any

import yaml

from sparkctl.plan.container import CONTAINER_HF_HOME, CONTAINER_STATE

CONFIG_PATH = f"{CONTAINER_STATE}/serve/extra-llm-api-config.yml"
LOG_PATH = f"{CONTAINER_STATE}/serve/serve.log"
DECODING_TYPES = {"eagle3": "Eagle", "draft-target": "DraftTarget"}


def draft_dir(repo: str) -> str:
    """Where the draft lives inside the container: in the mounted HF cache, never /opt (lost with the container)."""
    return f"{CONTAINER_HF_HOME}/sparkctl-models/{repo.replace('/', '--')}"


def deep_merge(base: dict, override: dict) -> dict:
    out = copy.deepcopy(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def serve_config(inventory: Any) -> dict:
    spec = inventory.serve_spec()
    config = copy.deepcopy(dict(spec.config or {}))
    config.setdefault("cuda_graph_config", {})["max_batch_size"] = inventory.serve.max_batch_size
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


def render_serve_config(inventory: Any) -> str:
    return yaml.safe_dump(serve_config(inventory), sort_keys=False, default_flow_style=False)


def launch_argv(inventory: Any) -> list[str]:
    """mpirun from the head container; each rank takes its node's NCCL/UCX settings from its own container."""
    spec = inventory.serve_spec()
    return [
        "mpirun",
        "-x", "CPATH=/usr/local/cuda/include",
        "-x", "TRITON_PTXAS_PATH=/usr/local/cuda/bin/ptxas",
        "-x", f"HF_HOME={CONTAINER_HF_HOME}",
        "trtllm-llmapi-launch", "trtllm-serve", spec.model,
        "--backend", "pytorch",
        "--tp_size", str(spec.tp_size),
        "--max_num_tokens", str(inventory.serve.max_num_tokens),
        "--extra_llm_api_options", CONFIG_PATH,
        "--port", str(inventory.serve.port),
        "--host", "0.0.0.0",
    ]


def launch_command(inventory: Any) -> str:
    return shlex.join(launch_argv(inventory))
