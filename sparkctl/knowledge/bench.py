"""`serve bench`: streamed requests at several concurrencies; decode tokens/s, TTFT, acceptance length.

The statistics are pure functions of the per-request measurements, so they are tested without a server.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass

from sparkctl.knowledge.metric_names import PrometheusNames
from sparkctl.knowledge.serve_client import Completion, EndpointError, ServeClient
from sparkctl.knowledge.serve_metrics import ServeSample, acceptance_since, metrics_reading

PROMPTS = (
    "Explain in a few sentences why tensor parallelism helps serve a model too large for one GPU.",
    "Write a short story about two small computers that learn to work together.",
    "List the steps to set up a network between two machines connected by one cable.",
    "Describe speculative decoding to a new engineer in plain words.",
)


def percentile(values: Sequence[float], p: float) -> float | None:
    """Linear interpolation between closest ranks (numpy's default); None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    if len(ordered) == 1:
        return ordered[0]
    rank = (len(ordered) - 1) * p / 100.0
    low, high = math.floor(rank), math.ceil(rank)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def mean(values: Sequence[float]) -> float | None:
    return sum(values) / len(values) if values else None


@dataclass
class LevelStats:
    concurrency: int
    requests: int
    failed: int
    seconds: float
    completion_tokens: int
    decode_tps_per_request: float | None  # mean over requests
    aggregate_tps: float | None  # all completion tokens over the wall time of the level
    ttft_p50: float | None
    ttft_p95: float | None
    acceptance_length: float | None

    def as_dict(self) -> dict:
        return {k: (round(v, 4) if isinstance(v, float) else v) for k, v in asdict(self).items()}


def level_stats(concurrency: int, results: Sequence[Completion | None], seconds: float,
                server_acceptance: float | None = None) -> LevelStats:
    """Statistics of one concurrency level; None entries are failed requests."""
    done = [r for r in results if r is not None]
    tokens = sum(r.completion_tokens or len(r.token_times) for r in done)
    decode = [t for r in done if (t := r.decode_tokens_per_s) is not None]
    ttfts = [r.ttft for r in done if r.ttft is not None]
    accepted = [r.acceptance_length for r in done if r.acceptance_length is not None]
    return LevelStats(
        concurrency=concurrency, requests=len(results), failed=len(results) - len(done), seconds=seconds,
        completion_tokens=tokens, decode_tps_per_request=mean(decode),
        aggregate_tps=tokens / seconds if seconds > 0 and tokens else None,
        ttft_p50=percentile(ttfts, 50), ttft_p95=percentile(ttfts, 95),
        acceptance_length=server_acceptance if server_acceptance is not None else mean(accepted))


def run_level(client: ServeClient, concurrency: int, requests: int, max_tokens: int,
              prompts: Sequence[str] = PROMPTS, metrics: PrometheusNames | None = None) -> LevelStats:
    """`metrics`: the names of what /metrics answers through the gateway (None: acceptance from the replies)."""
    def one(i: int) -> Completion | None:
        try:
            return client.stream_chat(prompts[i % len(prompts)], max_tokens=max_tokens)
        except EndpointError:
            return None

    def reading() -> ServeSample | None:
        if metrics is None:
            return None
        with contextlib.suppress(EndpointError):
            return metrics_reading(client.metrics_text(), metrics)
        return None

    # the counters before and after the level (the collector's, for an engine whose own /metrics a read empties)
    before = reading()
    started = time.monotonic()
    with ThreadPoolExecutor(max_workers=concurrency) as pool:
        results = list(pool.map(one, range(requests)))
    seconds = time.monotonic() - started
    after = reading()
    server_acceptance = acceptance_since(before, after) if after is not None else None
    return level_stats(concurrency, results, seconds, server_acceptance)


def run_bench(client: ServeClient, concurrencies: Sequence[int], requests: int, max_tokens: int,
              on_level: Callable[[LevelStats], None] | None = None,
              metrics: PrometheusNames | None = None) -> list[LevelStats]:
    out = []
    for concurrency in concurrencies:
        stats = run_level(client, concurrency, max(requests, concurrency), max_tokens, metrics=metrics)
        out.append(stats)
        if on_level:
            on_level(stats)
    return out


def parse_concurrency(text: str) -> list[int]:
    """`1,4,8` -> [1, 4, 8]; ValueError on anything else."""
    values = [int(v) for v in text.split(",") if v.strip()]
    if not values or any(v < 1 or v > 1024 for v in values):
        raise ValueError("concurrency levels are integers from 1 to 1024, comma separated (e.g. 1,4,8)")
    return values
