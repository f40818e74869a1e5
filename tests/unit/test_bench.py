"""Bench statistics from per-request measurements (no server)."""

from __future__ import annotations

import pytest

from sparkctl.knowledge.bench import level_stats, parse_concurrency, percentile
from sparkctl.knowledge.serve_client import Completion


def test_percentile_interpolates_like_numpy():
    assert percentile([], 50) is None
    assert percentile([3.0], 95) == 3.0
    assert percentile([1, 2, 3, 4], 50) == 2.5
    assert percentile([1, 2, 3, 4, 5, 6, 7, 8, 9, 10], 95) == pytest.approx(9.55)


def completion(tokens: int, ttft: float, seconds: float, acceptance: float | None = None) -> Completion:
    return Completion(text="x", completion_tokens=tokens, ttft=ttft, seconds=seconds, acceptance_length=acceptance)


def test_level_stats_per_request_and_aggregate():
    results = [completion(11, 0.1, 1.1, 2.0), completion(21, 0.2, 2.2, 3.0), None]
    s = level_stats(2, results, seconds=2.5)
    assert (s.requests, s.failed, s.completion_tokens) == (3, 1, 32)
    assert s.decode_tps_per_request == pytest.approx(10.0)  # (11-1)/1.0 and (21-1)/2.0
    assert s.aggregate_tps == pytest.approx(32 / 2.5)
    assert s.ttft_p50 == pytest.approx(0.15) and s.ttft_p95 == pytest.approx(0.195)
    assert s.acceptance_length == pytest.approx(2.5)
    assert level_stats(2, results, 2.5, server_acceptance=1.8).acceptance_length == 1.8
    assert level_stats(1, [None], 1.0).aggregate_tps is None


def test_parse_concurrency():
    assert parse_concurrency("1,4,8") == [1, 4, 8]
    for bad in ("", "0", "a", "1,-2"):
        with pytest.raises(ValueError):
            parse_concurrency(bad)
