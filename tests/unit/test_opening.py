"""The early opening (runs/opening.py): a run's connections and cluster lock, opened in a thread once the input is
checked, handed to the run's session, or closed and released when the command ends without running. A local node
(this machine, a HOME of the test's own) holds a real lock with real bash and flock."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from click.testing import CliRunner

from sparkctl.cli import options as cli_options
from sparkctl.cli.main import cli
from sparkctl.errors import ClusterBusy
from sparkctl.exitcodes import ExitStatus
from sparkctl.inventory import load_inventory
from sparkctl.runs import opening as opening_mod
from sparkctl.runs.lock import ClusterLock, Holder, peek
from sparkctl.runs.opening import Opening
from sparkctl.runs.request import RunRequest
from sparkctl.runs.session import Session, held_lock
from sparkctl.transport.local import LocalTransport

pytestmark = pytest.mark.skipif(not shutil.which("flock"), reason="needs flock (util-linux)")


@pytest.fixture
def inventory_file(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    path = tmp_path / "here.yaml"
    path.write_text(f"""cluster: {{name: here}}
user: nvidia
ssh: {{known_hosts: {tmp_path}/kh, use_ssh_config: false}}
nodes: [{{name: spark1, host: 127.0.0.1, local: true}}]
""")
    return path


def holder_file(tmp_path: Path) -> Path:
    return tmp_path / ".local/state/sparkctl/here/run.holder"


def test_the_run_takes_the_connections_and_the_lock_the_opening_took(inventory_file, tmp_path):
    inventory = load_inventory(str(inventory_file))
    holder = Holder.now("bootstrap")
    with Opening(inventory, forks=4, become_password=None, holder=holder) as opening, \
            Session(inventory, opening=opening) as session:
        assert isinstance(session.transports["spark1"], LocalTransport)
        assert session.opened is not None and session.transports == session.opened.transports
        assert json.loads(holder_file(tmp_path).read_text())["run"] == holder.run
        with held_lock(session, "bootstrap", RunRequest(), emit=lambda event: None) as notes:
            assert notes == []
            assert set(peek("here", session.transports)) == {"spark1"}
        assert not holder_file(tmp_path).exists()  # released by the run, as a lock the run took itself
        assert peek("here", session.transports) == {}


def test_an_opening_the_command_never_ran_is_released_and_closed(inventory_file, tmp_path):
    inventory = load_inventory(str(inventory_file))
    with pytest.raises(KeyboardInterrupt), \
            Opening(inventory, forks=4, become_password=None, holder=Holder.now("bootstrap")) as opening:
        opening._thread.join()
        assert holder_file(tmp_path).exists()
        raise KeyboardInterrupt  # Ctrl-C while the rest of sparkctl loads
    assert not holder_file(tmp_path).exists()
    assert peek("here", {"spark1": LocalTransport("spark1")}) == {}


class Gate:
    """Holds the opening's thread at one step until the test lets it go."""

    def __init__(self):
        self.reached, self.go = threading.Event(), threading.Event()

    def hold(self, step):
        def held(*args, **kwargs):
            self.reached.set()
            assert self.go.wait(30)
            return step(*args, **kwargs)
        return held


def ctrl_c_while_held(inventory_file, monkeypatch, owner, step: str) -> Opening:
    """An Opening whose command met Ctrl-C while its thread was at `owner.step`; the thread then finishes."""
    gate = Gate()
    monkeypatch.setattr(owner, step, gate.hold(getattr(owner, step)))
    opening = Opening(load_inventory(str(inventory_file)), forks=4, become_password=None,
                      holder=Holder.now("bootstrap"))
    with pytest.raises(KeyboardInterrupt), opening:
        assert gate.reached.wait(30)
        raise KeyboardInterrupt
    assert opening._thread.is_alive()  # the command went on (to its exit) without waiting for the thread
    gate.go.set()
    opening._thread.join(30)
    assert not opening._thread.is_alive()
    return opening


def test_ctrl_c_while_connecting_does_not_wait_and_the_thread_takes_no_lock(inventory_file, tmp_path, monkeypatch):
    opening = ctrl_c_while_held(inventory_file, monkeypatch, opening_mod, "connect_all")
    assert not (tmp_path / ".local/state/sparkctl").exists()  # connected after the command left: no lock taken
    with pytest.raises(RuntimeError, match="handed over once"):
        opening.hand_over()


def test_ctrl_c_while_taking_the_lock_leaves_it_released_by_the_thread(inventory_file, tmp_path, monkeypatch):
    ctrl_c_while_held(inventory_file, monkeypatch, ClusterLock, "acquire")
    assert (tmp_path / ".local/state/sparkctl/here/run.lock").exists()  # it was taken, then
    assert not holder_file(tmp_path).exists()  # released cleanly: the next run finds no stale holder
    assert peek("here", {"spark1": LocalTransport("spark1")}) == {}


def test_an_opening_is_handed_over_once(inventory_file):
    inventory = load_inventory(str(inventory_file))
    with Opening(inventory, forks=4, become_password=None, holder=None) as opening:
        opened = opening.hand_over()
        assert set(opened.transports) == {"spark1"} and opened.lock is None
        with pytest.raises(RuntimeError, match="handed over once"):
            opening.hand_over()


def test_a_busy_cluster_exits_busy_from_the_command_line(inventory_file, tmp_path):
    other = ClusterLock("here", {"spark1": LocalTransport("spark1")}, Holder.now("cluster down"))
    other.acquire()
    try:
        for command in (["cluster", "bootstrap"], ["cluster", "down"]):
            result = CliRunner().invoke(cli, [*command, str(inventory_file)])
            assert result.exit_code == ExitStatus.BUSY, result.output
            assert "cluster here is busy: cluster down by " in result.output
            assert json.loads(holder_file(tmp_path).read_text())["run"] == other.holder.run
    finally:
        other.release()


def test_a_busy_cluster_is_refused_where_the_run_takes_the_lock(inventory_file, tmp_path):
    inventory = load_inventory(str(inventory_file))
    other = ClusterLock("here", {"spark1": LocalTransport("spark1")}, Holder.now("cluster down"))
    other.acquire()
    try:
        with Opening(inventory, forks=4, become_password=None, holder=Holder.now("bootstrap")) as opening, \
                Session(inventory, opening=opening) as session, \
                pytest.raises(ClusterBusy, match=r"cluster here is busy: cluster down by .*\(lock on spark1\)"), \
                held_lock(session, "bootstrap", RunRequest(), emit=lambda event: None):
            pytest.fail("the run went on without the lock")
        assert json.loads(holder_file(tmp_path).read_text())["run"] == other.holder.run  # the other run's, intact
    finally:
        other.release()


def test_check_mode_opens_the_connections_and_takes_no_lock(inventory_file, tmp_path):
    inventory = load_inventory(str(inventory_file))
    request = RunRequest.of(check=True)
    no_graph = lambda: pytest.fail("no --only nor --skip: the task graph is not needed")  # noqa: E731
    with cli_options.early_opening("bootstrap", inventory, request, graph=no_graph) as opening, \
            Session(inventory, opening=opening) as session:
        assert session.opened is not None and session.opened.lock is None
        with held_lock(session, "bootstrap", request, emit=lambda event: None) as notes:
            assert notes == []
    assert not (tmp_path / ".local/state/sparkctl").exists()  # nothing written on the node


@pytest.mark.parametrize("args, says", [
    (["--only", "network.nosuch"], "network.nosuch"),
    (["--skip", "nosuch"], "nosuch"),
    (["--limit", "spark9"], "--limit: no node named spark9"),
])
def test_input_is_refused_before_anything_connects(inventory_file, monkeypatch, args, says):
    connected = []
    monkeypatch.setattr(opening_mod, "connect_all", lambda *a, **kw: connected.append(a) or ({}, {}))
    for command in (["cluster", "bootstrap"], ["cluster", "down"]):
        result = CliRunner().invoke(cli, [*command, *args, str(inventory_file)])
        assert result.exit_code == 2, result.output
        assert says in result.output
    assert connected == []


def test_the_opening_thread_imports_nothing(inventory_file):
    """Two threads importing modules that import each other can deadlock: everything the opening runs is loaded
    by the main thread before it starts (resolving a host name's codec too)."""
    probe = f"""import sys, threading
imported = []
def hook(event, args):
    if event == "import" and threading.current_thread() is not threading.main_thread():
        imported.append((threading.current_thread().name, args[0]))
from sparkctl.cli import cluster_cmd  # what a command has loaded when it opens
from sparkctl.inventory import load_inventory
from sparkctl.runs.lock import Holder
from sparkctl.runs.opening import Opening
inventory = load_inventory({str(inventory_file)!r})
sys.addaudithook(hook)
with Opening(inventory, forks=4, become_password=None, holder=Holder.now("bootstrap")) as opening:
    opened = opening.hand_over()
opened.lock.release()
print(imported)
"""
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"
