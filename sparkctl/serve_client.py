"""A small client for the OpenAI-compatible endpoint trtllm-serve exposes (stdlib only).

/health, /v1/models, /version, /metrics (a JSON list of iteration stats, drained on read), chat completions
plain and streamed (server-sent events). Eagle3 endpoints decode greedily whatever sampling is asked for.
"""

from __future__ import annotations

import http.client
import json
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
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


class ServeClient:
    def __init__(self, base_url: str, timeout: float = 60.0, model: str | None = None):
        parts = urlsplit(base_url)
        if parts.scheme != "http" or not parts.hostname:
            raise ValueError(f"not an http:// endpoint: {base_url}")
        self.base_url = base_url.rstrip("/")
        self.host, self.port = parts.hostname, parts.port or 80
        self.timeout = timeout
        self.model = model

    def _connection(self, timeout: float | None = None) -> http.client.HTTPConnection:
        return http.client.HTTPConnection(self.host, self.port, timeout=timeout or self.timeout)

    def _request(self, method: str, path: str, body: dict | None = None,
                 timeout: float | None = None) -> tuple[int, bytes]:
        conn = self._connection(timeout)
        try:
            data = json.dumps(body).encode() if body is not None else None
            headers = {"Content-Type": "application/json"} if data is not None else {}
            conn.request(method, path, body=data, headers=headers)
            response = conn.getresponse()
            return response.status, response.read()
        except (OSError, http.client.HTTPException) as exc:
            raise EndpointError(f"{self.base_url}{path}: {exc}") from exc
        finally:
            conn.close()

    def _json(self, method: str, path: str, body: dict | None = None, timeout: float | None = None):
        status, data = self._request(method, path, body, timeout)
        if status != 200:
            raise EndpointError(f"{self.base_url}{path}: HTTP {status}: {_error_message(data)}")
        try:
            return json.loads(data or b"null")
        except ValueError as exc:
            raise EndpointError(f"{self.base_url}{path}: not JSON: {data[:200]!r}") from exc

    def health(self, timeout: float = 5.0) -> int:
        """The HTTP status of /health; 0 when nothing answers."""
        try:
            return self._request("GET", "/health", timeout=timeout)[0]
        except EndpointError:
            return 0

    def models(self) -> list[str]:
        return [m.get("id", "") for m in (self._json("GET", "/v1/models") or {}).get("data", [])]

    def version(self) -> str | None:
        try:
            return (self._json("GET", "/version", timeout=5.0) or {}).get("version")
        except EndpointError:
            return None

    def metrics(self) -> list[dict]:
        """Iteration stats since the last read (the server drains them); [] when not enabled."""
        value = self._json("GET", "/metrics", timeout=10.0)
        return value if isinstance(value, list) else []

    def _body(self, prompt: str, max_tokens: int, stream: bool) -> dict:
        body = {"messages": [{"role": "user", "content": prompt}], "max_tokens": int(max_tokens),
                "stream": stream}
        if self.model:
            body["model"] = self.model
        return body

    def chat(self, prompt: str, max_tokens: int = 64) -> Completion:
        started = time.monotonic()
        reply = self._json("POST", "/v1/chat/completions", self._body(prompt, max_tokens, False))
        choice = (reply.get("choices") or [{}])[0]
        return Completion(
            text=(choice.get("message") or {}).get("content") or "",
            acceptance_length=_number(choice.get("avg_decoded_tokens_per_iter")),
            completion_tokens=(reply.get("usage") or {}).get("completion_tokens"),
            finish_reason=choice.get("finish_reason"), seconds=time.monotonic() - started)

    def stream_chat(self, prompt: str, max_tokens: int = 64,
                    on_text: Callable[[str], None] | None = None) -> Completion:
        """A streamed chat completion; `on_text` sees each piece as it arrives."""
        started = time.monotonic()
        conn = self._connection()
        result = Completion(text="")
        pieces: list[str] = []
        try:
            conn.request("POST", "/v1/chat/completions", body=json.dumps(self._body(prompt, max_tokens, True)),
                         headers={"Content-Type": "application/json", "Accept": "text/event-stream"})
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


def acceptance_from_metrics(stats: list[dict]) -> float | None:
    """Mean acceptance length over the iterations in a /metrics read (accepted tokens per draft step)."""
    values = [s.get("specDecodingStats", {}).get("acceptanceLength") for s in stats]
    values = [float(v) for v in values if isinstance(v, (int, float)) and v > 0]
    return round(sum(values) / len(values), 2) if values else None


def is_degenerate(text: str, min_length: int = 4) -> bool:
    """One character repeated (`!!!!!!!!`): the known Eagle3 failure on SM12x (TensorRT-LLM #8615)."""
    stripped = "".join(text.split())
    return len(stripped) >= min_length and len(set(stripped)) == 1
