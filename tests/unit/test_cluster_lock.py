"""The cluster lock with real bash and flock: each "node" is a LocalTransport with a HOME of its own."""

from __future__ import annotations

import dataclasses
import json
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from sparkctl.errors import ClusterBusy, SparkctlError
from sparkctl.exitcodes import ExitStatus
from sparkctl.runs import lock as lockmod
from sparkctl.runs.lock import ClusterLock, Holder, peek
from sparkctl.transport.base import q
from sparkctl.transport.local import LocalTransport

pytestmark = pytest.mark.skipif(not shutil.which("flock"), reason="needs flock (util-linux)")


class Node(LocalTransport):
    """A node of its own on this machine: the same commands, with HOME pointing at its own folder."""

    def __init__(self, name: str, home: Path):
        super().__init__(name)
        self.home = home

    def hold(self, script, *args, what="held command"):
        return super().hold(f"export HOME={q(self.home)}\n{script}", *args, what=what)

    def run(self, cmd, **kw):
        return super().run(f"export HOME={q(self.home)}\n{cmd}", **kw)


@pytest.fixture
def nodes(tmp_path):
    made = {}
    for name in ("spark1", "spark2"):
        (tmp_path / name).mkdir()
        made[name] = Node(name, tmp_path / name)
    return made


def holder_file(node: Node) -> Path:
    return node.home / ".local/state/sparkctl/lab/run.holder"


def test_a_second_run_is_refused_with_one_line_naming_the_holder(nodes):
    first = ClusterLock("lab", nodes, Holder.now("bootstrap"))
    first.acquire()
    try:
        assert json.loads(holder_file(nodes["spark1"]).read_text())["run"] == first.holder.run
        with pytest.raises(ClusterBusy) as busy:
            ClusterLock("lab", nodes, Holder.now("cluster down")).acquire()
        message = busy.value.message
        assert "\n" not in message and busy.value.hint is None
        assert message.startswith("cluster lab is busy: bootstrap by ") and f"(pid {first.holder.pid})" in message
        assert "(lock on spark1)" in message and busy.value.exit_status == ExitStatus.BUSY
        assert set(peek("lab", nodes)) == {"spark1", "spark2"}
    finally:
        first.release()
    assert not holder_file(nodes["spark1"]).exists() and peek("lab", nodes) == {}
    second = ClusterLock("lab", nodes, Holder.now("bootstrap"))
    with second:
        assert second.stale == {}


def test_all_or_none_a_node_held_elsewhere_releases_what_was_taken(nodes):
    other = ClusterLock("lab", {"spark2": nodes["spark2"]}, Holder.now("bootstrap", {"spark2"}))
    other.acquire()
    try:
        with pytest.raises(ClusterBusy, match=r"bootstrap --limit spark2 by .* \(lock on spark2\)"):
            ClusterLock("lab", nodes, Holder.now("bootstrap")).acquire()
        assert peek("lab", {"spark1": nodes["spark1"]}) == {}  # spark1 was given back
    finally:
        other.release()


def test_a_holder_that_vanished_leaves_a_stale_lock_that_the_next_run_takes_over(nodes):
    gone = ClusterLock("lab", nodes, Holder.now("bootstrap"))
    gone.acquire()
    gone._stop.set()
    for held in gone._held.values():  # what a SIGKILL does: the connection closes, nothing is released
        held.close()
    deadline = time.monotonic() + 10
    while peek("lab", nodes) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert peek("lab", nodes) == {} and holder_file(nodes["spark1"]).exists()
    with ClusterLock("lab", nodes, Holder.now("bootstrap")) as taker:
        assert set(taker.stale) == {"spark1", "spark2"}
        assert taker.stale["spark1"].run == gone.holder.run


def dead_pid() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


def test_a_holder_of_this_controller_whose_process_died_is_taken_over_at_once(nodes):
    """Its link was cut: the nodes never saw its connection close and wait for its heartbeat (the lease), but the
    process is gone from this controller, so the next run ends its node-side holders and takes the lock."""
    cut = ClusterLock("lab", nodes, dataclasses.replace(Holder.now("bootstrap"), pid=dead_pid()))
    cut.acquire()
    cut._stop.set()  # no heartbeat, no release: the node-side holders keep waiting
    assert set(peek("lab", nodes)) == {"spark1", "spark2"}
    with ClusterLock("lab", nodes, Holder.now("bootstrap")) as taker:
        assert set(taker.stale) == {"spark1", "spark2"} and taker.stale["spark2"].run == cut.holder.run
        assert json.loads(holder_file(nodes["spark2"]).read_text())["run"] == taker.holder.run
    for held in cut._held.values():
        held.close()


def test_the_takeover_ends_the_holders_awaits_them_and_is_not_ended_by_its_own_pkill():
    """The run id reaches the takeover on stdin: in its argv, `pkill -f` matched the takeover's own shell, which
    died before it could wait, and the lock was tried again while the old holder still held it."""
    run = "0123456789ab"
    holder = subprocess.Popen(["bash", "-c", "read -r -t 60 line", "sparkctl-holder", run], stdin=subprocess.PIPE)
    try:
        result = LocalTransport("local").run(f"bash -c {q(lockmod.takeover_script())}", input=run + "\n", timeout=15)
        assert result.exit_code == 0, result.stderr
        assert holder.poll() == -15  # ended, and already gone when the takeover returned
    finally:
        holder.kill()
        holder.wait()


def test_a_dead_holder_of_another_controller_waits_for_its_lease(nodes):
    """Another machine's pid says nothing here: only the lease ends that holder."""
    other = ClusterLock("lab", nodes, dataclasses.replace(Holder.now("bootstrap"), pid=dead_pid(),
                                                          controller="another-controller"))
    other.acquire()
    try:
        with pytest.raises(ClusterBusy, match="another-controller"):
            ClusterLock("lab", nodes, Holder.now("bootstrap")).acquire()
    finally:
        other.release()


def test_a_node_whose_holder_record_cannot_be_written_is_still_locked(nodes):
    """A full disk: the record is not written (and no older one is left to name the wrong run), the flock holds."""
    state = nodes["spark1"].home / ".local/state/sparkctl/lab"
    state.mkdir(parents=True)
    (state / "run.holder").write_text('{"stale": true}\n')
    (state / "run.holder.new").mkdir()  # what cannot be written as a file: the write fails like a full disk's
    with ClusterLock("lab", nodes, Holder.now("bootstrap")):
        assert not (state / "run.holder").exists()
        with pytest.raises(ClusterBusy, match="another sparkctl run \\(no holder record\\)"):
            ClusterLock("lab", nodes, Holder.now("bootstrap")).acquire()


def test_a_holder_without_heartbeats_loses_the_lease(nodes, monkeypatch):
    monkeypatch.setattr(lockmod, "LEASE_S", 1)
    monkeypatch.setattr(lockmod, "HEARTBEAT_S", 60.0)
    silent = ClusterLock("lab", {"spark1": nodes["spark1"]}, Holder.now("bootstrap"))
    silent.acquire()
    try:
        deadline = time.monotonic() + 30  # the node-side holder gives up once its read waited out the lease
        while peek("lab", {"spark1": nodes["spark1"]}) and time.monotonic() < deadline:
            time.sleep(0.05)
        with ClusterLock("lab", {"spark1": nodes["spark1"]}, Holder.now("bootstrap")) as taker:
            assert taker.stale["spark1"].run == silent.holder.run
    finally:
        silent.release()


@pytest.mark.slow
def test_heartbeats_keep_the_lease(nodes, monkeypatch):
    monkeypatch.setattr(lockmod, "LEASE_S", 3)  # a beat may be late by seconds on a loaded machine, not 2.8 s
    monkeypatch.setattr(lockmod, "HEARTBEAT_S", 0.2)
    with ClusterLock("lab", {"spark1": nodes["spark1"]}, Holder.now("bootstrap")):
        time.sleep(3.6)  # longer than the lease: only the beats keep it
        with pytest.raises(ClusterBusy):
            ClusterLock("lab", {"spark1": nodes["spark1"]}, Holder.now("bootstrap")).acquire()


def test_holder_describes_itself():
    holder = Holder(command="bootstrap", user="nvidia", controller="ctl", pid=42, since="2026-01-02T03:04:05Z",
                    run="abc", limit=["spark2"])
    text = holder.describe(now=holder_time(holder) + 12)
    assert text == "bootstrap --limit spark2 by nvidia@ctl (pid 42) since 2026-01-02 03:04:05Z (12 s ago)"
    assert Holder.parse(holder.record()) == holder and Holder.parse("not json") is None


def holder_time(holder: Holder) -> float:
    from datetime import datetime

    return datetime.fromisoformat(holder.since.replace("Z", "+00:00")).timestamp()


class Scripted(Node):
    """A node whose lock script is replaced (what it does instead of answering)."""

    def __init__(self, name, home, script):
        super().__init__(name, home)
        self.script = script

    def hold(self, script, *args, what="held command"):
        return LocalTransport.hold(self, self.script, *args, what=what)


def test_a_lock_script_that_ends_without_an_answer_asks_for_bash_only(tmp_path):
    node = Scripted("spark1", tmp_path, "exit 127")
    with pytest.raises(SparkctlError) as failed:
        ClusterLock("lab", {"spark1": node}, Holder.now("bootstrap")).acquire()
    assert "ended without an answer" in failed.value.message and "bash" in failed.value.hint
    assert "flock" not in failed.value.hint


@pytest.mark.slow
def test_a_node_slow_to_answer_is_not_told_to_install_flock_or_bash(tmp_path, monkeypatch):
    monkeypatch.setattr(lockmod, "ANSWER_TIMEOUT_S", 0.5)
    node = Scripted("spark1", tmp_path, "sleep 5")
    with pytest.raises(SparkctlError) as failed:
        ClusterLock("lab", {"spark1": node}, Holder.now("bootstrap")).acquire()
    assert "no answer within 0.5 s" in failed.value.message
    assert "flock" not in failed.value.hint and "bash" not in failed.value.hint and "slow" in failed.value.hint


def test_a_node_without_flock_is_told_so_not_that_the_cluster_is_busy(nodes, tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("mkdir", "cat", "head", "mv", "rm"):
        (bin_dir / tool).symlink_to(shutil.which(tool))
    node = Scripted("spark1", nodes["spark1"].home, f"export PATH={q(str(bin_dir))}\n{lockmod.hold_script()}")
    with pytest.raises(SparkctlError) as failed:
        ClusterLock("lab", {"spark1": node}, Holder.now("bootstrap")).acquire()
    assert not isinstance(failed.value, ClusterBusy)
    assert "flock is not installed" in failed.value.message


def test_the_lock_asks_no_more_nodes_at_once_than_forks(tmp_path):
    """--forks bounds every pool: taking the lock on five nodes with forks=2 holds at most two takes at once."""
    import threading

    active, peak, guard = [0], [0], threading.Lock()

    class Counted(Node):
        def hold(self, script, *args, what="held command"):
            with guard:
                active[0] += 1
                peak[0] = max(peak[0], active[0])
            try:
                time.sleep(0.1)
                return super().hold(script, *args, what=what)
            finally:
                with guard:
                    active[0] -= 1

    nodes = {}
    for i in range(1, 6):
        (tmp_path / f"spark{i}").mkdir()
        nodes[f"spark{i}"] = Counted(f"spark{i}", tmp_path / f"spark{i}")
    with ClusterLock("lab", nodes, Holder.now("bootstrap"), forks=2):
        pass
    assert peak[0] == 2


def test_the_holder_script_speaks_with_the_mark_the_controller_reads():
    printed = [line for line in lockmod.hold_script().splitlines() if "echo" in line]
    assert printed and all(f'"{lockmod.MARK} ' in line for line in printed), printed
