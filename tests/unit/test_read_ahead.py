"""Reads ahead (tasks/read_ahead.py): a later task's read script, sent with a node's first facts read, counts for
that task only when it is the same script and nothing changed since; in every other case the task reads for
itself. Run for real on this machine (the facts script and the reads through a local bash)."""

from __future__ import annotations

import os
import subprocess
import time

import pytest

from sparkctl.facts import gather_facts
from sparkctl.facts.script import SIDE_GRACE_S, SideRead, render_script
from sparkctl.taskgraph.events import Event
from sparkctl.tasks.context import ClusterContext, NodeContext, RunOptions
from sparkctl.tasks.read_ahead import BUDGET_S, PLACEHOLDER, RECORD, ReadsAhead, answer
from sparkctl.transport.framing import Framing, Section
from sparkctl.transport.local import LocalTransport
from tests.taskkit import inventory


class Records(dict):
    def put(self, key, value):
        if value is None:
            self.pop(key, None)
        else:
            self[key] = value


def test_side_reads_run_beside_the_facts_each_within_its_seconds(tmp_path):
    facts = gather_facts(LocalTransport("local"), "local", hf_cache=str(tmp_path),
                         side_reads={"quick": ("printf 'a\\nb\\n'", 5.0), "slow": ("sleep 5; echo late", 1.0),
                                     "odd name's": ("exit 3", 5.0)})
    assert facts.hostname and facts.raw_errors == []
    assert (facts.side_reads["quick"].output, facts.side_reads["quick"].rc) == ("a\nb\n", 0)
    assert facts.side_reads["slow"].rc == 124 and "late" not in facts.side_reads["slow"].output  # cut: not used
    assert facts.side_reads["odd name's"].rc == 3


def test_a_side_read_that_ended_counts_though_another_of_its_bash_is_cut(tmp_path):
    """The reads of one bound share a bash: one still running when their `timeout` ends them costs only itself (the
    first is started first, so an exit status written in turn would have lost the quick one's)."""
    facts = gather_facts(LocalTransport("local"), "local", hf_cache=str(tmp_path),
                         side_reads={"slow": ("sleep 5; echo late", 1.0), "quick": ("echo done", 1.0)})
    assert (facts.side_reads["quick"].output, facts.side_reads["quick"].rc) == ("done\n", 0)
    assert facts.side_reads["slow"].rc == 124 and "late" not in facts.side_reads["slow"].output


@pytest.mark.slow
def test_a_side_read_still_running_after_the_grace_is_left_out_and_the_facts_are_not_held(tmp_path):
    marker = tmp_path / "finished"
    stuck = f"sleep {SIDE_GRACE_S + 27.25:g}"  # a command line no other process has
    facts = gather_facts(LocalTransport("local"), "local", hf_cache=str(tmp_path),
                         side_reads={"stuck": (f"echo partial; {stuck}; touch {marker}", 60.0)})
    assert facts.hostname and facts.raw_errors == []
    assert facts.side_reads["stuck"].rc != 0 and facts.side_reads["stuck"].output == ""  # its task reads itself
    assert not marker.exists()  # the round trip ended before the side read could have
    # and it was stopped, not left running beside the read its task now makes for itself
    deadline = time.monotonic() + 20  # still well before the stuck read would have ended by itself
    while subprocess.run(["pgrep", "-f", stuck], capture_output=True).returncode == 0:
        if time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert subprocess.run(["pgrep", "-f", stuck], capture_output=True).returncode != 0


@pytest.mark.slow
def test_facts_slow_to_read_give_the_side_reads_as_long_again(tmp_path):
    """A node under load is slow for the facts and for the reads beside them alike: facts that took 5 s leave a side
    read 5 s more, not SIDE_GRACE_S (one taking 9 s in all is kept; with 3 s more it was cut at 8)."""
    from sparkctl.facts.script import render_script

    assert SIDE_GRACE_S < 4
    script = render_script("n", hf_cache=str(tmp_path), side_reads={"loaded": ("sleep 9; echo done", 30.0)})
    slow_facts = 'id() { command sleep 5; command id "$@"; }\n'
    out = subprocess.run(["bash", "-c", slow_facts + script], capture_output=True, text=True, timeout=60)
    loaded = Framing("n").split(out.stdout)["side:0"]
    assert (loaded.rc, loaded.output) == (0, "done\n")


def test_side_reads_without_a_temp_dir_are_not_run_and_arm_no_stopper(tmp_path):
    """The stopper that ends side reads still running SIDE_GRACE_S after the facts is only armed when some ran:
    without a private temp dir there are none, and a bare `wait` would have waited for the stopper itself."""
    from sparkctl.facts.script import render_script

    log = tmp_path / "sleeps"
    script = render_script("n", hf_cache=str(tmp_path), side_reads={"quick": ("echo done", 5.0)})
    stub = f'sleep() {{ echo "$*" >> {log}; command sleep "$@"; }}\n'
    for prelude, expected in (("", (0, "done\n")), ("mktemp() { return 1; }\n", (1, ""))):
        log.unlink(missing_ok=True)
        out = subprocess.run(["bash", "-c", stub + prelude + script], capture_output=True, text=True, timeout=60)
        quick = Framing("n").split(out.stdout)["side:0"]
        assert (quick.rc, quick.output) == expected
    assert not log.exists()


def test_nothing_left_behind_holds_the_round_trip_s_output_once_the_facts_are_sent(tmp_path):
    """The round trip ends when the last holder of its stdout does: once the facts script has exited, no job it
    started in the background (the side reads' stopper, still sleeping, among them) may hold it."""
    import fcntl

    from sparkctl.facts.script import render_script

    # a side read that takes a moment: the stopper is surely asleep when it is called off
    script = render_script("n", hf_cache=str(tmp_path), side_reads={"quick": ("sleep 0.5; echo done", 5.0)})
    proc = subprocess.Popen(["bash", "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    out = b""
    while chunk := os.read(proc.stdout.fileno(), 1 << 20):
        out += chunk
        if b"end side:0" in out:
            break
    proc.wait(timeout=60)
    for pipe in (proc.stdout, proc.stderr):
        fcntl.fcntl(pipe.fileno(), fcntl.F_SETFL, os.O_NONBLOCK)
        try:
            while os.read(pipe.fileno(), 1 << 20):
                pass  # the rest of what was written; then end of file, not "would block"
        except BlockingIOError:
            pytest.fail("a process the facts script left behind still holds its output open")
    assert Framing("n").split(out.decode())["side:0"].output == "done\n"


@pytest.mark.parametrize("who", ["nopasswd", "password"])
def test_a_root_read_runs_in_the_facts_root_shell_and_only_where_sudo_needs_no_password(users, who):
    """A root read costs no sudo of its own: the facts' one root shell runs it after its sections. Where sudo
    wants a password there is no root shell, and the read does not run as the user instead (its task reads its own
    way); a user's read beside it runs either way."""
    from tests.unit.ssh_kit import NOPASSWD_USER, SUDO_USER, counting_sudo

    user = SUDO_USER if who == "password" else NOPASSWD_USER
    script = render_script("n", side_reads={
        "inside": SideRead("id -u; [ -r /etc/shadow ] && echo shadow; exit 3", 5.0, root=True),
        "user's": ("id -un", 5.0)})
    with counting_sudo() as (path, sudo_calls):
        out = subprocess.run(["runuser", "-u", user, "--", "env", f"PATH={path}", "bash", "-c", script],
                             capture_output=True, text=True, timeout=60).stdout
        asked = sudo_calls()
    sections = Framing("n").split(out)
    assert asked == ["-n bash"], asked
    assert (sections["side:1"].rc, sections["side:1"].output) == (0, f"{user}\n")
    if who == "nopasswd":
        assert (sections["side:0"].rc, sections["side:0"].output) == (3, "0\nshadow\n")
    else:
        assert (sections["side:0"].rc, sections["side:0"].output) == (1, "")


def test_a_root_read_that_does_not_end_is_cut_at_its_seconds_and_the_facts_come(tmp_path):
    """The facts wait for the root shell, and no stopper of the user's may end a process of root's: the root reads
    are bounded by their own `timeout`; one cut prints nothing that counts, and nothing of it is left running."""
    marker = tmp_path / "finished"
    stuck = "sleep 31.75"  # a command line no other process has
    facts = gather_facts(LocalTransport("local"), "local", hf_cache=str(tmp_path),
                         side_reads={"stuck": SideRead(f"echo partial; {stuck}; touch {marker}", 2.0, root=True)})
    assert facts.hostname and facts.raw_errors == [] and not marker.exists()
    assert (facts.side_reads["stuck"].rc, facts.side_reads["stuck"].output) == (1, "")
    assert subprocess.run(["pgrep", "-f", stuck], capture_output=True).returncode != 0


def test_a_root_read_is_kept_as_one_and_counts_only_as_one():
    records = Records()
    first = ReadsAhead(records)
    framing = Framing()
    first.remember("spark1", "inside", f"echo {framing.nonce}", framing, 60.0, root=True)
    first.remember("spark1", "plain", f"echo {framing.nonce}", framing, 60.0)
    first.save()
    assert records[RECORD]["spark1"] == {"inside": [f"echo {PLACEHOLDER}", 60.0, True],
                                         "plain": [f"echo {PLACEHOLDER}", 60.0]}
    second = ReadsAhead(records)
    reads = second.side_reads("spark1")
    assert reads["inside"].root and not reads["plain"].root
    sent = second.sent("spark1", "inside")
    section = Section("side:0", f"{sent.nonce}\n", 0)  # what it printed: its nonce
    now = Framing()
    assert answer(section, sent, f"echo {PLACEHOLDER}", now, root=True) == f"{now.nonce}\n"
    assert answer(section, sent, f"echo {PLACEHOLDER}", now, root=False) is None  # a user's read is another read
    assert answer(section, second.sent("spark1", "plain"), f"echo {PLACEHOLDER}", now, root=True) is None


def test_the_record_keeps_each_task_script_with_a_placeholder_and_sends_it_with_a_fresh_nonce():
    records = Records()
    first = ReadsAhead(records)
    assert first.side_reads("spark1") == {}
    framing = Framing()
    first.remember("spark1", "ssh.keys", f"echo {framing.nonce}", framing, 300.0)
    first.save()
    assert records[RECORD] == {"spark1": {"ssh.keys": [f"echo {PLACEHOLDER}", 300.0]}}
    second = ReadsAhead(records)
    (script, seconds, root), = second.side_reads("spark1").values()
    sent = second.sent("spark1", "ssh.keys")
    assert script == f"echo {sent.nonce}" and sent.nonce != framing.nonce and seconds == BUDGET_S and not root
    assert second.side_reads("spark2") == {}


def test_a_record_that_is_not_sparkctls_is_ignored():
    for junk in ("x", ["a"], {"spark1": {"t": ["no placeholder", 5]}}, {"spark1": {"t": [f"{PLACEHOLDER}", -1]}},
                 {"spark1": {"t": [1, 2]}}, {"spark1": "t"}, {"spark1": {"t": [f"{PLACEHOLDER}", 5, False]}},
                 {"spark1": {"t": [f"{PLACEHOLDER}", 5, "root"]}}, {"spark1": {"t": [f"{PLACEHOLDER}", True]}}):
        assert ReadsAhead(Records({RECORD: junk})).side_reads("spark1") == {}


class Run:
    """One run's contexts for spark1 of the two-Spark inventory, on this machine, with the shared records."""

    def __init__(self, records: Records, path):
        self.inventory = inventory()
        self.cluster = ClusterContext(self.inventory, RunOptions(), lambda event: None, records=records)
        self.transport = LocalTransport("spark1")
        self.node = NodeContext(self.cluster, self.inventory.node("spark1"), self.transport)
        self.cluster.add(self.node)
        self.path = path

    def read(self, script_of=lambda f, path: f.section("file", f"cat {path}")):
        framing = Framing()
        result = self.node.read("t", script_of(framing, self.path), framing)
        return framing.split(result.stdout)["file"].output

    def end(self):
        self.cluster.reads_ahead.save()


def rerun(tmp_path, script_of=None) -> tuple[Run, Run]:
    """A first run that reads file f (and records its script), then a second run whose facts were just read."""
    records, path = Records(), tmp_path / "f"
    path.write_text("one\n")
    first = Run(records, path)
    first.node.facts()
    first.read(script_of) if script_of else first.read()
    first.end()
    second = Run(records, path)
    second.node.facts()
    return first, second


def test_a_no_op_rerun_takes_the_read_from_the_facts_round_trip(tmp_path):
    first, second = rerun(tmp_path)
    assert first.transport.round_trips == 2  # nothing on record yet: facts, then the task's own read
    assert second.read() == "one\n" and second.transport.round_trips == 1  # read with the facts


def test_a_change_applied_since_the_facts_voids_the_read_ahead(tmp_path):
    _, second = rerun(tmp_path)
    second.path.write_text("two\n")  # what a task of this run changed...
    second.cluster.note(Event("task_changes", node="spark2", task="ssh.mesh"))  # ...and said so
    assert second.read() == "two\n" and second.transport.round_trips == 2


def test_facts_read_again_void_the_read_ahead(tmp_path):
    _, second = rerun(tmp_path)
    second.path.write_text("two\n")
    second.node.invalidate()
    second.node.facts()  # a change on the node made its facts stale: read again, no reads ahead this time
    assert second.read() == "two\n" and second.transport.round_trips == 3


def test_another_script_than_the_one_on_record_is_run(tmp_path):
    _, second = rerun(tmp_path)
    (tmp_path / "g").write_text("gee\n")
    other = second.read(lambda f, _p: f.section("file", f"cat {tmp_path / 'g'}"))  # the plan moved
    assert other == "gee\n" and second.transport.round_trips == 2


def test_a_read_ahead_that_failed_is_run_again_by_its_task(tmp_path):
    flaky = tmp_path / "flaky"
    script = lambda f, p: f.section("file", f"cat {p}") + f"\n[ -e {flaky} ] || exit 7"  # noqa: E731
    _, second = rerun(tmp_path, script)  # the second run's read ahead exits 7
    flaky.write_text("")
    assert second.read(script) == "one\n" and second.transport.round_trips == 2


def _two_runs(tmp_path, first_read):
    """A first run that reads with `first_read(node)` (recording it), then a second run whose facts were just
    read (carrying it)."""
    records = Records()
    first = Run(records, tmp_path / "f")
    first.node.facts()
    first_read(first.node)
    first.end()
    second = Run(records, tmp_path / "f")
    second.node.facts()
    return first, second


def test_a_plain_command_read_is_taken_from_the_facts_round_trip_only_when_it_succeeded(tmp_path):
    (tmp_path / "f").write_text("one\n")
    command = f"cat {tmp_path / 'f'}; [ -e {tmp_path / 'fail'} ] && echo broken >&2 && exit 4; true"
    seen = []
    first, second = _two_runs(tmp_path, lambda node: seen.append(node.read_output("t", command)))
    assert first.transport.round_trips == 2 and seen[0].stdout == "one\n"  # nothing on record: run as it is
    result = second.node.read_output("t", command)
    assert (result.exit_code, result.stdout) == (0, "one\n") and second.transport.round_trips == 1
    (tmp_path / "fail").write_text("")
    _, third = _two_runs(tmp_path, lambda node: node.read_output("t", command))
    result = third.node.read_output("t", command)  # its read ahead failed: the task meets the failure itself
    assert (result.exit_code, result.stderr) == (4, "broken\n") and third.transport.round_trips == 2


def test_a_file_read_ahead_is_the_file_as_transport_read_reads_it(tmp_path):
    path = tmp_path / "f"
    for text in ("no newline at the end", "two\nlines\n\n", ""):
        path.write_text(text)
        _, second = _two_runs(tmp_path, lambda node: node.read_file("t", str(path)))
        ahead = second.node.read_file("t", str(path))
        assert second.transport.round_trips == 1  # the facts carried it
        assert ahead == text == second.transport.read(str(path))
    path.unlink()
    _, second = _two_runs(tmp_path, lambda node: node.read_file("t", str(path)))
    assert second.node.read_file("t", str(path)) is None  # absent: read (and told) by transport.read


def test_a_read_not_to_be_read_ahead_is_run_and_leaves_no_record(tmp_path):
    """A read only `run` (one that runs mpirun for want of a proof): the next run's facts carry nothing for it,
    and the task reads for itself; what it reads then is kept as usual."""
    (tmp_path / "f").write_text("one\n")
    script = lambda f, p: f.section("file", f"cat {p}")  # noqa: E731

    def costly(node):
        framing = Framing()
        node.run(script(framing, tmp_path / "f"))

    first, second = _two_runs(tmp_path, costly)
    assert first.transport.round_trips == 2 and second.cluster.reads_ahead.side_reads("spark1") == {}
    assert second.read(script) == "one\n" and second.transport.round_trips == 2  # read for itself, recorded
    second.end()
    third = Run(second.cluster.records, tmp_path / "f")
    third.node.facts()
    assert third.read(script) == "one\n" and third.transport.round_trips == 1


def test_reads_across_the_cluster_count_only_while_every_node_keeps_its_first_facts(tmp_path):
    """A ping or a try from one node depends on its peers: once a peer's facts were read again (network.verify
    waits for a link to come up), what was read beside the first facts is not taken, on any node."""
    (tmp_path / "f").write_text("one\n")
    records = Records()

    def run():
        inv = inventory()
        cluster = ClusterContext(inv, RunOptions(), lambda event: None, records=records)
        for name in ("spark1", "spark2"):
            cluster.add(NodeContext(cluster, inv.node(name), LocalTransport(name)))
        for node in cluster.nodes.values():
            node.facts()
        return cluster

    commands = {"spark1": f"cat {tmp_path / 'f'}", "spark2": "echo two"}
    first = run()
    first.read_on_all("t", commands)
    first.reads_ahead.save()
    quiet = run()
    assert quiet.read_on_all("t", commands)["spark1"].stdout == "one\n"
    assert [n.transport.round_trips for n in quiet.nodes.values()] == [1, 1]  # read beside the facts
    moved = run()
    (tmp_path / "f").write_text("changed\n")
    moved.nodes["spark2"].invalidate()
    moved.nodes["spark2"].facts()  # a peer read again
    assert moved.read_on_all("t", commands)["spark1"].stdout == "changed\n"
    assert [n.transport.round_trips for n in moved.nodes.values()] == [2, 3]  # every node read first hand


def test_forks_bounds_how_many_nodes_a_cluster_task_works_on_at_once():
    """`--forks` reaches the cluster context's own pools (they took 32 whatever was asked)."""
    import threading

    from tests.taskkit import inventory as example
    from tests.taskkit import make_kit, spark_facts

    inv = example("four-sparks-ring.yaml")
    facts = {n.name: spark_facts(n.name) for n in inv.nodes}
    running, most = [0], [0]
    lock = threading.Lock()

    def one_at_a_time():
        with lock:
            running[0] += 1
            most[0] = max(most[0], running[0])
        time.sleep(0.05)
        with lock:
            running[0] -= 1

    make_kit(inv, facts, RunOptions(forks=1)).cluster.each_node({n.name: one_at_a_time for n in inv.nodes})
    assert most[0] == 1
    together = threading.Barrier(len(inv.nodes), timeout=30)  # broken unless all four run at once
    make_kit(inv, facts, RunOptions(forks=4)).cluster.each_node({n.name: together.wait for n in inv.nodes})


@pytest.mark.skipif(os.geteuid() != 0, reason="root reads run where the facts' shell is root (or sudo asks nothing)")
def test_the_last_root_read_runs_in_the_reads_bash_and_its_status_lands_in_the_temp_dir_wherever_it_went(tmp_path):
    """The last root read runs in the reads' own bash (a subshell fewer): it may change the working directory (the
    container's read enters the container's root) and set any variable, and its exit status is still written where
    the facts look, nothing where it went; one before it that ends by `exit` ends alone."""
    elsewhere = tmp_path / "container-root"
    elsewhere.mkdir()
    facts = gather_facts(LocalTransport("local"), "local", hf_cache=str(tmp_path), side_reads={
        "first": SideRead("cd /; echo first; exit 5", 5.0, root=True),
        "last": SideRead(f"cd {elsewhere}; _c=x; _p=y; echo here", 5.0, root=True)})
    assert (facts.side_reads["first"].rc, facts.side_reads["first"].output) == (5, "first\n")
    assert (facts.side_reads["last"].rc, facts.side_reads["last"].output) == (0, "here\n")
    assert list(elsewhere.iterdir()) == []
    for script, expected in ((f"cd {elsewhere}; echo there; exit 6", (6, "there\n")),
                             # the name of its status file is not the read's to change: trying ends it, a failure
                             (f"cd {elsewhere}; _sr_rc=here; echo there", (1, ""))):
        failed = gather_facts(LocalTransport("local"), "local", hf_cache=str(tmp_path),
                              side_reads={"last": SideRead(script, 5.0, root=True)})
        assert (failed.side_reads["last"].rc, failed.side_reads["last"].output) == expected
        assert list(elsewhere.iterdir()) == []
