"""sparkctl's watchdog of a serving world (templates/serve-watchdog.py) run for real beside a stand-in "world" (a
sleeping process), against a fake engine on loopback whose figures and canary answers the test sets: a frozen
counter with requests running, an unanswered canary while idle, a world that ends by itself first."""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from sparkctl.knowledge.metric_names import VLLM
from sparkctl.plan.watchdog import SCRIPT_NAME
from sparkctl.shipped import templates_dir


class Engine:
    def __init__(self):
        self.running, self.tokens = 0.0, 0.0
        self.canary_hangs = False
        self.canaries = 0
        self.health = 200
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def _send(self, body: bytes, kind: str = "text/plain"):
                self.send_response(200)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self):
                if self.path == "/health":
                    self.send_response(owner.health)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                self._send((f"# TYPE {VLLM.running} gauge\n{VLLM.running}{{engine=\"0\"}} {owner.running}\n"
                            f"# TYPE {VLLM.generation_tokens}_total counter\n"
                            f"{VLLM.generation_tokens}_total{{engine=\"0\"}} {owner.tokens}\n").encode())

            def do_POST(self):
                self.rfile.read(int(self.headers["Content-Length"]))
                owner.canaries += 1
                if owner.canary_hangs:
                    time.sleep(10)
                # the watchdog may have stopped waiting: that is the point
                with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                    self._send(json.dumps({"choices": [{"message": {"content": "pong"}}]}).encode(),
                               "application/json")

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def engine():
    fake = Engine()
    yield fake
    fake.close()


def watchdog(engine: Engine, world: subprocess.Popen, evidence, stall_s: float = 4, canary_s: float = 3,
             deadline_s: float = 2, stopping=None) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, str(templates_dir() / SCRIPT_NAME), "--pid", str(world.pid),
                             "--metrics", f"{engine.url}/metrics", "--running", VLLM.running,
                             "--tokens", VLLM.generation_tokens, "--engine", engine.url, "--model", "m",
                             "--stall-s", str(stall_s), "--canary-s", str(canary_s),
                             "--canary-deadline-s", str(deadline_s), "--stop-wait", "2", "--poll-s", "0.3",
                             "--evidence", str(evidence), *(["--stopping", str(stopping)] if stopping else [])],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


@pytest.fixture
def world():
    proc = subprocess.Popen(["sleep", "300"])
    yield proc
    proc.kill()
    proc.wait()


def test_requests_running_and_a_counter_that_stopped_end_the_world_with_what_was_seen(engine, world, tmp_path):
    evidence = tmp_path / "stuck.json"
    engine.running, engine.tokens = 2, 100
    dog = watchdog(engine, world, evidence, stall_s=2, canary_s=1000)
    for _ in range(6):  # tokens coming: the world is fine, however long it runs
        time.sleep(0.8)
        engine.tokens += 25
    assert dog.poll() is None and world.poll() is None
    out, err = dog.communicate(timeout=30)  # then the counter stops
    assert world.wait(timeout=10) == -15  # TERM
    seen = json.loads(evidence.read_text())
    assert seen["reason"].startswith("no token for ") and seen["reason"].endswith("s with 2 requests running")
    assert seen["running"] == 2 and seen["generated_tokens"] == 250 and seen["last_token_at"] <= seen["stuck_at"]
    assert "gpu_power_w" in seen and "the world is stuck" in out
    assert engine.canaries == 0  # never a canary while the engine is busy


def test_an_idle_engine_whose_canary_gets_no_token_is_stuck_and_one_that_answers_is_not(engine, world, tmp_path):
    evidence = tmp_path / "stuck.json"
    dog = watchdog(engine, world, evidence, canary_s=1, deadline_s=1)
    time.sleep(3)
    assert dog.poll() is None and engine.canaries >= 1 and not evidence.exists()  # it answered
    engine.canary_hangs = True
    dog.communicate(timeout=30)
    assert world.wait(timeout=10) == -15
    assert json.loads(evidence.read_text())["reason"].startswith("a one-token canary completion got no answer within "
                                                                 "1s")


def test_a_world_asked_to_stop_is_not_judged_stuck(engine, world, tmp_path):
    """serve.launch marks the world as stopping before it stops it: a canary that meets the stopping engine is no
    evidence, and the watchdog leaves the ending to whoever asked for it."""
    evidence, stopping = tmp_path / "stuck.json", tmp_path / "stopping"
    stopping.touch()
    engine.canary_hangs = True
    dog = watchdog(engine, world, evidence, canary_s=1, deadline_s=1, stopping=stopping)
    dog.communicate(timeout=30)
    assert not evidence.exists() and world.poll() is None


def test_an_engine_not_serving_yet_is_not_judged_and_its_clocks_start_when_it_serves(engine, world, tmp_path):
    """Loading (/health 503) with figures that answer (a collector answers before the engine does) and a canary
    that would fail: nothing is judged; once /health says 200, the canary's clock starts from then."""
    evidence = tmp_path / "stuck.json"
    engine.health, engine.canary_hangs = 503, True
    dog = watchdog(engine, world, evidence, canary_s=1, deadline_s=1)
    time.sleep(3)
    assert dog.poll() is None and engine.canaries == 0 and not evidence.exists()
    engine.health = 200
    dog.communicate(timeout=30)
    assert evidence.exists() and engine.canaries == 1


def test_nothing_is_judged_before_the_engine_answers_and_a_world_gone_ends_the_watchdog(world, tmp_path):
    evidence = tmp_path / "stuck.json"
    silent = Engine()
    silent.close()  # a model still loading: nothing answers
    dog = watchdog(silent, world, evidence, stall_s=1, canary_s=1, deadline_s=1)
    time.sleep(3)
    assert dog.poll() is None and world.poll() is None and not evidence.exists()
    world.kill()
    world.wait()
    assert dog.wait(timeout=10) == 0 and not evidence.exists()


def test_a_world_that_ends_under_its_canary_is_not_judged_stuck(engine, world, tmp_path):
    """The canary meets an engine that is going away (a rank died: its connection closes, then /health stops
    answering): that world ended by itself, which the unit sees; it is no wedge."""
    evidence = tmp_path / "stuck.json"
    engine.canary_hangs = True

    def going_away():
        while engine.canaries == 0:
            time.sleep(0.05)
        engine.health = 503
        time.sleep(0.5)
        world.kill()
        world.wait()  # reaped, as the world's parent reaps it

    threading.Thread(target=going_away, daemon=True).start()
    dog = watchdog(engine, world, evidence, canary_s=1, deadline_s=1)
    assert dog.wait(timeout=30) == 0 and not evidence.exists()
