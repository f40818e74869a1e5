"""PURE readings of the engines' `/metrics` (for `sparkctl top`): requests running and waiting, tokens per second,
KV-cache use, the time-to-first-token median and speculative decoding's acceptance, between two readings.

Prometheus text (vLLM): the token counters, the TTFT histogram, draft and accepted token counters, by the names
the engine gives them (knowledge/metric_names.py; a counter is exposed with `_total` appended). The text is parsed
with the official Prometheus client's parser.
"""

from __future__ import annotations

from dataclasses import dataclass

from sparkctl.knowledge.metric_names import PrometheusNames


@dataclass(frozen=True)
class ServeSample:
    running: float | None = None
    waiting: float | None = None
    prompt_tokens: float | None = None       # totals since the engine started
    generation_tokens: float | None = None
    kv_cache_fraction: float | None = None   # 0-1
    ttft_buckets: tuple[tuple[float, float], ...] = ()  # (upper bound, cumulative count), +Inf last
    draft_tokens: float | None = None
    accepted_tokens: float | None = None
    drafts: float | None = None               # speculative steps (vllm:spec_decode_num_drafts)
    accept_length: float | None = None        # the engine's own mean acceptance length (a gauge: SGLang's)


def parse_prometheus(text: str, names: PrometheusNames) -> ServeSample:
    """The figures of one `/metrics` reading, summed over the engines' label sets."""
    # loaded at the first reading (runs/preload.py loads it while the nodes read their facts)
    from prometheus_client.parser import text_string_to_metric_families

    sums: dict[str, float] = {}
    buckets: dict[float, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if family.name == names.ttft and sample.name == f"{names.ttft}_bucket":
                bound = float(sample.labels["le"])
                buckets[bound] = buckets.get(bound, 0.0) + sample.value
            elif sample.name in (family.name, f"{family.name}_total"):
                sums[family.name] = sums.get(family.name, 0.0) + sample.value
    kv = next((sums[name] for name in names.kv_cache if name in sums), None)

    def of(name: str | None) -> float | None:
        return sums.get(name) if name else None

    return ServeSample(
        running=of(names.running), waiting=of(names.waiting), prompt_tokens=of(names.prompt_tokens),
        generation_tokens=of(names.generation_tokens), kv_cache_fraction=kv,
        ttft_buckets=tuple(sorted(buckets.items())), draft_tokens=of(names.draft_tokens),
        accepted_tokens=of(names.accepted_tokens), drafts=of(names.drafts), accept_length=of(names.accept_length))


@dataclass(frozen=True)
class ServeRates:
    prompt_tps: float | None
    generation_tps: float | None
    ttft_p50_s: float | None      # of the requests that got their first token between the two readings
    acceptance: float | None      # accepted / drafted tokens between the two readings


def _rate(before: float | None, now: float | None, seconds: float) -> float | None:
    if before is None or now is None or now < before or seconds <= 0:
        return None
    return (now - before) / seconds


def median_between(before: tuple[tuple[float, float], ...], now: tuple[tuple[float, float], ...]) -> float | None:
    """The median of what a histogram counted between two readings, interpolated in its bucket as Prometheus'
    histogram_quantile does (the +Inf bucket answers with the largest finite bound)."""
    earlier = dict(before)
    deltas = [(bound, count - earlier.get(bound, 0.0)) for bound, count in now]
    total = deltas[-1][1] if deltas else 0.0
    if total <= 0:
        return None
    rank, lower, below = total / 2, 0.0, 0.0
    for bound, cumulative in deltas:
        if cumulative >= rank:
            if bound == float("inf"):
                return lower
            inside = cumulative - below
            return lower + (bound - lower) * ((rank - below) / inside if inside else 1.0)
        lower, below = bound, cumulative
    return lower


def serve_rates(before: ServeSample, now: ServeSample, seconds: float) -> ServeRates:
    drafted = _rate(before.draft_tokens, now.draft_tokens, 1.0)
    accepted = _rate(before.accepted_tokens, now.accepted_tokens, 1.0)
    return ServeRates(
        prompt_tps=_rate(before.prompt_tokens, now.prompt_tokens, seconds),
        generation_tps=_rate(before.generation_tokens, now.generation_tokens, seconds),
        ttft_p50_s=median_between(before.ttft_buckets, now.ttft_buckets),
        acceptance=accepted / drafted if drafted and accepted is not None else None)


@dataclass(frozen=True)
class ServingFigures:
    """What `top` shows for serving, from either engine."""
    running: float | None
    waiting: float | None
    prompt_tps: float | None
    generation_tps: float | None
    ttft_p50_s: float | None
    kv_cache_fraction: float | None
    acceptance: float | None      # accepted / drafted tokens


def prometheus_figures(before: ServeSample, now: ServeSample, seconds: float) -> ServingFigures:
    rates = serve_rates(before, now, seconds)
    return ServingFigures(now.running, now.waiting, rates.prompt_tps, rates.generation_tps, rates.ttft_p50_s,
                          now.kv_cache_fraction, rates.acceptance)


def acceptance_length(before: ServeSample | None, now: ServeSample) -> float | None:
    """The mean acceptance length between two readings (since the engine started when `before` is None): from
    counters as vLLM's own log computes it, 1 + accepted tokens / speculative steps, the bonus token included
    (vllm/v1/spec_decode/metrics.py at v0.20.1); where the engine keeps only a gauge of it (SGLang), the gauge.
    None without speculative steps."""
    if now.drafts is None and now.accept_length is not None:
        return round(now.accept_length, 2) if now.accept_length > 0 else None  # the engine's own, as it says it
    drafts = (now.drafts or 0.0) - ((before.drafts or 0.0) if before else 0.0)
    accepted = (now.accepted_tokens or 0.0) - ((before.accepted_tokens or 0.0) if before else 0.0)
    return round(1 + accepted / drafts, 2) if drafts > 0 else None


def metrics_reading(text: str, names: PrometheusNames) -> ServeSample:
    """One /metrics answer through the gateway (the engine's own Prometheus text, or the collector's)."""
    return parse_prometheus(text, names)


def acceptance_since(before: ServeSample | None, now: ServeSample) -> float | None:
    """The mean acceptance length `serve status`, `serve bench` and the smoke test show: between the two readings
    (since the engine, or the collector, started without `before`)."""
    return acceptance_length(before, now)
