"""Which extra_llm_api_options keys each TensorRT-LLM release accepts.

TensorRT-LLM's args model (`tensorrt_llm/llmapi/llm_args.py`) forbids unknown keys, so a key a release
does not have is a hard error at launch. The key set of 1.3.0rc12 (the release NVIDIA's two-Spark playbook
uses) is the base; the keys known to come and go are applied by release range:
`use_torch_sampler` existed only around 1.1.0rc0, `sampler_type` replaced it and was removed by 1.3.0rc26,
`speculative_config.eagle3_one_model` is not in 1.3.0rc27 and later.

The release is read from the image's `com.nvidia.tensorrt-llm.version` label, else from its tag.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import total_ordering

VERSION_LABEL = "com.nvidia.tensorrt-llm.version"

_VERSION = re.compile(r"^v?(\d+)\.(\d+)\.(\d+)(?:\.?(rc|a|b|dev|post)\.?(\d+))?$")
# A pre-release sorts before its final release; post after it.
_STAGE_ORDER = {"dev": 0, "a": 1, "b": 2, "rc": 3, None: 4, "post": 5}


@total_ordering
@dataclass(frozen=True)
class Release:
    major: int
    minor: int
    patch: int
    stage: str | None = None  # rc, a, b, dev, post; None: the final release
    number: int = 0

    @classmethod
    def parse(cls, text: str) -> Release | None:
        m = _VERSION.match(text.strip())
        if not m:
            return None
        return cls(int(m[1]), int(m[2]), int(m[3]), m[4], int(m[5] or 0))

    def _key(self) -> tuple:
        return (self.major, self.minor, self.patch, _STAGE_ORDER[self.stage], self.number)

    def __lt__(self, other: Release) -> bool:
        return self._key() < other._key()

    def __str__(self) -> str:
        return f"{self.major}.{self.minor}.{self.patch}" + (f"{self.stage}{self.number}" if self.stage else "")


def release_of(image: str | None, labels: dict[str, str] | None = None) -> Release | None:
    """The TensorRT-LLM release of an image: its version label first, else the tag (`...release:1.3.0rc12`)."""
    label = (labels or {}).get(VERSION_LABEL)
    if label:
        found = Release.parse(label)
        if found:
            return found
    if image and ":" in image.rsplit("/", 1)[-1]:
        return Release.parse(image.rsplit(":", 1)[1].split("@", 1)[0])
    return None


# fmt: off
_BASE_TOP_LEVEL = frozenset({
    "model", "tokenizer", "tokenizer_mode", "skip_tokenizer_init", "trust_remote_code",
    "tensor_parallel_size", "dtype", "revision", "tokenizer_revision", "pipeline_parallel_size",
    "context_parallel_size", "gpus_per_node", "moe_cluster_parallel_size", "moe_tensor_parallel_size",
    "moe_expert_parallel_size", "enable_attention_dp", "enable_lm_head_tp_in_adp", "cp_config",
    "load_format", "enable_lora", "lora_config", "kv_cache_config", "enable_chunked_prefill",
    "guided_decoding_backend", "batched_logits_processor", "iter_stats_max_iterations",
    "request_stats_max_iterations", "peft_cache_config", "scheduler_config", "cache_transceiver_config",
    "speculative_config", "max_batch_size", "max_input_len", "max_seq_len", "max_beam_width",
    "max_num_tokens", "gather_generation_logits", "num_postprocess_workers", "postprocess_tokenizer_dir",
    "reasoning_parser", "decoding_config", "mpi_session", "otlp_traces_endpoint", "backend",
    "return_perf_metrics", "orchestrator_type", "build_config", "garbage_collection_gen0_threshold",
    "cuda_graph_config", "attention_dp_config", "disable_overlap_scheduler", "moe_config", "attn_backend",
    "sampler_type", "enable_iter_perf_stats", "enable_iter_req_stats", "print_iter_log",
    "perf_metrics_max_requests", "batch_wait_timeout_ms", "batch_wait_timeout_iters",
    "batch_wait_max_tokens_ratio", "torch_compile_config", "enable_autotuner",
    "enable_layerwise_nvtx_marker", "enable_min_latency", "stream_interval", "force_dynamic_quantization",
    "allreduce_strategy", "checkpoint_loader", "checkpoint_format", "kv_connector_config",
    "mm_encoder_only", "enable_sleep", "disable_flashinfer_sampling", "max_stats_len",
    "ray_worker_extension_cls", "sparse_attention_config",
})
_BASE_NESTED = {
    "speculative_config": frozenset({
        "decoding_type", "max_draft_len", "max_total_draft_tokens", "speculative_model",
        "speculative_model_dir", "eagle_choices", "greedy_sampling", "posterior_threshold",
        "use_dynamic_tree", "dynamic_tree_max_topK", "num_eagle_layers", "max_non_leaves_per_layer",
        "eagle3_one_model", "eagle3_layers_to_capture", "load_format", "max_concurrency",
        "draft_len_schedule", "acceptance_window", "acceptance_length_threshold",
        "num_nextn_predict_layers", "use_relaxed_acceptance_for_thinking", "relaxed_topk",
        "relaxed_delta", "use_mtp_vanilla", "mtp_eagle_one_model", "begin_thinking_phase_token",
        "end_thinking_phase_token", "max_matching_ngram_size", "is_keep_all", "is_use_oldest",
        "is_public_pool", "is_auto_heuristic",
    }),
    "kv_cache_config": frozenset({
        "enable_block_reuse", "max_tokens", "max_attention_window", "sink_token_length",
        "free_gpu_memory_fraction", "host_cache_size", "onboard_blocks", "cross_kv_cache_fraction",
        "secondary_offload_min_priority", "event_buffer_max_size",
        "attention_dp_events_gather_period_ms", "enable_partial_reuse", "copy_on_partial_reuse",
        "use_uvm", "max_gpu_total_bytes", "dtype", "mamba_ssm_cache_dtype", "tokens_per_block",
    }),
    "cuda_graph_config": frozenset({"batch_sizes", "max_batch_size", "enable_padding"}),
}
# fmt: on


@dataclass(frozen=True)
class KeyChange:
    """A key that exists only in [since, until): `until` is the first release without it."""

    path: str  # "sampler_type" or "speculative_config.eagle3_one_model"
    since: Release | None
    until: Release | None
    note: str

    def present_in(self, release: Release) -> bool:
        return (self.since is None or release >= self.since) and (self.until is None or release < self.until)


def _r(text: str) -> Release:
    release = Release.parse(text)
    assert release is not None
    return release


KEY_CHANGES = (
    KeyChange("use_torch_sampler", _r("1.1.0rc0"), _r("1.1.0rc1"),
              "only around 1.1.0rc0; later releases use sampler_type: TorchSampler"),
    KeyChange("sampler_type", _r("1.1.0rc1"), _r("1.3.0rc26"), "removed by 1.3.0rc26"),
    KeyChange("speculative_config.eagle3_one_model", None, _r("1.3.0rc27"), "not in 1.3.0rc27 and later"),
)


@dataclass(frozen=True)
class KeySet:
    """The keys one release accepts: top level, and inside the nested sections it validates."""

    release: Release
    top_level: frozenset[str]
    nested: dict[str, frozenset[str]]

    def accepts(self, path: str) -> bool:
        head, _, rest = path.partition(".")
        if head not in self.top_level:
            return False
        if not rest or head not in self.nested:
            return True
        return rest.split(".", 1)[0] in self.nested[head]


def keys_for(release: Release) -> KeySet:
    top = set(_BASE_TOP_LEVEL)
    nested = {k: set(v) for k, v in _BASE_NESTED.items()}
    for change in KEY_CHANGES:
        head, _, sub = change.path.partition(".")
        target = nested[head] if sub else top
        name = sub or head
        if change.present_in(release):
            target.add(name)
        else:
            target.discard(name)
    return KeySet(release, frozenset(top), {k: frozenset(v) for k, v in nested.items()})


def key_paths(config: dict) -> list[str]:
    """`key` and `section.key` for every key the args model validates (nested one level, as it does)."""
    out = []
    for key, value in config.items():
        out.append(str(key))
        if isinstance(value, dict) and key in _BASE_NESTED:
            out.extend(f"{key}.{sub}" for sub in value)
    return out


def unknown_keys(config: dict, keys: KeySet) -> list[str]:
    """The keys of `config` that the release would reject."""
    return [p for p in key_paths(config) if not keys.accepts(p)]


def why_unknown(path: str, release: Release) -> str:
    """One line saying why the release rejects the key."""
    for change in KEY_CHANGES:
        if change.path == path:
            return f"{path} is not a key of TensorRT-LLM {release} ({change.note})"
    return f"{path} is not a key of TensorRT-LLM {release}"


def without_keys(config: dict, paths: list[str]) -> dict:
    """A copy of config without those keys (`a` or `a.b`)."""
    out = {k: (dict(v) if isinstance(v, dict) else v) for k, v in config.items()}
    for path in paths:
        head, _, sub = path.partition(".")
        if sub and isinstance(out.get(head), dict):
            out[head].pop(sub, None)
        elif not sub:
            out.pop(head, None)
    return out


#: Image tags with multi-node problems on Sparks: tag -> what goes wrong (from users' field reports; the TensorRT-LLM
#: issue and pull request numbers where there are some).
KNOWN_BAD_RELEASES = {
    "1.3.0rc13": "two-node TP=2 segfaulted in a field report (the same setup worked on 1.2.0rc6)",
    "1.3.0rc10": "NCCL_SYMMETRIC all-reduce segfaults or hangs on dual GB10 (TensorRT-LLM #12715, fixed by #12902)",
}
