"""A small client for the OpenAI-compatible endpoints the engines expose, through sparkctl's gateway (plain HTTP or
HTTPS, the certificate checked: knowledge/certificates.py).

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
import ssl
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol
from urllib.parse import quote, urlsplit

from sparkctl.knowledge.certificates import client_context_for
from sparkctl.shipped import shipped_text


class EndpointError(Exception):
    """The endpoint could not be reached or answered with an error. `certificate`: it answered, with a certificate
    the client refused (no other route should hide that)."""

    def __init__(self, message: str, certificate: bool = False):
        super().__init__(message)
        self.certificate = certificate


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


def endpoint_url(host: str, port: int, secure: bool = False) -> str:
    scheme = "https" if secure else "http"
    return f"{scheme}://{host}:{int(port)}" if ":" not in host else f"{scheme}://[{host}]:{int(port)}"


@dataclass(frozen=True)
class Tls:
    """How a client checks an https endpoint: the name the certificate must hold, and the certificates of the CA it
    trusts (PEM; None: the system's roots)."""

    name: str
    ca: str | None = None

    def context(self) -> ssl.SSLContext:
        return client_context_for(self.ca)


class _VerifiedHttps(http.client.HTTPSConnection):
    """HTTPS to an address, the certificate checked against the name clients use (which may not resolve here)."""

    def __init__(self, host: str, port: int, timeout: float, context: ssl.SSLContext, name: str):
        super().__init__(host, port, timeout=timeout, context=context)
        self._verify, self._name = context, name

    def connect(self) -> None:
        http.client.HTTPConnection.connect(self)
        self.sock = self._verify.wrap_socket(self.sock, server_hostname=self._name)


class Fetch(Protocol):
    """How a request reaches the server: `(method, path, body, timeout) -> (status, body)`.

    Raises EndpointError when nothing answers. `where` names the endpoint in messages."""

    where: str

    def __call__(self, method: str, path: str, body: bytes | None, timeout: float) -> tuple[int, bytes]: ...

    def batch(self, requests: list[Request]) -> list[tuple[int, bytes, float]]:
        """Several requests in order, in one go where the fetch can: (status, body, seconds) each."""
        ...


class HttpFetch:
    """Straight from this machine over HTTP or HTTPS (the endpoint must be routable from here). `address`: where to
    connect when the URL's host is a name the certificate holds but this machine need not resolve."""

    def __init__(self, base_url: str, api_key: str | None = None, tls: Tls | None = None,
                 address: str | None = None):
        parts = urlsplit(base_url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"not an http:// or https:// endpoint: {base_url}")
        self.where = base_url.rstrip("/")
        secure = parts.scheme == "https"
        self.host, self.port = address or parts.hostname, parts.port or (443 if secure else 80)
        self.tls = (tls or Tls(parts.hostname)) if secure else None
        self.auth = bearer(api_key)
        self._context: ssl.SSLContext | None = None  # made once: a bench's requests must not each pay for it

    def headers(self, body: bool, **more: str) -> dict[str, str]:
        out = {"Content-Type": "application/json"} if body else {}
        if self.auth:
            out["Authorization"] = self.auth
        return {**out, **more}

    def connection(self, timeout: float) -> http.client.HTTPConnection:
        if self.tls is None:
            return http.client.HTTPConnection(self.host, self.port, timeout=timeout)
        if self._context is None:
            try:
                self._context = self.tls.context()
            except ssl.SSLError as exc:
                raise EndpointError(f"{self.where}: the CA certificates cannot be used: {exc}") from exc
        return _VerifiedHttps(self.host, self.port, timeout, self._context, self.tls.name)

    def __call__(self, method: str, path: str, body: bytes | None, timeout: float) -> tuple[int, bytes]:
        conn = self.connection(timeout)
        try:
            conn.request(method, path, body=body, headers=self.headers(body is not None))
            response = conn.getresponse()
            return response.status, response.read()
        except ssl.SSLCertVerificationError as exc:
            raise EndpointError(f"{self.where}{path}: the endpoint's certificate is refused: "
                                f"{exc.verify_message or exc}", certificate=True) from exc
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


def node_http_command(method: str, url: str, timeout: float) -> str:
    """The shell words that run the one in-node HTTP client (templates/node-http.py; feed the body of a POST on
    its stdin)."""
    return (f"python3 -c {shlex.quote(shipped_text('node-http.py'))} {shlex.quote(method)} {shlex.quote(url)} "
            f"{float(timeout):g}")


#: One request of a batch: (method, path, body, timeout)
Request = tuple[str, str, bytes | None, float]


def parse_node_http(output: str) -> tuple[int, str]:
    """(status, body) from what node-http.py printed; status 0 when the output is not its."""
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
                 host: str = "127.0.0.1", api_key: str | None = None, tls: Tls | None = None):
        """`tls`: the gateway answers there over HTTPS, its certificate checked as `tls` says."""
        self.transport, self.container, self.port = transport, container, int(port)
        self.node = node or getattr(transport, "node", "the head")
        self.base = endpoint_url(host, self.port, secure=tls is not None)
        self.where = f"{self.base} on {self.node}"
        self.auth = bearer(api_key)
        self.tls = tls

    def __call__(self, method: str, path: str, body: bytes | None, timeout: float) -> tuple[int, bytes]:
        status, data, _seconds = self.batch([(method, path, body, timeout)])[0]
        return status, data


    def batch(self, requests: list[Request]) -> list[tuple[int, bytes, float]]:
        """The requests in order, in one run of python3 in the container: (status, body, seconds) each."""
        tls = self.tls and {"name": self.tls.name, "ca": self.tls.ca}
        payload = json.dumps({"auth": self.auth, "tls": tls, "requests": [
            [m, self.base + path, body.decode() if body is not None else None, t] for m, path, body, t in requests]})
        try:
            program = shlex.quote(shipped_text("node-http-batch.py"))
            result = self.transport.exec_in(self.container, f"python3 -c {program}",
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
                raise EndpointError(f"{self.where}{path}: {body or 'no answer'}",
                                    certificate=str(body).startswith("SSLCertVerificationError"))
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
    def figures_path(self) -> str:
        """/metrics, naming the client's model: a gateway of several models answers with that model's figures (one
        of a single model ignores the argument, as the engines' and the collector's Prometheus handlers do)."""
        return "/metrics" + (f"?model={quote(self.model, safe='')}" if self.model else "")

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
        status, why, _refused = self.reach(timeout)
        return status, why

    def reach(self, timeout: float = 5.0) -> tuple[int, str, bool]:
        """health_detail, and whether what answered showed a certificate this client refuses."""
        try:
            return self._request("GET", "/health", timeout=timeout)[0], "", False
        except EndpointError as exc:
            return 0, str(exc), exc.certificate

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
        status, data = self._request("GET", self.figures_path, None, 10.0)
        if status != 200:
            raise EndpointError(f"{self.base_url}{self.figures_path}: HTTP {status}: {_error_message(data)}")
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
            ("GET", self.figures_path, None, 10.0), ("POST", "/v1/chat/completions", body, self.timeout),
            ("GET", self.figures_path, None, 10.0)])
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
