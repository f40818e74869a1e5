"""A small client for the OpenAI-compatible endpoint trtllm-serve exposes (stdlib only).

/health, /v1/models, /version, /metrics (Prometheus text: the engine's, or the figures collector's through the
gateway for TensorRT-LLM), chat completions plain and streamed (server-sent events). Eagle3 endpoints decode
greedily whatever sampling is asked for.

The transport is pluggable (`Fetch`): straight HTTP from this machine, or `NodeFetch`, a tiny python3 client run
inside the head's container over the SSH connection (the endpoint need not be routable from the controller).
"""

from __future__ import annotations

import base64
import http.client
import json
import shlex
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol
from urllib.parse import urlsplit


class EndpointError(Exception):
    """The endpoint could not be reached or answered with an error."""


@dataclass
class Completion:
    text: str
    #: tokens per decoding step (Eagle3 acceptance length), when the server reports it
    acceptance_length: float | None = None
    completion_tokens: int | None = None
    finish_reason: str | None = None
    seconds: float = 0.0
    #: time to the first streamed token (streaming only)
    ttft: float | None = None
    token_times: list[float] = field(default_factory=list, repr=False)

    @property
    def decode_tokens_per_s(self) -> float | None:
        """Tokens after the first over the time after the first (what speculative decoding speeds up)."""
        tokens = self.completion_tokens or len(self.token_times)
        if self.ttft is None or tokens < 2 or self.seconds <= self.ttft:
            return None
        return (tokens - 1) / (self.seconds - self.ttft)


def endpoint_url(host: str, port: int) -> str:
    return f"http://{host}:{int(port)}" if ":" not in host else f"http://[{host}]:{int(port)}"


class Fetch(Protocol):
    """How a request reaches the server: `(method, path, body, timeout) -> (status, body)`.

    Raises EndpointError when nothing answers. `where` names the endpoint in messages."""

    where: str

    def __call__(self, method: str, path: str, body: bytes | None, timeout: float) -> tuple[int, bytes]: ...

    def batch(self, requests: list[Request]) -> list[tuple[int, bytes, float]]:
        """Several requests in order, in one go where the fetch can: (status, body, seconds) each."""
        ...


class HttpFetch:
    """Straight from this machine over HTTP (the endpoint must be routable from here)."""

    def __init__(self, base_url: str, api_key: str | None = None):
        parts = urlsplit(base_url)
        if parts.scheme != "http" or not parts.hostname:
            raise ValueError(f"not an http:// endpoint: {base_url}")
        self.where = base_url.rstrip("/")
        self.host, self.port = parts.hostname, parts.port or 80
        self.auth = bearer(api_key)

    def headers(self, body: bool, **more: str) -> dict[str, str]:
        out = {"Content-Type": "application/json"} if body else {}
        if self.auth:
            out["Authorization"] = self.auth
        return {**out, **more}

    def connection(self, timeout: float) -> http.client.HTTPConnection:
        return http.client.HTTPConnection(self.host, self.port, timeout=timeout)

    def __call__(self, method: str, path: str, body: bytes | None, timeout: float) -> tuple[int, bytes]:
        conn = self.connection(timeout)
        try:
            conn.request(method, path, body=body, headers=self.headers(body is not None))
            response = conn.getresponse()
            return response.status, response.read()
        except (OSError, http.client.HTTPException) as exc:
            raise EndpointError(f"{self.where}{path}: {exc}") from exc
        finally:
            conn.close()

    def batch(self, requests: list[Request]) -> list[tuple[int, bytes, float]]:
        out = []
        for method, path, body, timeout in requests:
            started = time.monotonic()
            status, data = self(method, path, body, timeout)
            out.append((status, data, time.monotonic() - started))
        return out


#: The one in-node HTTP client (doctor's probes and the serve tasks both run it inside the head's container,
#: which shares the host's network): argv = method, url, timeout; on stdin (never argv) the Authorization value
#: on the first line (empty: none), then the request body; prints the status (0: nothing answered) on the first
#: line, then the body or the error. No proxy: the server is on the head itself, whatever HTTP_PROXY the image
#: sets.
NODE_HTTP_PY = """\
import sys, urllib.request as u, urllib.error as e
m, url, t = sys.argv[1], sys.argv[2], float(sys.argv[3])
a = sys.stdin.buffer.readline().strip().decode()
data = sys.stdin.buffer.read() if m == "POST" else None
h = {"Content-Type": "application/json"} if data else {}
if a:
    h["Authorization"] = a
try:
    x = u.build_opener(u.ProxyHandler({})).open(u.Request(url, data=data, method=m, headers=h), timeout=t)
    code, body = x.getcode(), x.read()
except e.HTTPError as x:
    code, body = x.code, x.read()
except Exception as x:
    code, body = 0, ("%s: %s" % (type(x).__name__, getattr(x, "reason", x))).encode()
sys.stdout.write("%d\\n" % code)
sys.stdout.flush()
sys.stdout.buffer.write(body)
"""


def node_http_command(method: str, url: str, timeout: float) -> str:
    """The shell words that run NODE_HTTP_PY (feed the body of a POST on its stdin)."""
    return f"python3 -c {shlex.quote(NODE_HTTP_PY)} {shlex.quote(method)} {shlex.quote(url)} {float(timeout):g}"


#: Several requests in one run of python3 in the container (one `docker exec` instead of one each): on stdin a JSON
#: object, {"auth": Authorization value or "", "requests": [[method, url, body or null, timeout], ...]}; one JSON
#: line per request, in order: [status, body (base64) or why nothing answered, seconds it took]. Status 0: nothing
#: answered.
NODE_HTTP_BATCH_PY = """\
import base64, json, sys, time, urllib.request as u, urllib.error as e
o = u.build_opener(u.ProxyHandler({}))
w = json.load(sys.stdin)
for m, url, body, t in w["requests"]:
    data = body.encode() if body is not None else None
    h = {"Content-Type": "application/json"} if data else {}
    if w["auth"]:
        h["Authorization"] = w["auth"]
    s = time.monotonic()
    try:
        x = o.open(u.Request(url, data=data, method=m, headers=h), timeout=t)
        code, out = x.getcode(), base64.b64encode(x.read()).decode()
    except e.HTTPError as x:
        code, out = x.code, base64.b64encode(x.read()).decode()
    except Exception as x:
        code, out = 0, "%s: %s" % (type(x).__name__, getattr(x, "reason", x))
    print(json.dumps([code, out, time.monotonic() - s]), flush=True)
"""

#: One request of a batch: (method, path, body, timeout)
Request = tuple[str, str, bytes | None, float]


def parse_node_http(output: str) -> tuple[int, str]:
    """(status, body) from what NODE_HTTP_PY printed; status 0 when the output is not its."""
    status, _, body = output.partition("\n")
    return (int(status.strip()), body) if status.strip().isdigit() else (0, output.strip())


def bearer(api_key: str | None) -> str:
    """The Authorization header's value for `api_key` ("" for none)."""
    return f"Bearer {api_key}" if api_key else ""


class NodeFetch:
    """From inside a container on a node (the head), over the SSH connection already open: what answers on the
    node itself (the engine on its loopback, the gateway on `host`) whatever the controller can route to.
    `api_key` goes with every request, on stdin."""

    def __init__(self, transport: Any, container: str, port: int, node: str | None = None,
                 host: str = "127.0.0.1", api_key: str | None = None):
        self.transport, self.container, self.port = transport, container, int(port)
        self.node = node or getattr(transport, "node", "the head")
        self.base = endpoint_url(host, self.port)
        self.where = f"{self.base} on {self.node}"
        self.auth = bearer(api_key)

    def __call__(self, method: str, path: str, body: bytes | None, timeout: float) -> tuple[int, bytes]:
        url = f"{self.base}{path}"
        try:
            result = self.transport.exec_in(self.container, node_http_command(method, url, timeout),
                                            timeout=timeout + 15,
                                            input=self.auth + "\n" + (body.decode() if body is not None else ""))
        except Exception as exc:  # noqa: BLE001 - a lost connection is "nothing answered", said clearly
            raise EndpointError(f"{self.where}{path}: {exc}") from exc
        status, text = parse_node_http(result.stdout)
        if not result.ok or not result.stdout.strip()[:1].isdigit():
            why = (result.stderr or result.stdout).strip().splitlines()
            raise EndpointError(f"{self.where}{path}: cannot run python3 in the container {self.container} on "
                                f"{self.node}: {why[-1] if why else f'exit code {result.exit_code}'}")
        if status == 0:
            raise EndpointError(f"{self.where}{path}: {text.strip() or 'no answer'}")
        return status, text.encode()


    def batch(self, requests: list[Request]) -> list[tuple[int, bytes, float]]:
        """The requests in order, in one run of python3 in the container: (status, body, seconds) each."""
        payload = json.dumps({"auth": self.auth, "requests": [
            [m, self.base + path, body.decode() if body is not None else None, t] for m, path, body, t in requests]})
        try:
            result = self.transport.exec_in(self.container, f"python3 -c {shlex.quote(NODE_HTTP_BATCH_PY)}",
                                            timeout=sum(t for *_, t in requests) + 15, input=payload)
        except Exception as exc:  # noqa: BLE001 - a lost connection is "nothing answered", said clearly
            raise EndpointError(f"{self.where}: {exc}") from exc
        lines = [line for line in result.stdout.splitlines() if line.startswith("[")]
        if not result.ok or len(lines) != len(requests):
            why = (result.stderr or result.stdout).strip().splitlines()
            raise EndpointError(f"{self.where}: cannot run python3 in the container {self.container} on "
                                f"{self.node}: {why[-1] if why else f'exit code {result.exit_code}'}")
        out = []
        for (_m, path, _b, _t), line in zip(requests, lines, strict=True):
            status, body, seconds = json.loads(line)
            if status == 0:
                raise EndpointError(f"{self.where}{path}: {body or 'no answer'}")
            out.append((int(status), base64.b64decode(body), float(seconds)))
        return out


class ServeClient:
    def __init__(self, endpoint: str | Fetch, timeout: float = 60.0, model: str | None = None,
                 api_key: str | None = None):
        """`api_key` goes with every request to an http:// endpoint (a Fetch carries its own)."""
        self.fetch: Fetch = HttpFetch(endpoint, api_key) if isinstance(endpoint, str) else endpoint
        self.base_url = self.fetch.where
        self.timeout = timeout
        self.model = model

    @property
    def streams(self) -> bool:
        """Straight HTTP from this machine (streamed pieces, real TTFT); else whole answers through a node."""
        return isinstance(self.fetch, HttpFetch)

    def _request(self, method: str, path: str, body: dict | None = None,
                 timeout: float | None = None) -> tuple[int, bytes]:
        data = json.dumps(body).encode() if body is not None else None
        return self.fetch(method, path, data, timeout or self.timeout)

    def _json(self, method: str, path: str, body: dict | None = None, timeout: float | None = None):
        status, data = self._request(method, path, body, timeout)
        return self._parsed(path, status, data)

    def _parsed(self, path: str, status: int, data: bytes):
        """An answer's JSON, or EndpointError for an HTTP error or a body that is not JSON."""
        if status != 200:
            raise EndpointError(f"{self.base_url}{path}: HTTP {status}: {_error_message(data)}")
        try:
            return json.loads(data or b"null")
        except ValueError as exc:
            raise EndpointError(f"{self.base_url}{path}: not JSON: {data[:200]!r}") from exc

    def health_detail(self, timeout: float = 5.0) -> tuple[int, str]:
        """(HTTP status of /health, why nothing answered): (0, reason) when nothing answers."""
        try:
            return self._request("GET", "/health", timeout=timeout)[0], ""
        except EndpointError as exc:
            return 0, str(exc)

    def health(self, timeout: float = 5.0) -> int:
        """The HTTP status of /health; 0 when nothing answers."""
        return self.health_detail(timeout)[0]

    def models(self) -> list[str]:
        return [m.get("id", "") for m in (self._json("GET", "/v1/models") or {}).get("data", [])]

    def version(self) -> str | None:
        try:
            return (self._json("GET", "/version", timeout=5.0) or {}).get("version")
        except EndpointError:
            return None

    def metrics_text(self) -> str:
        """/metrics as it answers (Prometheus text: the engine's, or the collector's through the gateway);
        EndpointError for an HTTP error."""
        status, data = self._request("GET", "/metrics", None, 10.0)
        if status != 200:
            raise EndpointError(f"{self.base_url}/metrics: HTTP {status}: {_error_message(data)}")
        return data.decode(errors="replace")

    def _body(self, prompt: str, max_tokens: int, stream: bool) -> dict:
        body = {"messages": [{"role": "user", "content": prompt}], "max_tokens": int(max_tokens),
                "stream": stream}
        if self.model:
            body["model"] = self.model
        return body

    def chat(self, prompt: str, max_tokens: int = 64) -> Completion:
        started = time.monotonic()
        reply = self._json("POST", "/v1/chat/completions", self._body(prompt, max_tokens, False))
        return _completion(reply or {}, time.monotonic() - started)

    def chat_between_metrics(self, prompt: str, max_tokens: int = 64) -> tuple[Completion, str | None, str | None]:
        """/metrics, a chat completion, /metrics again, in one go (one `docker exec` through the head): the
        completion and the two readings around it (None where /metrics did not answer 200)."""
        body = json.dumps(self._body(prompt, max_tokens, False)).encode()
        (before_status, before, _), (status, data, seconds), (after_status, after, _) = self.fetch.batch([
            ("GET", "/metrics", None, 10.0), ("POST", "/v1/chat/completions", body, self.timeout),
            ("GET", "/metrics", None, 10.0)])
        completion = _completion(self._parsed("/v1/chat/completions", status, data) or {}, seconds)
        return (completion, before.decode(errors="replace") if before_status == 200 else None,
                after.decode(errors="replace") if after_status == 200 else None)

    def stream_chat(self, prompt: str, max_tokens: int = 64,
                    on_text: Callable[[str], None] | None = None) -> Completion:
        """A streamed chat completion; `on_text` sees each piece as it arrives.

        Over a fetch that cannot stream (through the head node), one plain completion shown at once."""
        if not isinstance(self.fetch, HttpFetch):  # the type check narrows self.fetch for the code below
            reply = self.chat(prompt, max_tokens)
            if on_text and reply.text:
                on_text(reply.text)
            return reply
        started = time.monotonic()
        conn = self.fetch.connection(self.timeout)
        result = Completion(text="")
        pieces: list[str] = []
        try:
            conn.request("POST", "/v1/chat/completions", body=json.dumps(self._body(prompt, max_tokens, True)),
                         headers=self.fetch.headers(True, Accept="text/event-stream"))
            response = conn.getresponse()
            if response.status != 200:
                raise EndpointError(f"{self.base_url}/v1/chat/completions: HTTP {response.status}: "
                                    f"{_error_message(response.read())}")
            for chunk in _sse_events(response):
                choice = (chunk.get("choices") or [{}])[0]
                text = (choice.get("delta") or {}).get("content") or ""
                if text:
                    now = time.monotonic() - started
                    if result.ttft is None:
                        result.ttft = now
                    result.token_times.append(now)
                    pieces.append(text)
                    if on_text:
                        on_text(text)
                if choice.get("avg_decoded_tokens_per_iter") is not None:
                    result.acceptance_length = _number(choice["avg_decoded_tokens_per_iter"])
                if choice.get("finish_reason"):
                    result.finish_reason = choice["finish_reason"]
                usage = chunk.get("usage") or {}
                if usage.get("completion_tokens"):
                    result.completion_tokens = usage["completion_tokens"]
        except (OSError, http.client.HTTPException) as exc:
            raise EndpointError(f"{self.base_url}/v1/chat/completions: {exc}") from exc
        finally:
            conn.close()
        result.text = "".join(pieces)
        result.seconds = time.monotonic() - started
        return result


def _sse_events(response) -> Iterator[dict]:
    for raw in response:
        line = raw.decode(errors="replace").strip()
        if not line.startswith("data:"):
            continue
        payload = line[5:].strip()
        if payload == "[DONE]":
            return
        try:
            yield json.loads(payload)
        except ValueError:
            continue


def _completion(reply: dict, seconds: float) -> Completion:
    """A (non-streamed) chat completion's answer."""
    choice = (reply.get("choices") or [{}])[0]
    return Completion(
        text=(choice.get("message") or {}).get("content") or "",
        acceptance_length=_number(choice.get("avg_decoded_tokens_per_iter")),
        completion_tokens=(reply.get("usage") or {}).get("completion_tokens"),
        finish_reason=choice.get("finish_reason"), seconds=seconds)


def _number(value) -> float | None:
    try:
        return float(value) if value is not None else None
    except (TypeError, ValueError):
        return None


def _error_message(data: bytes) -> str:
    try:
        return str(json.loads(data).get("message") or data[:200])
    except (ValueError, AttributeError):
        return data[:200].decode(errors="replace")


def is_degenerate(text: str, min_length: int = 4) -> bool:
    """Mostly one character repeated (`!!!!!!!!`): the known Eagle3 failure on SM12x (TensorRT-LLM #8615).

    Empty text is not degenerate here: callers report "no text" on its own."""
    body = "".join((text or "").split())
    if len(body) < min_length:
        return False
    return Counter(body).most_common(1)[0][1] / len(body) > 0.8
