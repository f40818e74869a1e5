"""sparkctl's figures collector for trtllm-serve, on the head (docs/top.md, "One reader of the engine's figures").

trtllm-serve's /metrics is a queue: each read returns the iteration stats recorded since the read before and empties
it (with `enable_iter_perf_stats`; TensorRT-LLM tensorrt_llm/serve/openai_server.py, IterationStats as
cpp/include/tensorrt_llm/executor/types.h serialises them). Two readers would each see part of the truth. This is the
one reader: it drains the queue every --interval seconds, and again at every scrape, and keeps what it drained as
cumulative Prometheus counters (tokens, speculative drafts and acceptances, iterations) beside the last iteration's
gauges (requests running and waiting, KV-cache use). `top`, `serve status`, `serve bench`, the smoke test and any
Prometheus read these, through the gateway, with the key.

Runs in its own container from the cluster's engine image (host network, `--restart unless-stopped`), with the
image's python3 and prometheus_client (a TensorRT-LLM requirement, requirements.txt); prometheus_client serves the
text (a custom collector, as its docs write exporters). It listens on the head's loopback only: the gateway fronts it.
Nothing of sparkctl is imported here.

    python3 serve-collector.py --engine http://127.0.0.1:18355/metrics --listen 127.0.0.1:18356 [--interval 1]
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading
import time
import urllib.request

from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

PREFIX = "sparkctl_trtllm_"
#: counter -> (what it counts, how one iteration adds to it)
COUNTERS = {
    "prompt_tokens": ("context (prompt) tokens processed",
                      lambda it: _num(_of(it, "inflightBatchingStats", "numCtxTokens"))),
    "generation_tokens": ("tokens generated: generation requests x tokens decoded per request in each iteration",
                          lambda it: _num(_of(it, "inflightBatchingStats", "numGenRequests"))
                          * _num(_of(it, "inflightBatchingStats", "avgNumDecodedTokensPerIter"))),
    "spec_decode_num_draft_tokens": ("draft tokens proposed",
                                     lambda it: _num(_of(it, "specDecodingStats", "numDraftTokens"))),
    "spec_decode_num_accepted_tokens": ("draft tokens accepted",
                                        lambda it: _num(_of(it, "specDecodingStats", "numAcceptedTokens"))),
    "spec_decode_num_drafts": ("speculative steps: requests with draft tokens, per iteration",
                               lambda it: _num(_of(it, "specDecodingStats", "numRequestsWithDraftTokens"))),
    "iterations": ("iterations the engine reported", lambda it: 1.0),
}


def _of(iteration: dict, section: str, key: str) -> object:
    part = iteration.get(section)
    return part.get(key) if isinstance(part, dict) else None


def _num(value: object) -> float:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else 0.0


class Figures:
    """What the drains add up to, read by every scrape; one drain at a time."""

    def __init__(self, engine_url: str, timeout: float = 5.0):
        self.engine_url, self.timeout = engine_url, timeout
        self.lock = threading.Lock()
        self.totals = dict.fromkeys(COUNTERS, 0.0)
        self.running = self.waiting = 0.0
        self.kv_cache = None
        self.reads = self.errors = 0.0
        self.last_read = 0.0
        self.up = 0.0

    def drain(self) -> None:
        with self.lock:
            try:
                with urllib.request.urlopen(self.engine_url, timeout=self.timeout) as answer:
                    stats = json.loads(answer.read() or b"[]")
            except (OSError, ValueError):
                self.errors += 1
                self.up = 0.0
                return
            iterations = [s for s in stats if isinstance(s, dict)] if isinstance(stats, list) else []
            for iteration in iterations:
                for name, (_, adds) in COUNTERS.items():
                    self.totals[name] += adds(iteration)
            # no iteration since the last read: nothing ran, so nothing is running
            last = iterations[-1] if iterations else {}
            self.running = _num(last.get("numActiveRequests"))
            self.waiting = _num(last.get("numQueuedRequests"))
            blocks = _num(_of(last, "kvCacheStats", "maxNumBlocks"))
            if iterations:
                self.kv_cache = _num(_of(last, "kvCacheStats", "usedNumBlocks")) / blocks if blocks else None
            self.reads += 1
            self.up = 1.0
            self.last_read = time.time()

    def collect(self):
        """prometheus_client's custom-collector hook: a scrape drains the engine first, so it is current."""
        self.drain()
        with self.lock:
            for name, (doc, _) in COUNTERS.items():
                yield CounterMetricFamily(PREFIX + name, doc, value=self.totals[name])
            yield GaugeMetricFamily(PREFIX + "num_requests_running", "requests running at the last iteration",
                                    value=self.running)
            yield GaugeMetricFamily(PREFIX + "num_requests_waiting", "requests queued at the last iteration",
                                    value=self.waiting)
            if self.kv_cache is not None:
                yield GaugeMetricFamily(PREFIX + "kv_cache_usage_perc", "KV-cache blocks in use, 0-1",
                                        value=self.kv_cache)
            yield CounterMetricFamily("sparkctl_collector_engine_reads", "drains of the engine's /metrics",
                                      value=self.reads)
            yield CounterMetricFamily("sparkctl_collector_engine_read_errors", "drains the engine did not answer",
                                      value=self.errors)
            yield GaugeMetricFamily("sparkctl_collector_engine_up", "1 when the last drain was answered",
                                    value=self.up)
            yield GaugeMetricFamily("sparkctl_collector_last_read_timestamp_seconds",
                                    "when the engine last answered a drain (Unix time)", value=self.last_read)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--engine", required=True, help="the engine's /metrics URL (on the head's loopback)")
    parser.add_argument("--listen", required=True, metavar="HOST:PORT")
    parser.add_argument("--interval", type=float, default=1.0, help="seconds between drains (scrapes drain too)")
    args = parser.parse_args(argv)
    # PID 1 of its container: without a handler the kernel ignores SIGTERM there, and `docker stop` waits 10 s
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    host, _, port = args.listen.rpartition(":")
    figures = Figures(args.engine)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(figures)
    start_http_server(int(port), addr=host, registry=registry)
    while True:
        figures.drain()
        time.sleep(args.interval)


if __name__ == "__main__":
    main()
