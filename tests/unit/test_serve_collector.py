"""sparkctl's figures collector (templates/serve-collector.py) run for real, against a fake trtllm-serve whose
/metrics is a queue each read empties (as the real one's and the lab stand-in's): cumulative counters, every reader
seeing the same totals, the engine gone and back, and the text read by sparkctl's own parser."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from sparkctl.knowledge.metric_names import TRTLLM_COLLECTED
from sparkctl.knowledge.serve_metrics import acceptance_since, parse_prometheus
from sparkctl.plan.collector import SCRIPT_NAME
from sparkctl.shipped import templates_dir


def iteration(gen: int = 1, per_step: float = 2.5, ctx: int = 0, used: int = 10, waiting: int = 2) -> dict:
    """One IterationStats as trtllm-serve's /metrics lists it (executor/types.h, its JSON keys)."""
    return {"numActiveRequests": gen, "numQueuedRequests": waiting,
            "kvCacheStats": {"usedNumBlocks": used, "maxNumBlocks": 100},
            "inflightBatchingStats": {"numCtxTokens": ctx, "numGenRequests": gen,
                                      "avgNumDecodedTokensPerIter": per_step},
            "specDecodingStats": {"numDraftTokens": 3 * gen, "numAcceptedTokens": (per_step - 1) * gen,
                                  "numRequestsWithDraftTokens": gen, "acceptanceLength": per_step}}


class DrainedEngine:
    """/metrics answers the iterations queued since the last read, and empties the queue."""

    def __init__(self):
        self.queue: list[dict] = []
        self.lock = threading.Lock()
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_GET(self):
                with owner.lock:
                    stats, owner.queue = owner.queue, []
                data = json.dumps(stats).encode()
                self.send_response(200)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/metrics"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def push(self, *iterations: dict) -> None:
        with self.lock:
            self.queue.extend(iterations)

    def close(self):
        self.server.shutdown()
        self.server.server_close()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def engine():
    fake = DrainedEngine()
    yield fake
    fake.close()


@pytest.fixture
def collector(engine):
    port = free_port()
    proc = subprocess.Popen([sys.executable, str(templates_dir() / SCRIPT_NAME), "--engine", engine.url,
                             "--listen", f"127.0.0.1:{port}", "--interval", "0.2"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    url = f"http://127.0.0.1:{port}/metrics"
    deadline = time.monotonic() + 20
    while True:
        try:
            urllib.request.urlopen(url, timeout=2).read()
            break
        except OSError:
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "the collector did not answer"
            time.sleep(0.1)
    yield url
    proc.terminate()
    proc.wait(timeout=10)


def scrape(url: str) -> str:
    return urllib.request.urlopen(url, timeout=5).read().decode()


def test_what_the_queue_held_becomes_cumulative_counters_every_reader_shares(engine, collector):
    engine.push(iteration(ctx=120), *[iteration(gen=2) for _ in range(9)], iteration(gen=2, used=25))
    first = parse_prometheus(scrape(collector), TRTLLM_COLLECTED)
    assert first.prompt_tokens == 120.0
    assert first.generation_tokens == pytest.approx(2.5 + 10 * 2 * 2.5)
    assert (first.running, first.waiting, first.kv_cache_fraction) == (2.0, 2.0, 0.25)
    # acceptance as vLLM's counters give it: 1 + accepted / speculative steps
    assert acceptance_since(None, first) == 2.5
    # the queue is empty now; more iterations add to the totals, they do not replace them
    engine.push(iteration(per_step=4.0, used=30))
    second = parse_prometheus(scrape(collector), TRTLLM_COLLECTED)
    assert second.generation_tokens == pytest.approx(first.generation_tokens + 4.0)
    assert acceptance_since(first, second) == 4.0
    # three readers at one moment: the same cumulative totals (a drain is one at a time; each scrape is current)
    engine.push(*[iteration() for _ in range(50)])
    with ThreadPoolExecutor(3) as pool:
        readings = [parse_prometheus(t, TRTLLM_COLLECTED) for t in pool.map(scrape, [collector] * 3)]
    assert {r.generation_tokens for r in readings} == {second.generation_tokens + 50 * 2.5}


def test_the_collector_drains_on_its_own_and_nothing_running_reads_as_idle(engine, collector):
    engine.push(*[iteration(gen=3) for _ in range(4)])
    time.sleep(0.8)  # the collector's own drains (every 0.2 s here) empty the queue before anyone scrapes
    assert engine.queue == []
    text = scrape(collector)
    idle = parse_prometheus(text, TRTLLM_COLLECTED)
    assert idle.generation_tokens == pytest.approx(4 * 3 * 2.5)
    assert (idle.running, idle.waiting) == (0.0, 0.0)  # no iteration since: nothing is running
    assert "sparkctl_collector_engine_up 1.0" in text


def test_an_engine_gone_keeps_the_totals_and_says_so(engine, collector):
    engine.push(iteration(gen=2))
    before = parse_prometheus(scrape(collector), TRTLLM_COLLECTED)
    engine.close()
    text = scrape(collector)
    assert "sparkctl_collector_engine_up 0.0" in text
    errors = next(line for line in text.splitlines() if line.startswith("sparkctl_collector_engine_read_errors_total"))
    assert float(errors.split()[-1]) >= 1
    assert parse_prometheus(text, TRTLLM_COLLECTED).generation_tokens == before.generation_tokens
