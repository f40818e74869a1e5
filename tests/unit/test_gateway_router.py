"""The gateway's router on this machine's real NGINX and njs (Debian's nginx and libnginx-mod-http-js, installed by
scripts/test): a request's `model` picks its model's world, by name or alias; replicas share the load; an unknown
name gets an OpenAI-style 404 naming the models served; the body reaches the engine whole and without the key;
streams pass through as they are written."""

from __future__ import annotations

import http.client
import json
import socket
import subprocess
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from sparkctl.plan.gateway import CONFIG_DIR_IN_CONTAINER, ROUTER_NAME, GatewayModel, GatewaySpec

KEY = "k" * 32
NGINX = "/usr/sbin/nginx"
pytestmark = pytest.mark.skipif(not Path(NGINX).exists() or not Path("/usr/lib/nginx/modules/ngx_http_js_module.so")
                                .exists(), reason="nginx and its njs module are installed by scripts/test")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class _Engine(BaseHTTPRequestHandler):
    """What an engine saw: its port, the model asked, the body's size and the Authorization header."""

    protocol_version = "HTTP/1.1"

    def do_GET(self):  # noqa: N802 (http.server's name)
        if self.path == "/v1/models":
            # an engine that lists its first name only: the gateway's own card stands for the others
            self._answer({"object": "list", "data": [{"id": self.server.names[0], "object": "model",
                                                      "owned_by": "vllm", "max_model_len": 4096,
                                                      "authorization": self.headers.get("Authorization")}]})
            return
        self._answer({"port": self.server.server_port, "path": self.path})

    def do_POST(self):  # noqa: N802
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if body.get("stream"):
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            self._chunk(b"data: first\n\n")
            # the second part is written only once the client has read the first through the gateway
            assert self.server.go_on.wait(30)
            self._chunk(b"data: [DONE]\n\n")
            self.wfile.write(b"0\r\n\r\n")
            return
        if body.get("hold"):
            time.sleep(body["hold"])
        self._answer({"port": self.server.server_port, "model": body.get("model"), "size": len(body.get("p", "")),
                      "authorization": self.headers.get("Authorization")})

    def _chunk(self, data: bytes) -> None:
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        self.wfile.flush()

    def _answer(self, obj: dict) -> None:
        data = json.dumps(obj).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def gateway(tmp_path_factory):
    folder = tmp_path_factory.mktemp("gateway")
    engines = []
    for _ in range(3):
        server = ThreadingHTTPServer(("127.0.0.1", 0), _Engine)
        server.go_on = threading.Event()
        threading.Thread(target=server.serve_forever, daemon=True).start()
        engines.append(server)
    big, small_a, small_b = (e.server_port for e in engines)
    for engine, names in zip(engines, (("qwen3-235b", "big"), ("gpt-oss",), ("gpt-oss",)), strict=True):
        engine.names = names
    port = _free_port()
    spec = GatewaySpec(cluster="lab", image="nginx", listen=(), port=port, engine_port=big, config_dir=str(folder),
                       authenticated=True, models=(
                           GatewayModel(("qwen3-235b", "big"), (("127.0.0.1", big),)),
                           GatewayModel(("gpt-oss",), (("127.0.0.1", small_a), ("127.0.0.1", small_b)))),
                       engine="vllm")
    config = spec.config(KEY).replace(f"{CONFIG_DIR_IN_CONTAINER}/{ROUTER_NAME}", str(folder / ROUTER_NAME))
    config = config.replace("/tmp/sparkctl-gateway", str(folder / "run"))
    (folder / "nginx.conf").write_text(config)
    (folder / ROUTER_NAME).write_text(spec.router())
    nginx = subprocess.Popen([NGINX, "-c", str(folder / "nginx.conf"), "-e", "stderr", "-g", "daemon off;"],
                             stderr=subprocess.PIPE, text=True)
    try:
        _wait_listening(port, nginx)
        yield {"port": port, "engines": engines}
    finally:
        nginx.terminate()
        nginx.wait(30)
        for engine in engines:
            engine.shutdown()


def _wait_listening(port: int, nginx: subprocess.Popen) -> None:
    for _ in range(300):
        if nginx.poll() is not None:
            raise AssertionError(f"nginx ended: {nginx.stderr.read() if nginx.stderr else ''}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.05)
    raise AssertionError(f"nginx does not listen on {port}")


def _post(port: int, body: dict, key: str | None = KEY) -> tuple[int, dict]:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    headers = {"Content-Type": "application/json", **({"Authorization": f"Bearer {key}"} if key else {})}
    connection.request("POST", "/v1/chat/completions", json.dumps(body), headers)
    response = connection.getresponse()
    return response.status, json.loads(response.read())


def test_a_request_goes_to_the_world_of_the_model_it_names_by_name_or_alias(gateway):
    port, (big, small_a, small_b) = gateway["port"], gateway["engines"]
    for name in ("qwen3-235b", "big"):
        status, seen = _post(port, {"model": name, "messages": []})
        assert status == 200 and seen["port"] == big.server_port and seen["model"] == name
        # the key ends at the gateway
        assert seen["authorization"] is None
    status, seen = _post(port, {"model": "gpt-oss", "p": "x" * 3_000_000})
    assert status == 200 and seen["port"] in (small_a.server_port, small_b.server_port)
    assert seen["size"] == 3_000_000  # the body the router read is the body the engine gets


def test_replicas_of_a_model_both_receive_requests_under_load(gateway):
    port, (_, small_a, small_b) = gateway["port"], gateway["engines"]
    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(lambda _: _post(port, {"model": "gpt-oss", "hold": 0.2}), range(16)))
    ports = [seen["port"] for status, seen in answers if status == 200]
    assert len(ports) == 16 and {small_a.server_port, small_b.server_port} == set(ports)


def test_an_unknown_model_gets_an_openai_404_naming_the_models_served(gateway):
    status, answer = _post(gateway["port"], {"model": "llama"})
    assert status == 404
    assert answer["error"]["code"] == "model_not_found" and answer["error"]["param"] == "model"
    assert answer["error"]["message"] == ("The model `llama` does not exist here: served are qwen3-235b, big, "
                                          "gpt-oss")
    # the key is checked before any model is read
    assert _post(gateway["port"], {"model": "llama"}, key=None)[0] == 401


def test_a_request_that_names_no_model_goes_to_the_first(gateway):
    port, big = gateway["port"], gateway["engines"][0]
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    connection.request("GET", "/v1/completions/ping", headers={"Authorization": f"Bearer {KEY}"})
    assert json.loads(connection.getresponse().read()) == {"port": big.server_port, "path": "/v1/completions/ping"}
    assert _post(port, {"messages": []})[1]["port"] == big.server_port


def test_the_models_list_names_every_model_served_with_its_owner(gateway):
    """GET /v1/models: each model's own card where its world lists it (the engine's fields kept, the key never sent
    on), a card of the gateway's for a name no world listed (an alias), in the order served."""
    connection = http.client.HTTPConnection("127.0.0.1", gateway["port"], timeout=30)
    connection.request("GET", "/v1/models", headers={"Authorization": f"Bearer {KEY}"})
    response = connection.getresponse()
    assert response.status == 200 and response.getheader("Content-Type") == "application/json"
    listed = json.loads(response.read())
    assert listed == {"object": "list", "data": [
        {"id": "qwen3-235b", "object": "model", "owned_by": "vllm", "max_model_len": 4096, "authorization": None},
        {"id": "big", "object": "model", "created": 0, "owned_by": "vllm"},
        {"id": "gpt-oss", "object": "model", "owned_by": "vllm", "max_model_len": 4096, "authorization": None}]}
    # without the key, nothing is listed
    connection.request("GET", "/v1/models")
    assert connection.getresponse().status == 401


def test_a_stream_passes_through_as_it_is_written(gateway):
    port, big = gateway["port"], gateway["engines"][0]
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    connection.request("POST", "/v1/chat/completions", json.dumps({"model": "big", "stream": True}),
                       {"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"})
    response = connection.getresponse()
    assert response.status == 200
    # the engine holds the rest until this first event has come through: a buffering gateway would never pass it
    assert response.readline() == b"data: first\n"
    big.go_on.set()
    assert b"data: [DONE]" in response.read()



def _get(port: int, path: str, key: str | None = KEY) -> tuple[int, dict]:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    connection.request("GET", path, headers={"Authorization": f"Bearer {key}"} if key else {})
    response = connection.getresponse()
    return response.status, json.loads(response.read())


def test_each_model_s_figures_are_read_by_its_name(gateway):
    """`/metrics?model=NAME` (percent-encoded, by name or alias) is that model's first world's /metrics, with the
    key; without one, the first model's; an unknown name gets the 404 naming the models served."""
    port, (big, small_a, _small_b) = gateway["port"], gateway["engines"]
    for path, engine in (("/metrics", big), ("/metrics?model=big", big), ("/metrics?model=qwen3%2D235b", big),
                         ("/metrics?model=gpt-oss", small_a)):
        status, seen = _get(port, path)
        assert status == 200 and seen["port"] == engine.server_port and seen["path"].startswith("/metrics"), path
    status, answer = _get(port, "/metrics?model=nope%2Fmodel")
    assert status == 404 and answer["error"]["code"] == "model_not_found", answer
    assert answer["error"]["message"].startswith("The model `nope/model` does not exist here: served are ")
    assert _get(port, "/metrics?model=big", key="wrong")[0] == 401
