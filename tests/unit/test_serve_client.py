"""The endpoint client against a real HTTP server on loopback."""

from __future__ import annotations

import subprocess

import pytest

from sparkctl.knowledge.metric_names import TRTLLM_COLLECTED
from sparkctl.knowledge.serve_client import (
    EndpointError,
    NodeFetch,
    ServeClient,
    endpoint_url,
    is_degenerate,
    parse_node_http,
)
from sparkctl.knowledge.serve_metrics import acceptance_since, metrics_reading
from sparkctl.transport.base import CommandResult
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
    assert acceptance_since(None, metrics_reading(client.metrics_text(), TRTLLM_COLLECTED)) == 2.5


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


class HereTransport:
    """exec_in runs here (the head's container shares the host network: its loopback is the fake's)."""

    node = "spark1"

    def __init__(self):
        self.calls = []

    def exec_in(self, container, cmd, *, timeout=60.0, input=None, env=None):
        self.calls.append((cmd, input))
        proc = subprocess.run(["sh", "-c", cmd], input=input or "", capture_output=True, text=True,
                              timeout=timeout, env={"PATH": "/usr/bin:/bin"})
        return CommandResult(cmd, proc.returncode, proc.stdout, proc.stderr)


def test_the_same_client_through_the_head_node(endpoint):
    transport = HereTransport()
    client = ServeClient(NodeFetch(transport, "trtllm-multinode", endpoint.port), model="m")
    assert not client.streams and client.base_url == f"http://127.0.0.1:{endpoint.port} on spark1"
    assert client.health() == 200
    assert client.models() == ["nvidia/Qwen3-235B-A22B-FP4"]
    reply = client.chat("a prompt that stays off argv", max_tokens=8)
    assert reply.text == "hello from the sparks" and reply.acceptance_length == 2.5
    assert acceptance_since(None, metrics_reading(client.metrics_text(), TRTLLM_COLLECTED)) == 2.5
    cmd, body = transport.calls[2]
    assert "a prompt that stays off argv" in body and "a prompt" not in cmd
    seen = []
    assert client.stream_chat("hi", on_text=seen.append).text == "hello from the sparks" == "".join(seen)
    endpoint.health = 503
    assert client.health() == 503


@pytest.mark.parametrize("through", ["here", "head"])
def test_a_chat_between_two_metrics_reads_is_one_go_and_its_figures_are_its_own(endpoint, through):
    transport = HereTransport()
    fetch = endpoint.url if through == "here" else NodeFetch(transport, "trtllm-multinode", endpoint.port)
    client = ServeClient(fetch, model="m")
    client.chat("an earlier request", max_tokens=8)
    endpoint.acceptance = 4.0
    reply, before, after = client.chat_between_metrics("a prompt that stays off argv", max_tokens=8)
    assert reply.text == "hello from the sparks" and reply.seconds > 0
    assert before is not None and after is not None
    # this request's alone: the counters between the two reads
    assert acceptance_since(metrics_reading(before, TRTLLM_COLLECTED), metrics_reading(after, TRTLLM_COLLECTED)) == 4.0
    assert endpoint.requests[-1]["messages"][0]["content"] == "a prompt that stays off argv"
    if through == "head":
        (cmd, body), = transport.calls[1:]  # the read before, the chat and the read after: one exec
        assert "a prompt that stays off argv" in body and "a prompt" not in cmd
    endpoint.close()
    # the model's own figures are asked for (a gateway of several models answers with them)
    with pytest.raises(EndpointError, match=r"/metrics\?model=m: .*refused"):
        client.chat_between_metrics("hi")


def test_the_head_node_client_says_why_nothing_answers():
    fake = FakeEndpoint()
    port = fake.port
    fake.close()
    client = ServeClient(NodeFetch(HereTransport(), "c", port), timeout=2)
    status, why = client.health_detail()
    assert status == 0 and "refused" in why.lower()
    with pytest.raises(EndpointError, match="refused"):
        client.chat("hi")

    class DownContainer(HereTransport):
        def exec_in(self, container, cmd, **kwargs):
            return CommandResult(cmd, 1, "", "Error response from daemon: container c is not running\n")

    status, why = ServeClient(NodeFetch(DownContainer(), "c", port)).health_detail()
    assert status == 0 and "cannot run python3 in the container c on spark1" in why and "not running" in why


def test_node_http_output_parsing():
    assert parse_node_http("200\n{\"a\": 1}") == (200, "{\"a\": 1}")
    assert parse_node_http("0\nConnectionRefusedError: refused") == (0, "ConnectionRefusedError: refused")
    assert parse_node_http("docker: no such container") == (0, "docker: no such container")


def test_one_degenerate_rule_for_the_tasks_and_doctor():
    from sparkctl.doctor.checks import serve as checks_serve

    assert checks_serve.is_degenerate is is_degenerate
    assert is_degenerate("!!!!!!!!!!!!!!!!!!!!a")  # mostly one character
    assert not is_degenerate("") and not is_degenerate("The sea is wide and deep.")
