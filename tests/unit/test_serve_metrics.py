"""vLLM's /metrics as `sparkctl top` reads it: the figures of one reading and what happened between two."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from sparkctl.knowledge import metric_names
from sparkctl.knowledge.serve_metrics import ServeSample, median_between, parse_prometheus, serve_rates
from sparkctl.knowledge.vllm_releases import VllmVersion, schema_for


def exposition(prompt: float, generation: float, ttft: list[float], drafted: float, accepted: float,
               kv_name: str = "vllm:kv_cache_usage_perc") -> str:
    """What vLLM's server prints: its metrics are prometheus_client's (vllm/v1/metrics/loggers.py), so they are
    written here with the same library, under vLLM's names and labels."""
    registry = CollectorRegistry()
    labels = ["engine", "model_name"]
    values = ("0", "meta-llama/Llama-3.3-70B-Instruct")
    Gauge("vllm:num_requests_running", "", labels, registry=registry).labels(*values).set(2)
    Gauge("vllm:num_requests_waiting", "", labels, registry=registry).labels(*values).set(1)
    Gauge(kv_name, "", labels, registry=registry).labels(*values).set(0.25)
    for name, total in (("vllm:prompt_tokens", prompt), ("vllm:generation_tokens", generation),
                        ("vllm:spec_decode_num_draft_tokens", drafted),
                        ("vllm:spec_decode_num_accepted_tokens", accepted)):
        Counter(name, "", labels, registry=registry).labels(*values).inc(total)
    histogram = Histogram("vllm:time_to_first_token_seconds", "", labels, buckets=[0.1, 0.5, 1.0], registry=registry)
    for seconds in ttft:
        histogram.labels(*values).observe(seconds)
    return generate_latest(registry).decode()


def test_the_names_read_are_vllms_own_in_every_release_that_has_them():
    for version in ("0.17.1", "0.20.1"):
        names = schema_for(VllmVersion.parse(version) or VllmVersion(0, 0, 0)).metrics
        for name in ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:prompt_tokens",
                     "vllm:generation_tokens", "vllm:kv_cache_usage_perc", "vllm:time_to_first_token_seconds",
                     "vllm:spec_decode_num_draft_tokens", "vllm:spec_decode_num_accepted_tokens"):
            assert name in names, (version, name)


def test_one_reading_and_the_rates_between_two():
    before = parse_prometheus(exposition(100, 1000, [0.05, 0.3], 300, 150), metric_names.VLLM)
    now = parse_prometheus(exposition(300, 1500, [0.05, 0.3, 0.2, 0.4, 0.7, 0.9], 600, 390), metric_names.VLLM)
    assert (now.running, now.waiting, now.kv_cache_fraction) == (2.0, 1.0, 0.25)
    assert now.prompt_tokens == 300 and now.generation_tokens == 1500
    rates = serve_rates(before, now, 2.0)
    assert (rates.prompt_tps, rates.generation_tps) == (100.0, 250.0)
    assert rates.acceptance == pytest.approx(240 / 300)
    # 4 first tokens between the readings: 2 in (0.1, 0.5], 2 in (0.5, 1.0]; the median is the bucket edge 0.5
    assert rates.ttft_p50_s == pytest.approx(0.5)


def test_before_017_the_kv_cache_has_its_old_name_and_nothing_new_has_no_median():
    old = parse_prometheus(exposition(1, 1, [], 0, 0, kv_name="vllm:gpu_cache_usage_perc"), metric_names.VLLM)
    assert old.kv_cache_fraction == 0.25
    assert serve_rates(old, old, 2.0).ttft_p50_s is None and serve_rates(old, old, 2.0).acceptance is None
    assert serve_rates(ServeSample(), old, 2.0).prompt_tps is None


def test_the_median_interpolates_inside_its_bucket_and_the_open_bucket_answers_its_lower_bound():
    assert median_between((), ((0.5, 0.0), (1.0, 4.0), (float("inf"), 4.0))) == pytest.approx(0.75)
    assert median_between((), ((0.5, 0.0), (float("inf"), 2.0))) == 0.5
