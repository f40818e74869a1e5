"""What to serve, by name: the engine, a model, its draft, the decoding, the config known to work on Sparks.

A preset name may carry a variant after a colon that picks another draft checkpoint, e.g.
`gpt-oss-120b-eagle3:v2` serves openai/gpt-oss-120b with nvidia/gpt-oss-120b-Eagle3-v2.
`config` is, for TensorRT-LLM, the extra_llm_api_options document without `speculative_model_dir`; for vLLM, the
`vllm serve` flags (as in its `--config` YAML: a flag's name without the dashes) without the draft's path in
`speculative-config`: where the draft lives on the node is decided by the plan, not here.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from sparkctl.engines import DEFAULT_ENGINE, EngineName

DECODINGS = ("eagle3", "draft-target", "none")

# vLLM's `speculative-config.method` of each decoding (vllm/config/speculative.py, SpeculativeMethod)
VLLM_METHODS = {"eagle3": "eagle3", "draft-target": "draft_model"}
# SGLang's --speculative-algorithm of each decoding (python/sglang/srt/speculative/spec_info.py, SpeculativeAlgorithm)
SGLANG_ALGORITHMS = {"eagle3": "EAGLE3", "draft-target": "STANDALONE"}

# The TensorRT-LLM `decoding_type` spellings of each decoding, best first; the plan writes the first one the
# image's release lists (sparkctl/knowledge/trtllm_releases.json): 1.1/1.2 resolve `DraftTarget` through a name
# table, the 1.3 tagged union lists `Draft_Target`. The two-Spark playbook writes `Eagle`, which the PyTorch
# backend treats as Eagle3; keeping its spelling keeps the rendered config equal to the playbook's.
DECODING_SPELLINGS = {"eagle3": ("Eagle", "Eagle3"), "draft-target": ("DraftTarget", "Draft_Target")}
DECODING_TYPES = {decoding: spellings[0] for decoding, spellings in DECODING_SPELLINGS.items()}


#: The NVIDIA/dgx-spark-playbooks commit the presets were compared with (nvidia/speculative-decoding/README.md).
PLAYBOOKS_COMMIT = "0db7c141da60870ca6ed5c99436320f4e35cd531"


def _frozen(value: Any) -> Any:
    if isinstance(value, Mapping):
        return MappingProxyType({k: _frozen(v) for k, v in value.items()})
    if isinstance(value, (list, tuple)):
        return tuple(_frozen(v) for v in value)
    return value


def thaw(value: Any) -> Any:
    """A plain, mutable deep copy (dicts and lists) of a frozen config."""
    if isinstance(value, Mapping):
        return {k: thaw(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [thaw(v) for v in value]
    return value


@dataclass(frozen=True, eq=False)
class Preset:
    engine: EngineName
    name: str
    model: str
    draft: str | None
    decoding: str
    max_draft_len: int | None
    tp_size: int
    port: int
    config: Mapping[str, Any]
    weights_gb: float  # checkpoint size of the target model, for the fit check before launch
    draft_gb: float
    description: str = ""
    # variant name -> draft checkpoint, selected as `<name>:<variant>`
    variants: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    #: where the values come from (NVIDIA/dgx-spark-playbooks at commit PLAYBOOKS_COMMIT) and each deliberate
    #: difference from it, with its reason
    source: str = ""

    def __post_init__(self) -> None:
        object.__setattr__(self, "config", _frozen(self.config))
        object.__setattr__(self, "variants", _frozen(self.variants))

    def config_dict(self) -> dict[str, Any]:
        return thaw(self.config)


_QWEN3_235B_EAGLE3 = Preset(
    engine="trtllm",
    name="qwen3-235b-eagle3",
    model="nvidia/Qwen3-235B-A22B-FP4",
    draft="nvidia/Qwen3-235B-A22B-Eagle3",
    decoding="eagle3",
    max_draft_len=3,
    tp_size=2,
    port=8355,
    weights_gb=125,
    draft_gb=1,
    description="NVIDIA's two-Spark speculative decoding playbook: Qwen3-235B-A22B FP4 + Eagle3, TP=2",
    source="nvidia/speculative-decoding/README.md, two-Spark Eagle3 config (image 1.3.0rc12): every config value as "
           "written there; the draft lives in the HF cache instead of /opt (lost with the container)",
    config={
        "enable_attention_dp": False,
        "disable_overlap_scheduler": False,
        "enable_autotuner": False,
        "enable_chunked_prefill": False,
        "cuda_graph_config": {"max_batch_size": 1},
        "speculative_config": {"decoding_type": "Eagle", "max_draft_len": 3},
        "kv_cache_config": {"free_gpu_memory_fraction": 0.9, "enable_block_reuse": False},
    },
)

_GPT_OSS_120B_EAGLE3 = Preset(
    engine="trtllm",
    name="gpt-oss-120b-eagle3",
    model="openai/gpt-oss-120b",
    draft="nvidia/gpt-oss-120b-Eagle3",
    decoding="eagle3",
    max_draft_len=5,
    tp_size=1,
    port=8000,
    weights_gb=61,
    draft_gb=1,
    description="One Spark: gpt-oss-120b + Eagle3 (variants: long-context, v2, throughput, v3)",
    source="nvidia/speculative-decoding/README.md, Option 1 EAGLE-3 (image 1.3.0rc12): config values, max_draft_len 5, "
           "free_gpu_memory_fraction 0.9 and --max_batch_size 1 as written there; the default draft is "
           "nvidia/gpt-oss-120b-Eagle3 where the playbook downloads -long-context (the variant "
           "gpt-oss-120b-eagle3:long-context serves exactly the playbook's)",
    config={
        "enable_attention_dp": False,
        "disable_overlap_scheduler": False,
        "enable_autotuner": False,
        "cuda_graph_config": {"max_batch_size": 1},
        "speculative_config": {"decoding_type": "Eagle", "max_draft_len": 5},
        "kv_cache_config": {"free_gpu_memory_fraction": 0.9, "enable_block_reuse": False},
    },
    variants={
        "long-context": "nvidia/gpt-oss-120b-Eagle3-long-context",
        "v2": "nvidia/gpt-oss-120b-Eagle3-v2",
        "throughput": "nvidia/gpt-oss-120b-Eagle3-throughput",
        "v3": "nvidia/gpt-oss-120b-Eagle3-v3",
    },
)

_LLAMA_33_70B_DRAFT_TARGET = Preset(
    engine="trtllm",
    name="llama-3.3-70b-draft-target",
    model="nvidia/Llama-3.3-70B-Instruct-FP4",
    draft="nvidia/Llama-3.1-8B-Instruct-FP4",
    decoding="draft-target",
    max_draft_len=4,
    tp_size=1,
    port=8000,
    weights_gb=40,
    draft_gb=6,
    description="One Spark: Llama-3.3-70B FP4 with Llama-3.1-8B FP4 as the draft model",
    source="nvidia/speculative-decoding/README.md, Option 2 Draft Target (image 1.3.0rc12): config values as written "
           "there, the memory fraction is its --kv_cache_free_gpu_memory_fraction 0.9; decoding_type is spelled as the "
           "image's release lists it (the playbook writes DraftTarget, the 1.3 tagged union lists Draft_Target)",
    config={
        "print_iter_log": False,
        "disable_overlap_scheduler": True,
        "speculative_config": {"decoding_type": "DraftTarget", "max_draft_len": 4},
        "kv_cache_config": {"free_gpu_memory_fraction": 0.9, "enable_block_reuse": False},
    },
)

#: The NVIDIA/dgx-spark-playbooks commit of the two-Spark vLLM playbook the vLLM presets follow (nvidia/vllm/README.md)
VLLM_PLAYBOOK_COMMIT = "0e4cfe880b119e5173d31ddff0d3d2350811ffa9"

_LLAMA_33_70B_VLLM = Preset(
    engine="vllm",
    name="llama-3.3-70b-vllm",
    model="meta-llama/Llama-3.3-70B-Instruct",
    draft=None,
    decoding="none",
    max_draft_len=None,
    tp_size=2,
    port=8000,
    weights_gb=142,
    draft_gb=0,
    description="Two Sparks on vLLM: Llama-3.3-70B-Instruct (BF16), TP=2, NVIDIA's two-Spark vLLM playbook",
    source="nvidia/vllm/README.md, Run on two Sparks, step 8: `vllm serve meta-llama/Llama-3.3-70B-Instruct "
           "--tensor-parallel-size 2 --max_model_len 2048`; the playbook starts Ray by hand, sparkctl picks the "
           "launch the image's release supports (serve.vllm.executor)",
    config={"max-model-len": 2048},
)

_LLAMA_33_70B_VLLM_EAGLE3 = Preset(
    engine="vllm",
    name="llama-3.3-70b-vllm-eagle3",
    model="meta-llama/Llama-3.3-70B-Instruct",
    draft="yuhuili/EAGLE3-LLaMA3.3-Instruct-70B",
    decoding="eagle3",
    max_draft_len=3,
    tp_size=2,
    port=8000,
    weights_gb=142,
    draft_gb=2,  # about 1 B parameters (one decoder layer as wide as the 70B, its own head) in BF16
    description="Two Sparks on vLLM: Llama-3.3-70B-Instruct (BF16) + the EAGLE-3 draft of its authors, TP=2",
    source="the model and max-model-len as in llama-3.3-70b-vllm; the speculative config as vLLM's own EAGLE-3 "
           "example (docs/features/speculative_decoding/eagle.md at v0.20.1: method eagle3, "
           "draft_tensor_parallel_size equal to the target's tensor-parallel-size) with the Llama-3.3-70B draft the "
           "EAGLE authors publish (github.com/SafeAILab/EAGLE, README: yuhuili/EAGLE3-LLaMA3.3-Instruct-70B); 3 "
           "speculative tokens as the TensorRT-LLM two-Spark preset",
    config={"max-model-len": 2048,
            "speculative-config": {"method": "eagle3", "num_speculative_tokens": 3, "draft_tensor_parallel_size": 2}},
)

#: NVIDIA's SGLang playbook (NVIDIA/dgx-spark-playbooks nvidia/sglang/README.md at
#: a0d99066db7ef7cbb1d223d7289e4f8b61bb084d): its model support matrix and the server line of its step 5
SGLANG_PLAYBOOK = "NVIDIA/dgx-spark-playbooks nvidia/sglang/README.md (a0d99066)"

_GPT_OSS_120B_SGLANG = Preset(
    engine="sglang",
    name="gpt-oss-120b-sglang",
    model="openai/gpt-oss-120b",
    draft=None,
    decoding="none",
    max_draft_len=None,
    tp_size=2,
    port=8000,
    weights_gb=61,
    draft_gb=0,
    description="Two Sparks on SGLang: gpt-oss-120b (MXFP4), TP=2",
    source=f"{SGLANG_PLAYBOOK}: GPT-OSS-120B MXFP4 in its model support matrix, --mem-fraction-static 0.75 as its "
           "step 5 starts the server; across two Sparks with SGLang's multi-node flags (--tp-size 2 --nnodes 2 "
           "--node-rank --dist-init-addr, docs.sglang.io references/multi_node_deployment/multi_node) where the "
           "playbook scales --tp on one machine",
    config={"mem-fraction-static": 0.75},
)

_LLAMA_33_70B_SGLANG_EAGLE3 = Preset(
    engine="sglang",
    name="llama-3.3-70b-sglang-eagle3",
    model="meta-llama/Llama-3.3-70B-Instruct",
    draft="yuhuili/EAGLE3-LLaMA3.3-Instruct-70B",
    decoding="eagle3",
    max_draft_len=3,
    tp_size=2,
    port=8000,
    weights_gb=142,
    draft_gb=2,
    description="Two Sparks on SGLang: Llama-3.3-70B-Instruct (BF16) + the EAGLE-3 draft of its authors, TP=2",
    source="SGLang's speculative decoding guide (docs/advanced_features/speculative_decoding, EAGLE-3: "
           "--speculative-algorithm EAGLE3 with --speculative-num-steps, --speculative-eagle-topk and "
           "--speculative-num-draft-tokens) with the Llama-3.3-70B draft the EAGLE authors publish "
           "(github.com/SafeAILab/EAGLE, README: yuhuili/EAGLE3-LLaMA3.3-Instruct-70B); 3 steps of topk 1 as the "
           "vLLM preset's 3 speculative tokens; the context length of llama-3.3-70b-vllm; "
           f"--mem-fraction-static 0.75 as {SGLANG_PLAYBOOK} step 5",
    config={"context-length": 2048, "mem-fraction-static": 0.75, "speculative-eagle-topk": 1},
)

PRESETS: dict[str, Preset] = {
    p.name: p for p in (_QWEN3_235B_EAGLE3, _GPT_OSS_120B_EAGLE3, _LLAMA_33_70B_DRAFT_TARGET, _LLAMA_33_70B_VLLM,
                        _LLAMA_33_70B_VLLM_EAGLE3, _GPT_OSS_120B_SGLANG, _LLAMA_33_70B_SGLANG_EAGLE3)
}


def preset_names() -> list[str]:
    """Every name get_preset accepts, variants included."""
    names: list[str] = []
    for preset in PRESETS.values():
        names.append(preset.name)
        names.extend(f"{preset.name}:{variant}" for variant in preset.variants)
    return names


def get_preset(name: str) -> Preset:
    """The preset called `name` (`base` or `base:variant`). Raises KeyError with the reason."""
    base, _, variant = name.partition(":")
    if base not in PRESETS:
        raise KeyError(f"unknown preset {name!r}")
    preset = PRESETS[base]
    if not variant:
        return preset
    if variant not in preset.variants:
        known = ", ".join(preset.variants) or "none"
        raise KeyError(f"preset {base!r} has no variant {variant!r} (variants: {known})")
    return dataclasses.replace(preset, name=name, draft=preset.variants[variant], variants={})


#: each engine's preset when the inventory names neither a preset nor a model: (on two or more nodes, on one)
DEFAULT_PRESETS: dict[EngineName, tuple[Preset, Preset | None]] = {
    "trtllm": (_QWEN3_235B_EAGLE3, _GPT_OSS_120B_EAGLE3),
    "vllm": (_LLAMA_33_70B_VLLM_EAGLE3, None),
    "sglang": (_LLAMA_33_70B_SGLANG_EAGLE3, None),
}


def default_preset_name(node_count: int, engine: EngineName = DEFAULT_ENGINE) -> str | None:
    """What to serve when the inventory names neither a preset nor a model (None: no preset of that engine
    fits, serve.model must say)."""
    several, one = DEFAULT_PRESETS[engine]
    preset = several if node_count >= 2 else one
    return preset.name if preset else None
