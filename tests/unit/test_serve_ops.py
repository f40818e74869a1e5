"""What `sparkctl serve status|logs|chat|bench|stop` do on the cluster (runs/serve_ops.py), with recorded nodes and a
real HTTP endpoint on loopback."""

from __future__ import annotations

import itertools
import socket

import pytest

from sparkctl.errors import BadInput, SparkctlError, Unreachable
from sparkctl.exitcodes import ExitStatus
from sparkctl.runs import serve_ops
from tests.taskkit import RecordingTransport, inventory_from_yaml
from tests.unit.fake_endpoint import FakeEndpoint

CONFIG = "/sparkctl/serve/extra-llm-api-config.yml"


def pair(tmp_path, port: int):
    return inventory_from_yaml(f"""
user: nvidia
nodes: [{{name: spark1, host: 127.0.0.1}}, {{name: spark2, host: 10.0.0.12}}]
serve: {{preset: qwen3-235b-eagle3, port: {port}}}
""", tmp_path)


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def endpoint():
    fake = FakeEndpoint()
    yield fake
    fake.close()


class FakeSession:
    """Session's face with recorded transports; `down` names the nodes that cannot be reached."""

    transports: dict[str, RecordingTransport] = {}
    down: dict[str, str] = {}

    def __init__(self, inventory, **_options):
        self.inventory = inventory

    def __enter__(self):
        self.transports = {n: t for n, t in FakeSession.transports.items() if n not in FakeSession.down}
        self.unreachable = dict(FakeSession.down)
        self.unreachable_kinds = dict.fromkeys(FakeSession.down, "network")
        return self

    def __exit__(self, *exc):
        return None

    def open(self, name):
        if name in FakeSession.down:
            raise SparkctlError(FakeSession.down[name])
        return FakeSession.transports[name]


@pytest.fixture
def nodes(monkeypatch):
    FakeSession.transports = {n: RecordingTransport(n).respond(r'printf %s "\$HOME"', "/home/nvidia")
                              for n in ("spark1", "spark2")}
    FakeSession.down = {}
    monkeypatch.setattr(serve_ops, "Session", FakeSession)
    return FakeSession.transports


def test_chat_goes_straight_to_the_endpoint_when_it_answers_here(tmp_path, endpoint, nodes):
    inv = pair(tmp_path, endpoint.port)
    with serve_ops.endpoint_client(inv, timeout=5) as client:
        assert client.base_url == endpoint.url and client.chat("hi", max_tokens=4).text == endpoint.reply
    assert nodes["spark1"].calls == []  # no ssh when the route works


def test_bench_refuses_a_route_through_ssh_and_says_how_to_open_one(tmp_path, nodes):
    port = closed_port()
    inv = pair(tmp_path, port)
    with pytest.raises(SparkctlError) as err, serve_ops.endpoint_client(inv, timeout=5, direct_only=True):
        pass
    assert f"http://127.0.0.1:{port} does not answer from this machine" in err.value.message
    assert f"ssh -N -L {port}:127.0.0.1:{port} 127.0.0.1" in err.value.hint


def test_chat_without_a_route_asks_the_head_inside_its_container(tmp_path, nodes):
    inv = pair(tmp_path, closed_port())
    nodes["spark1"].respond(r"http.client", "[503, \"\", 0.01]\n")  # the one in-node client's line
    with pytest.raises(SparkctlError) as err, serve_ops.endpoint_client(inv, timeout=5):
        pass
    assert err.value.message.endswith("/health answers 503")
    (call,) = [c for c in nodes["spark1"].calls if c.kind == "exec_in"]
    assert call.target.startswith("trtllm-multinode: ")


def test_the_head_log_is_read_with_its_size_for_following(tmp_path, nodes):
    inv = pair(tmp_path, 8355)
    nodes["spark1"].respond(r"tail -n 50 ", "starting\nApplication startup complete.\n4242\n")
    log = serve_ops.read_log(inv, nodes["spark1"], "spark1", 50)
    assert (log.text, log.offset, log.missing) == ("starting\nApplication startup complete.\n", 4242, False)
    assert log.path == "/home/nvidia/.local/state/sparkctl/sparks/run/serve/serve.log"
    nodes["spark2"].respond(r"docker logs --tail 50 trtllm-multinode", "sshd listening\n")
    other = serve_ops.read_log(inv, nodes["spark2"], "spark2", 50)
    assert (other.text, other.path) == ("sshd listening\n", None)
    nodes["spark1"].rules.clear()
    nodes["spark1"].respond(r'printf %s "\$HOME"', "/home/nvidia").respond(r"tail -n", "0\n")
    assert serve_ops.read_log(inv, nodes["spark1"], "spark1", 50).missing


def test_following_reads_from_where_the_last_read_stopped(tmp_path, nodes):
    inv = pair(tmp_path, 8355)
    pieces = iter(["line 3\n", "", "line 4\n"])
    nodes["spark1"].respond(r"tail -c", lambda: next(pieces))
    log = serve_ops.LogRead("line 1\nline 2\n", "/x/serve.log", offset=14)
    got = list(itertools.islice(serve_ops.follow_log(nodes["spark1"], inv.container.name, log, every=0), 2))
    assert got == ["line 3\n", "line 4\n"]
    offsets = [c.target for c in nodes["spark1"].calls if "tail -c" in c.target]
    assert offsets == ["tail -c +15 /x/serve.log 2>/dev/null", "tail -c +22 /x/serve.log 2>/dev/null",
                       "tail -c +22 /x/serve.log 2>/dev/null"]


def serving_head(head, ended_by: str):
    """A head whose mpirun (PID 42, in serve.pid) lives until a command matching `ended_by` runs."""
    state = {"alive": True}
    head.respond(r"cat .*serve.pid", "42\n")
    head.respond(ended_by, then=lambda: state.update(alive=False))
    head.respond(r"/proc/42/cmdline", lambda: f"mpirun trtllm-serve --extra_llm_api_options {CONFIG}"
                 if state["alive"] else "")
    return head


def test_stop_disables_the_unit_and_kills_leftover_ranks_everywhere(tmp_path, nodes):
    """The unit's stop TERMs mpirun (world.sh stop); disabled, it stays down at boot."""
    inv = pair(tmp_path, 8355)
    head = serving_head(nodes["spark1"], ended_by=r"systemctl disable --now sparkctl-serve-\S+\.service")
    nodes["spark2"].respond(r"pgrep", "777\n")
    result = serve_ops.stop_server(inv)
    assert result.pid == 42 and result.leftovers == ["spark2: 777"] and result.unreachable == {}
    (disable,) = [c for c in head.calls if "systemctl disable --now" in c.target]
    assert disable.sudo
    assert not any("kill -TERM 42" in c.target for c in head.calls)


def test_stop_ends_a_server_started_before_the_unit_too(tmp_path, nodes):
    """A server that an earlier sparkctl started with `docker exec -d` (no unit): TERM to its mpirun."""
    inv = pair(tmp_path, 8355)
    head = serving_head(nodes["spark1"], ended_by=r"kill -TERM 42")
    assert serve_ops.stop_server(inv).pid == 42
    assert not any("kill -KILL 42" in c.target for c in head.calls)


def test_status_shows_the_unit_its_restarts_and_the_last_failure_with_its_cause(tmp_path, nodes, endpoint):
    inv = inventory_from_yaml(f"""
user: nvidia
cluster: {{name: duo}}
nodes: [{{name: spark1, host: 127.0.0.1}}, {{name: spark2, host: 10.0.0.12}}]
serve: {{preset: qwen3-235b-eagle3, port: {endpoint.port}, engine_port: {closed_port()}}}
""", tmp_path)
    head = nodes["spark1"]
    shown = {"unit": "LoadState=loaded\nActiveState=activating\nSubState=auto-restart\nUnitFileState=enabled\n"
                     "NRestarts=3\nExecMainStartTimestamp=@1795811499\n",
             "exits": "2026-11-27T20:31:39Z 1795811499 asked none none 0\n"
                      "2026-11-27T20:32:39Z 1795811559 exit-code exited 137 18\n"
                      "2026-11-27T20:33:39Z 1795811619 exit-code killed KILL 7\n"}
    head.respond(r"systemctl show", lambda: shown["unit"])
    head.respond(r"exits.log", lambda: shown["exits"])
    head.respond(r"tail -n 40 \S*serve.log ", "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2 GiB\n")
    rows = dict(serve_ops.serve_status(inv).rows)
    assert rows["unit"] == "activating (auto-restart), enabled"
    assert rows["restarts"].startswith("3 ")
    assert rows["last failure"].startswith("2026-11-27T20:33:39Z, killed by SIGKILL after 7s; likely cause: ")
    shown["unit"] = "LoadState=loaded\nActiveState=inactive\nSubState=dead\nUnitFileState=disabled\nNRestarts=0\n"
    shown["exits"] += "2026-11-27T20:43:39Z 1795812219 success exited 0 300\n"
    rows = dict(serve_ops.serve_status(inv).rows)
    assert rows["unit"] == "inactive (dead), disabled (stays down at boot: `serve stop`)"
    # a stop came after it: that run's log is not the failed one's, no cause is guessed from it
    assert rows["last failure"] == "2026-11-27T20:33:39Z, killed by SIGKILL after 7s"


def test_stop_needs_the_head_and_reports_peers_it_could_not_check(tmp_path, nodes):
    inv = pair(tmp_path, 8355)
    FakeSession.down = {"spark1": "spark1: no route to host"}
    with pytest.raises(Unreachable, match="cannot stop the server: spark1: no route to host") as refused:
        serve_ops.stop_server(inv)
    assert refused.value.exit_status == ExitStatus.UNREACHABLE and refused.value.node == "spark1"
    FakeSession.down = {"spark2": "spark2: no route to host"}
    nodes["spark1"].respond(r"cat .*launch.json", "")
    result = serve_ops.stop_server(inv)
    assert result.pid is None and result.unreachable == {"spark2": "spark2: no route to host"}


def test_status_says_when_the_head_cannot_be_asked(tmp_path, nodes):
    inv = pair(tmp_path, closed_port())
    FakeSession.down = {"spark1": "spark1: authentication failed"}
    report = serve_ops.serve_status(inv)
    rows = dict(report.rows)
    assert not report.healthy
    assert rows["head"] == "not reachable over ssh: spark1: authentication failed"
    assert rows["health"].startswith("no answer") and rows["health"].endswith("(asked from here)")


def test_a_node_outside_the_inventory_is_bad_input(tmp_path, nodes):
    with pytest.raises(BadInput, match="no node named spark9"), serve_ops.connected(pair(tmp_path, 8355), "spark9"):
        pass
