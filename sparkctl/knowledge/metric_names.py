"""The names an engine's Prometheus `/metrics` gives the figures sparkctl reads (no parsing here: the engine
registry names its engine's set without loading the parser)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class PrometheusNames:
    running: str
    waiting: str
    prompt_tokens: str            # counters: exposed with `_total` appended
    generation_tokens: str
    kv_cache: tuple[str, ...]     # 0-1, the first one exposed wins (a release renamed it)
    ttft: str                     # histogram, seconds
    draft_tokens: str | None = None
    accepted_tokens: str | None = None
    drafts: str | None = None     # speculative steps
    accept_length: str | None = None  # a gauge of the mean acceptance length, where no counters say it


#: vLLM's (sparkctl/knowledge/vllm_releases.json, read from vllm/v1/metrics/loggers.py per release): KV-cache use
#: was `vllm:gpu_cache_usage_perc` before 0.17 and is `vllm:kv_cache_usage_perc` from it
VLLM = PrometheusNames(
    running="vllm:num_requests_running", waiting="vllm:num_requests_waiting", prompt_tokens="vllm:prompt_tokens",
    generation_tokens="vllm:generation_tokens", kv_cache=("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"),
    ttft="vllm:time_to_first_token_seconds", draft_tokens="vllm:spec_decode_num_draft_tokens",
    accepted_tokens="vllm:spec_decode_num_accepted_tokens", drafts="vllm:spec_decode_num_drafts")

#: SGLang's, with --enable-metrics (python/sglang/srt/metrics/collector.py: SchedulerMetricsCollector's gauges,
#: TokenizerMetricsCollector's counters and time-to-first-token histogram); the KV cache's use is `token_usage`,
#: speculative decoding's mean acceptance length the gauge `spec_accept_length`
SGLANG = PrometheusNames(
    running="sglang:num_running_reqs", waiting="sglang:num_queue_reqs", prompt_tokens="sglang:prompt_tokens",
    generation_tokens="sglang:generation_tokens", kv_cache=("sglang:token_usage",),
    ttft="sglang:time_to_first_token_seconds", accept_length="sglang:spec_accept_length")

#: TensorRT-LLM's, as sparkctl's collector on the head keeps them (templates/serve-collector.py): trtllm-serve's
#: /metrics is a queue of iteration stats each read empties, so one reader drains it and counts; these are the names
#: of its Prometheus text. No time to first token: the iteration stats have none.
TRTLLM_COLLECTED = PrometheusNames(
    running="sparkctl_trtllm_num_requests_running", waiting="sparkctl_trtllm_num_requests_waiting",
    prompt_tokens="sparkctl_trtllm_prompt_tokens", generation_tokens="sparkctl_trtllm_generation_tokens",
    kv_cache=("sparkctl_trtllm_kv_cache_usage_perc",), ttft="sparkctl_trtllm_time_to_first_token_seconds",
    draft_tokens="sparkctl_trtllm_spec_decode_num_draft_tokens",
    accepted_tokens="sparkctl_trtllm_spec_decode_num_accepted_tokens", drafts="sparkctl_trtllm_spec_decode_num_drafts")
