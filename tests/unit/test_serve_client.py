"""The endpoint client against a real HTTP server on loopback."""

from __future__ import annotations

import pytest

from sparkctl.serve_client import (
    EndpointError,
    ServeClient,
    acceptance_from_metrics,
    endpoint_url,
    is_degenerate,
)
from tests.unit.fake_endpoint import FakeEndpoint


@pytest.fixture
def endpoint():
    fake = FakeEndpoint()
    yield fake
    fake.close()


def test_health_models_chat_and_metrics(endpoint):
    client = ServeClient(endpoint.url, model="m")
    assert client.health() == 200
    assert client.models() == ["nvidia/Qwen3-235B-A22B-FP4"]
    reply = client.chat("hi", max_tokens=8)
    assert reply.text == "hello from the sparks" and reply.acceptance_length == 2.5
    assert endpoint.requests[-1] == {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 8,
                                     "stream": False, "model": "m"}
    assert acceptance_from_metrics(client.metrics()) == 2.5


def test_streaming_reports_pieces_ttft_and_acceptance(endpoint):
    seen = []
    reply = ServeClient(endpoint.url).stream_chat("hi", on_text=seen.append)
    assert "".join(seen) == reply.text == "hello from the sparks"
    assert reply.ttft is not None and reply.ttft <= reply.seconds
    assert reply.acceptance_length == 2.5 and reply.finish_reason == "length"
    assert len(reply.token_times) == 4


def test_nothing_listening_is_health_0_and_an_endpoint_error():
    fake = FakeEndpoint()
    url = fake.url
    fake.close()
    client = ServeClient(url, timeout=2)
    assert client.health() == 0
    with pytest.raises(EndpointError):
        client.chat("hi")


def test_degenerate_output_and_urls():
    assert is_degenerate("!!!!!!!!") and is_degenerate("! ! ! ! !")
    assert not is_degenerate("!!!") and not is_degenerate("hello!!!!")
    assert endpoint_url("10.0.0.1", 8355) == "http://10.0.0.1:8355"
    assert endpoint_url("fd00::1", 80) == "http://[fd00::1]:80"
