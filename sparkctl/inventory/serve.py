"""What an inventory's `serve:` section means once its preset and overrides are resolved."""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from sparkctl.engines import DEFAULT_ENGINE, EngineName
from sparkctl.inventory.presets import (
    DECODING_TYPES,
    SGLANG_ALGORITHMS,
    VLLM_METHODS,
    default_preset_name,
    get_preset,
    thaw,
)
from sparkctl.inventory.sections import ServeSettings

DEFAULT_MAX_DRAFT_LEN = {"eagle3": 3, "draft-target": 4}


@dataclass(frozen=True)
class ServeSpec:
    """What to serve, with the preset and the inventory's overrides resolved."""

    preset: str | None
    model: str
    draft: str | None
    decoding: str
    max_draft_len: int | None
    tp_size: int
    port: int
    max_num_tokens: int
    max_batch_size: int
    # extra_llm_api_options without speculative_model_dir (the plan knows where the draft lives)
    config: dict[str, Any] = field(compare=False)
    hf_token_env: str = "HF_TOKEN"
    weights_gb: float | None = None  # known only when the model is the preset's
    draft_gb: float | None = None
    pp_size: int = 1
    #: where the engine answers on the head's loopback (the gateway answers on `port`)
    engine_port: int = 0
    #: where sparkctl's collector answers on the head's loopback (engines whose /metrics a read empties)
    collector_port: int = 0
    engine: EngineName = DEFAULT_ENGINE
    #: vLLM: extra `vllm serve` flags as written
    args: tuple[str, ...] = ()
    #: serve.models: the name clients ask for when it is not the repo id, and the others it answers to
    name: str | None = None
    aliases: tuple[str, ...] = ()

    @property
    def served_name(self) -> str:
        """What clients put in a request's `model` field."""
        return self.name or self.model

    @property
    def world_size(self) -> int:
        """MPI ranks of the launch: trtllm-serve wants tp_size x pp_size (one per node on Sparks)."""
        return self.tp_size * self.pp_size



def _preset_of(serve: ServeSettings, node_count: int):
    if serve.preset:
        return get_preset(serve.preset)
    if serve.model is None:
        name = default_preset_name(node_count, serve.engine or DEFAULT_ENGINE)
        return get_preset(name) if name else None
    return None


def engine_port(serve: ServeSettings, node_count: int) -> int:
    """serve.engine_port, else 10000 above the serve port (below it when that would pass 65535)."""
    if serve.engine_port is not None:
        return serve.engine_port
    port = serve_port(serve, node_count)
    return port + 10000 if port <= 55535 else port - 10000


def collector_port(serve: ServeSettings, node_count: int) -> int:
    """The figures collector's, on the head's loopback behind the gateway: the port right after the engine's, or
    right before it when that one is the serve port (or past 65535)."""
    engine = engine_port(serve, node_count)
    after = engine + 1
    return after if after <= 65535 and after != serve_port(serve, node_count) else engine - 1


def serve_port(serve: ServeSettings, node_count: int) -> int:
    """The port the server will listen on: serve.port when written, else the preset's (without resolving the
    rest, which a broken config section would stop)."""
    preset = _preset_of(serve, node_count)
    return serve.port if "port" in serve.model_fields_set or not preset else preset.port


def resolve_serve(serve: ServeSettings, node_count: int) -> ServeSpec:
    """The preset (named, or the default for the node count when no model is given) under the overrides.

    speculative_config.decoding_type and max_draft_len always follow the resolved decoding and
    max_draft_len; decoding none drops speculative_config. serve.config is merged over the preset's config.
    """
    preset = _preset_of(serve, node_count)
    engine = engine_of(serve, node_count)

    model = serve.model or preset.model
    decoding = serve.decoding or (preset.decoding if preset else ("eagle3" if serve.draft else "none"))
    draft = max_draft_len = None
    if decoding != "none":
        draft = serve.draft or (preset.draft if preset else None)
        max_draft_len = serve.max_draft_len
        if max_draft_len is None:
            same = preset is not None and preset.decoding == decoding
            max_draft_len = preset.max_draft_len if same else DEFAULT_MAX_DRAFT_LEN[decoding]

    base = preset.config_dict() if preset else {}
    config = CONFIG_RESOLVERS[engine](base, thaw(serve.config), decoding, max_draft_len)

    own_model = preset is not None and model == preset.model
    return ServeSpec(
        preset=preset.name if preset else None,
        model=model,
        draft=draft,
        decoding=decoding,
        max_draft_len=max_draft_len,
        tp_size=serve.tp_size or (preset.tp_size if preset else node_count),
        port=serve_port(serve, node_count),
        max_num_tokens=serve.max_num_tokens,
        max_batch_size=serve.max_batch_size,
        config=config,
        hf_token_env=serve.hf_token_env,
        weights_gb=preset.weights_gb if own_model else None,
        draft_gb=preset.draft_gb if own_model and draft == preset.draft else None,
        pp_size=serve.pp_size or 1,
        engine_port=engine_port(serve, node_count),
        collector_port=collector_port(serve, node_count),
        engine=engine,
        args=tuple(serve.args),
    )


def engine_of(serve: ServeSettings, node_count: int) -> EngineName:
    """serve.engine, else the preset's (the named one, or the default for the node count when no model is
    given), else the default engine."""
    if serve.engine:
        return serve.engine
    preset = _preset_of(serve, node_count)
    return preset.engine if preset else DEFAULT_ENGINE


def _trtllm_config(base: dict[str, Any], over: dict[str, Any], decoding: str, max_draft_len: int | None,
                   ) -> dict[str, Any]:
    config = deep_merge(base, over)
    # trtllm-serve's /metrics records iterations only with it (tensorrt_llm/llmapi/llm_args.py, every known
    # release); top, serve status and serve bench read them. Written false by the user, it stays false; a release
    # without the key has it dropped by the release check (plan/trtllm.py: release_config).
    config.setdefault("enable_iter_perf_stats", True)
    if decoding == "none":
        config.pop("speculative_config", None)
    else:
        speculative = config.setdefault("speculative_config", {})
        if _decoding_of(speculative.get("decoding_type")) != decoding:
            speculative["decoding_type"] = DECODING_TYPES[decoding]
        speculative["max_draft_len"] = max_draft_len
    return config


def flag_key(key: str) -> str:
    """A server flag's name as a key of serve.config, dashed (`max_model_len` and `max-model-len` alike, as vLLM
    reads its --config file)."""
    return key.replace("_", "-")


def _vllm_config(base: dict[str, Any], over: dict[str, Any], decoding: str, max_draft_len: int | None,
                 ) -> dict[str, Any]:
    config = deep_merge({flag_key(k): v for k, v in base.items()}, {flag_key(k): v for k, v in over.items()})
    if decoding == "none":
        config.pop("speculative-config", None)
    else:
        speculative = config.setdefault("speculative-config", {})
        if isinstance(speculative, dict):
            speculative["method"] = VLLM_METHODS[decoding]
            speculative["num_speculative_tokens"] = max_draft_len
    return config


def _sglang_config(base: dict[str, Any], over: dict[str, Any], decoding: str, max_draft_len: int | None,
                   ) -> dict[str, Any]:
    """SGLang's flags: the speculative ones follow the decoding. EAGLE-3 drafts max_draft_len steps of one token each
    (topk 1), so it verifies max_draft_len + 1 tokens (SGLang's docs, "EAGLE Decoding": num_draft_tokens is at most
    num_steps x topk + 1); a draft-target pair is SGLang's STANDALONE algorithm."""
    config = deep_merge({flag_key(k): v for k, v in base.items()}, {flag_key(k): v for k, v in over.items()})
    if decoding == "none":
        for key in SGLANG_SPECULATIVE:
            config.pop(key, None)
        return config
    config["speculative-algorithm"] = SGLANG_ALGORITHMS[decoding]
    config["speculative-num-steps"] = max_draft_len
    config.setdefault("speculative-eagle-topk", 1)
    config.setdefault("speculative-num-draft-tokens", (max_draft_len or 0) * config["speculative-eagle-topk"] + 1)
    return config


#: SGLang's speculative flags (--speculative-draft-model-path is the plan's: where the draft lives on the node)
SGLANG_SPECULATIVE = ("speculative-algorithm", "speculative-num-steps", "speculative-eagle-topk",
                      "speculative-num-draft-tokens", "speculative-draft-model-path")
#: serve.config keys (flag_key) that only mean something with a draft: set while decoding is none, they are refused
SPECULATIVE_FLAGS = ("speculative-config", *SGLANG_SPECULATIVE)
#: how each engine's config is resolved: the preset's, serve.config over it, then the decoding
CONFIG_RESOLVERS: dict[EngineName, Callable[[dict[str, Any], dict[str, Any], str, int | None], dict[str, Any]]] = {
    "trtllm": _trtllm_config, "vllm": _vllm_config, "sglang": _sglang_config}


def _decoding_of(decoding_type: Any) -> str | None:
    return {"eagle": "eagle3", "eagle3": "eagle3", "drafttarget": "draft-target"}.get(
        str(decoding_type).lower().replace("_", ""))


def deep_merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    """`over` merged into a copy of `base`, mapping by mapping."""
    out = copy.deepcopy(base)
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out
