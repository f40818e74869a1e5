"""A tiny OpenAI-style endpoint on loopback for client and task tests (real HTTP, real sockets). Its /metrics answers
as the gateway's does for TensorRT-LLM: the collector's cumulative counters (templates/serve-collector.py), each
completion one speculative step accepting `acceptance - 1` draft tokens."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class FakeEndpoint:
    def __init__(self, reply: str = "hello from the sparks", health: int = 200, acceptance: float = 2.5):
        self.reply, self.health, self.acceptance = reply, health, acceptance
        self.health_delay = 0.0  # seconds /health takes to answer (a loaded server)
        self.requests: list[dict] = []
        self.drafts = self.accepted = 0.0
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def _json(self, status, payload):
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self):
                path = self.path.split("?", 1)[0]  # a query string is no part of the route, as for the engines
                if path == "/health":
                    time.sleep(owner.health_delay)
                    self.send_response(owner.health)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                elif path == "/v1/models":
                    self._json(200, {"data": [{"id": "nvidia/Qwen3-235B-A22B-FP4"}]})
                elif path == "/metrics":
                    counters = (("spec_decode_num_drafts", owner.drafts),
                                ("spec_decode_num_accepted_tokens", owner.accepted))
                    text = "".join(f"# TYPE sparkctl_trtllm_{name}_total counter\nsparkctl_trtllm_{name}_total "
                                   f"{value}\n" for name, value in counters)
                    data = text.encode()
                    self.send_response(200)
                    self.send_header("Content-Type", "text/plain; version=0.0.4")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                else:
                    self._json(404, {"message": "Not Found"})

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                owner.requests.append(body)
                owner.drafts += 1
                owner.accepted += owner.acceptance - 1
                words = owner.reply.split(" ")
                if not body.get("stream"):
                    choice = {"message": {"content": owner.reply}, "finish_reason": "length",
                              "avg_decoded_tokens_per_iter": owner.acceptance}
                    return self._json(200, {"choices": [choice], "usage": {"completion_tokens": len(words)}})
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.end_headers()
                for i, word in enumerate(words):
                    piece = word if i == 0 else " " + word
                    chunk = {"choices": [{"delta": {"content": piece}, "finish_reason": None}]}
                    self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
                last = {"choices": [{"delta": {}, "finish_reason": "length",
                                     "avg_decoded_tokens_per_iter": owner.acceptance}]}
                self.wfile.write(f"data: {json.dumps(last)}\n\ndata: [DONE]\n\n".encode())

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()
