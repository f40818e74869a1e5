"""The engine against fake tasks on in-memory nodes (dicts): graph, runner semantics, events, journal."""

from __future__ import annotations

import json
import threading
import time

import pytest

from sparkctl.errors import Interrupted, Unreachable
from sparkctl.exitcodes import ExitStatus
from sparkctl.runs.journal import Journal, latest_runs, read_run
from sparkctl.secrets import MASK, forget_secrets, register_secret
from sparkctl.taskgraph import (
    CLUSTER_ROW,
    Change,
    Event,
    EventBus,
    Graph,
    GraphError,
    Interruption,
    Runner,
    Scope,
    Status,
    Task,
    TaskFailed,
    UnknownSelection,
)
from sparkctl.taskgraph.events import SCHEMA_VERSION

NODES = ["spark1", "spark2", "spark3"]


class Node:
    """An in-memory node: its state is a dict; `broken` keys refuse to be written."""

    def __init__(self, name: str):
        self.name = name
        self.state: dict[str, str] = {}
        self.broken: set[str] = set()


class Ensure(Task):
    """Wants `state[key] == value` on a node (or on every node, for cluster scope)."""

    def __init__(self, name: str, phase: str = "base", needs: tuple[str, ...] = (), key: str | None = None,
                 value: str = "on", scope: Scope = Scope.NODE, on_check=None):
        self.name, self.phase, self.needs, self.scope = name, phase, tuple(needs), scope
        self.key, self.value, self.on_check = key or name, value, on_check
        self.applied: list[str] = []
        self.checked: list[str] = []
        self._lock = threading.Lock()

    def _nodes(self, ctx) -> list[Node]:
        return list(ctx.values()) if self.scope is Scope.CLUSTER else [ctx]

    def check(self, ctx) -> list[Change]:
        if self.on_check:
            self.on_check(ctx)
        with self._lock:
            self.checked.append(getattr(ctx, "name", CLUSTER_ROW))
        return [Change(f"set {self.key}={self.value} on {n.name}",
                       diff=f"-{n.state.get(self.key)}\n+{self.value}\n", payload=n,
                       node=n.name if self.scope is Scope.CLUSTER else None)
                for n in self._nodes(ctx) if n.state.get(self.key) != self.value]

    def apply(self, ctx, changes: list[Change]) -> None:
        for change in changes:
            node = change.payload
            with self._lock:
                self.applied.append(node.name)
            if self.key not in node.broken:
                node.state[self.key] = self.value


class Fails(Ensure):
    def __init__(self, name: str, on: set[str], error: Exception | None = None, **kw):
        super().__init__(name, **kw)
        self.on, self.error = on, error

    def check(self, ctx) -> list[Change]:
        if getattr(ctx, "name", None) in self.on:
            raise self.error or TaskFailed("netplan rejected the file", hint="see journalctl",
                                           details=["line 3: bad"])
        return super().check(ctx)


def make_nodes(names=NODES) -> dict[str, Node]:
    return {n: Node(n) for n in names}


def run(tasks, phases=("base", "net", "serve"), *, nodes=None, unreachable=None, only=None, skip=None,
        **kw):
    nodes = nodes if nodes is not None else make_nodes()
    events: list[Event] = []
    graph = Graph(list(tasks), list(phases))
    if only or skip:
        graph = graph.select(only, skip)
    runner = Runner(graph, nodes=list(nodes), node_contexts=nodes, cluster_context=nodes,
                    unreachable=unreachable or {}, emit=events.append, **kw)
    return runner.run(), events, nodes


def statuses(result, task: str) -> dict[str, str]:
    return {o.node or CLUSTER_ROW: o.status.value for o in result.outcomes if o.task == task}


# -- graph -------------------------------------------------------------------------------------------

def test_ordered_is_phase_by_phase_topological_and_stable():
    tasks = [Ensure("serve.up", "serve", needs=("net.b",)), Ensure("net.b", "net", needs=("net.a",)),
             Ensure("net.c", "net"), Ensure("net.a", "net"), Ensure("base.x", "base")]
    order = [t.name for t in Graph(tasks, ["base", "net", "serve"]).ordered()]
    assert order == ["base.x", "net.c", "net.a", "net.b", "serve.up"]


@pytest.mark.parametrize("tasks, message", [
    ([Ensure("a"), Ensure("a")], "duplicate task name 'a'"),
    ([Ensure("net.addr", needs=("net.adr",))], "did you mean 'net.addr'"),
    ([Ensure("a", needs=("b",)), Ensure("b", needs=("a",))], "cycle in phase base among: a, b"),
    ([Ensure("a", "base", needs=("b",)), Ensure("b", "net")], "from the later phase net"),
    ([Ensure("a", "bsae")], "unknown phase 'bsae' (did you mean 'base'?)"),
])
def test_graph_rejects_bad_definitions(tasks, message):
    with pytest.raises(GraphError, match=message.replace("(", r"\(").replace(")", r"\)").replace("?", r"\?")):
        Graph(tasks, ["base", "net"])


def test_select_by_phase_and_task_and_unknown_names():
    graph = Graph([Ensure("base.x"), Ensure("net.a", "net"), Ensure("net.b", "net")], ["base", "net"])
    assert graph.select({"net"}, None).selected == {"net.a", "net.b"}
    assert graph.select({"net"}, {"net.b"}).selected == {"net.a"}
    assert graph.select(None, {"base"}).selected == {"net.a", "net.b"}
    with pytest.raises(ValueError, match=r"unknown task or phase 'net.bb' \(did you mean 'net.b'\?\)"):
        graph.select({"net.bb"}, None)


# -- runner ------------------------------------------------------------------------------------------

def test_converges_then_a_rerun_changes_nothing():
    task = Ensure("base.x")
    result, events, nodes = run([task])
    assert statuses(result, "base.x") == dict.fromkeys(NODES, "changed")
    assert sorted(task.applied) == NODES and all(n.state["base.x"] == "on" for n in nodes.values())
    assert result.exit_status() == ExitStatus.SUCCESS
    assert [e.event for e in events][0] == "run_start" and events[-1].event == "recap"
    assert {e.node for e in events if e.event == "task_changes"} == set(NODES)

    again, _, _ = run([task], nodes=nodes)
    assert statuses(again, "base.x") == dict.fromkeys(NODES, "ok")
    assert again.recap()["spark1"] == {"ok": 1, "changed": 0, "failed": 0, "skipped": 0, "unreachable": 0}


def test_node_tasks_run_in_parallel_bounded_by_forks_with_a_barrier_at_the_end_of_a_phase():
    meet = threading.Barrier(2, timeout=5)  # breaks (-> failed task) unless two nodes really run together
    live, peak, finished_first = [0], [0], []
    guard = threading.Lock()

    def busy(ctx):
        if ctx.name in finished_first:  # the re-check after apply
            return
        with guard:
            live[0] += 1
            peak[0] = max(peak[0], live[0])
        meet.wait()
        time.sleep(0.02)
        with guard:
            live[0] -= 1
            finished_first.append(ctx.name)

    def next_phase(ctx):
        assert len(finished_first) == 6, "the next phase started before the previous one ended everywhere"

    names = [f"spark{i}" for i in range(1, 7)]
    result, _, _ = run([Ensure("base.a", on_check=busy), Ensure("net.b", "net", on_check=next_phase)],
                       nodes=make_nodes(names), forks=2)
    assert peak[0] == 2
    assert {o.status for o in result.outcomes} == {Status.CHANGED}, [o.message for o in result.outcomes]


def test_a_slow_node_holds_the_others_up_only_at_a_cluster_task():
    """Node tasks in a row of one phase: each node walks them at its own pace; a cluster task meets them all."""
    slow_started, fast_done = threading.Event(), threading.Event()

    def hold_spark2(ctx):
        if ctx.name == "spark2" and not slow_started.is_set():
            slow_started.set()
            assert fast_done.wait(5), "spark1 waited for spark2 between two node tasks"

    def note_fast(ctx):
        if ctx.name == "spark1":
            fast_done.set()

    seen_by_cluster = []
    tasks = [Ensure("base.a", on_check=hold_spark2), Ensure("base.b", needs=("base.a",), on_check=note_fast),
             Ensure("base.all", needs=("base.b",), scope=Scope.CLUSTER,
                    on_check=lambda ctx: seen_by_cluster.append(sorted(n.name for n in ctx.values()
                                                                       if n.state.get("base.b") == "on")))]
    result, events, _ = run(tasks, nodes=make_nodes(["spark1", "spark2"]))
    assert result.exit_status() == ExitStatus.SUCCESS, [o.message for o in result.outcomes]
    order = [(e.task, e.node) for e in events if e.event == "task_result"]
    assert order.index(("base.b", "spark1")) < order.index(("base.a", "spark2"))
    assert seen_by_cluster[0] == ["spark1", "spark2"]  # the cluster task waited for both


def test_a_failure_stops_its_dependents_on_that_node_only():
    tasks = [Fails("base.a", on={"spark2"}), Ensure("base.b", needs=("base.a",)),
             Ensure("net.c", "net", needs=("base.b",)), Ensure("net.free", "net")]
    result, events, _ = run(tasks)
    assert statuses(result, "base.a") == {"spark1": "changed", "spark2": "failed", "spark3": "changed"}
    assert statuses(result, "net.c") == {"spark1": "changed", "spark2": "skipped", "spark3": "changed"}
    assert statuses(result, "net.free") == dict.fromkeys(NODES, "changed")
    assert result.outcome("net.c", "spark2").message == "needs base.a, failed on spark2"
    failed = next(e for e in events if e.event == "task_result" and e.status == "failed")
    assert (failed.message, failed.hint, failed.details) == ("netplan rejected the file", "see journalctl",
                                                             ["line 3: bad"])
    assert result.recap()["spark2"] == {"ok": 0, "changed": 1, "failed": 1, "skipped": 2, "unreachable": 0}
    assert result.exit_status() == ExitStatus.TASK_FAILED


def test_cluster_task_needs_every_node_and_blocks_its_dependents():
    tasks = [Fails("network.netplan", on={"spark2"}),
             Ensure("mesh.keys", "net", needs=("network.netplan",), scope=Scope.CLUSTER),
             Ensure("mesh.check", "net", needs=("mesh.keys",)),
             Ensure("mesh.other", "net", scope=Scope.CLUSTER)]
    result, _, _ = run(tasks)
    keys = result.outcome("mesh.keys")
    assert keys.status is Status.SKIPPED and keys.message == "needs network.netplan, failed on spark2"
    # spark1 is fine itself, but what it needs did not run: skipped, with the root cause.
    assert statuses(result, "mesh.check") == dict.fromkeys(NODES, "skipped")
    assert result.outcome("mesh.check", "spark1").message == "needs network.netplan, failed on spark2"
    assert result.outcome("mesh.other").status is Status.CHANGED
    assert result.recap()[CLUSTER_ROW] == {"ok": 0, "changed": 1, "failed": 0, "skipped": 1, "unreachable": 0}


def test_apply_that_does_not_stick_is_did_not_converge():
    nodes = make_nodes()
    nodes["spark3"].broken.add("base.x")
    result, _, _ = run([Ensure("base.x")], nodes=nodes)
    failed = result.outcome("base.x", "spark3")
    assert failed.status is Status.FAILED
    assert failed.message == "did not converge: set base.x=on on spark3"
    assert result.exit_status() == ExitStatus.TASK_FAILED


def test_check_mode_applies_nothing_and_exits_4():
    task = Ensure("base.x")
    result, events, nodes = run([task], check_mode=True)
    assert task.applied == [] and all(not n.state for n in nodes.values())
    assert statuses(result, "base.x") == dict.fromkeys(NODES, "changed")
    results = [e for e in events if e.event == "task_result"]
    assert all(e.would_change and e.changes[0]["summary"].startswith("set base.x") for e in results)
    assert not [e for e in events if e.event == "task_changes"]
    assert result.exit_status() == ExitStatus.CHANGES_PENDING
    assert events[-1].to_dict()["exit_status"] == 4 and events[-1].check_mode is True


def test_check_mode_without_changes_exits_0():
    nodes = make_nodes()
    for n in nodes.values():
        n.state["base.x"] = "on"
    result, _, _ = run([Ensure("base.x")], nodes=nodes, check_mode=True)
    assert result.exit_status() == ExitStatus.SUCCESS


def test_only_runs_what_the_selected_tasks_need_and_names_it():
    a, b = Ensure("base.a"), Ensure("net.b", "net", needs=("base.a",))
    graph = Graph([a, b, Ensure("net.c", "net")], ["base", "net", "serve"]).select({"net.b"})
    assert graph.selected == {"base.a", "net.b"} and graph.added == ("base.a",)
    result, events, _ = run([a, b, Ensure("net.c", "net")], only={"net.b"})
    assert sorted(a.checked) == sorted(NODES * 2)  # checked, applied, checked again
    assert statuses(result, "net.b") == dict.fromkeys(NODES, "changed")
    assert statuses(result, "net.c") == dict.fromkeys(NODES, "skipped")
    assert result.outcome("net.c", "spark1").message.startswith("not selected")
    skipped = [e.to_dict() for e in events if e.event == "task_result" and e.status == "skipped"]
    assert skipped and all(d["reason"] == "not_selected" for d in skipped)


class AsksEarly(Ensure):
    """A read-only task that notes when the runner asks it to start its early ask."""

    def __init__(self, name: str, log: list[str], read_only: bool = True, **kw):
        super().__init__(name, **kw)
        self.read_only, self.log = read_only, log

    def ask_early(self, ctx) -> None:
        self.log.append(f"early {self.name}")

    def check(self, ctx) -> list[Change]:
        self.log.append(f"check {self.name}")
        return super().check(ctx)


def test_read_only_cluster_tasks_selected_are_asked_to_start_early_as_the_run_begins():
    log: list[str] = []
    tasks = [AsksEarly("base.a", log), AsksEarly("serve.smoke", log, phase="serve", scope=Scope.CLUSTER),
             AsksEarly("serve.changes", log, phase="serve", scope=Scope.CLUSTER, read_only=False),
             AsksEarly("serve.left", log, phase="serve", scope=Scope.CLUSTER)]
    run(tasks, skip={"serve.left"}, forks=1)
    assert log[0] == "early serve.smoke" and log.count("early serve.smoke") == 1
    assert not [entry for entry in log if entry.startswith("early") and "smoke" not in entry]
    assert log.index("early serve.smoke") < log.index("check base.a")


def test_a_need_left_out_by_skip_blocks_what_needs_it():
    a, b = Ensure("base.a"), Ensure("net.b", "net", needs=("base.a",))
    free = Ensure("net.free", "net")
    graph = Graph([a, b, free], ["base", "net"]).select(None, {"base"})
    assert graph.left_out == {"base.a"}
    result, _, _ = run([a, b, free], skip={"base"})
    assert a.checked == [] and b.checked == []
    assert statuses(result, "net.b") == dict.fromkeys(NODES, "skipped")
    assert result.outcome("net.b", "spark2").message == "needs base.a, left out by --skip"
    assert statuses(result, "net.free") == dict.fromkeys(NODES, "changed")


def test_a_task_with_nothing_to_do_for_the_inventory_is_skipped_with_its_reason_and_blocks_nothing():
    class OnlyFor(Ensure):
        def not_applicable(self, ctx):
            return None if ctx.name == "spark1" else "vLLM serves: no MPI hostfile (TensorRT-LLM's)"

    hostfile = OnlyFor("net.hostfile", "net")
    after = Ensure("serve.after", "serve", needs=("net.hostfile",))
    result, events, nodes = run([hostfile, after])
    assert statuses(result, "net.hostfile") == {"spark1": "changed", "spark2": "skipped", "spark3": "skipped"}
    assert hostfile.checked == ["spark1", "spark1"] and "net.hostfile" not in nodes["spark2"].state  # check, recheck
    assert result.outcome("net.hostfile", "spark2").message == "vLLM serves: no MPI hostfile (TensorRT-LLM's)"
    assert statuses(result, "serve.after") == dict.fromkeys(NODES, "changed")
    skipped = [e for e in events if e.event == "task_result" and e.node == "spark3" and e.task == "net.hostfile"]
    assert skipped[0].to_dict()["reason"] == "not_applicable"
    assert result.exit_status() == ExitStatus.SUCCESS


def test_check_mode_answers_every_task_even_when_what_it_needs_would_change():
    """A task whose need would change still checks (its changes are reported); one whose check fails on the
    state its need is about to change, or that only proves what its needs make, says it cannot know yet."""
    make = Ensure("base.make")
    follows = Ensure("net.follows", "net", needs=("base.make",))
    broken_until = Fails("net.reads", on=set(NODES), phase="net", needs=("base.make",))
    prove = Ensure("serve.prove", "serve", needs=("net.reads",), scope=Scope.CLUSTER)
    prove.read_only = True
    after = Ensure("serve.after", "serve", needs=("serve.prove",))
    result, events, _ = run([make, follows, broken_until, prove, after], check_mode=True)
    assert statuses(result, "net.follows") == dict.fromkeys(NODES, "changed")
    reads = result.outcome("net.reads", "spark1")
    assert reads.status is Status.SKIPPED and reads.pending_on == "base.make"
    assert reads.message == "cannot know until base.make is applied (now: netplan rejected the file)"
    assert result.outcome("serve.prove").message == "cannot know until base.make is applied"
    assert prove.checked == []  # a read-only proof is not even tried
    assert statuses(result, "serve.after") == dict.fromkeys(NODES, "changed")  # a pending need does not block
    assert result.exit_status() == ExitStatus.CHANGES_PENDING and not result.failed
    pending = [e.to_dict() for e in events if e.event == "task_result" and e.status == "skipped"]
    assert pending and all(d["reason"] == "pending" and d["pending_on"] == "base.make" for d in pending)
    assert events[-1].to_dict()["pending"] == len(pending)


def test_check_mode_failure_without_a_pending_need_is_a_failure():
    result, _, _ = run([Fails("base.a", on={"spark1"})], check_mode=True)
    assert result.outcome("base.a", "spark1").status is Status.FAILED
    assert result.exit_status() == ExitStatus.TASK_FAILED


def test_recap_says_verified_only_when_the_verify_phase_ran_and_passed():
    tasks = [Ensure("base.a"), Ensure("check.all", "verify", needs=("base.a",), key="base.a",
                                                 scope=Scope.CLUSTER)]

    def go(**kw):
        nodes = make_nodes()
        events: list[Event] = []
        graph = Graph(tasks, ["base", "verify"], verify_phase="verify")
        if kw.get("only") or kw.get("skip"):
            graph = graph.select(kw.pop("only", None), kw.pop("skip", None))
        Runner(graph, nodes=list(nodes), node_contexts=nodes, cluster_context=nodes, unreachable={},
               emit=events.append, **kw).run()
        return events[-1].to_dict()

    assert go()["verified"] is True and "not_verified" not in go()
    skipped = go(skip={"verify"})
    assert skipped["verified"] is False and skipped["not_verified"] == "check.all was not selected"
    assert go(only={"base"})["verified"] is False
    assert "verified" not in go(check_mode=True)


def test_unreachable_node_counts_once_and_blocks_cluster_tasks():
    task = Ensure("base.a")
    result, events, _ = run([task, Ensure("base.b"), Ensure("net.all", "net", scope=Scope.CLUSTER)],
                            unreachable={"spark3": "ssh: connection refused"})
    assert "spark3" not in task.checked
    assert result.recap()["spark3"] == {"ok": 0, "changed": 0, "failed": 0, "skipped": 0, "unreachable": 1}
    assert result.outcome("base.b", "spark3").status is Status.UNREACHABLE
    assert result.outcome("net.all").message == "needs every node, spark3 unreachable"
    assert [e.message for e in events if e.status == "unreachable"] == ["ssh: connection refused"]
    assert result.exit_status() == ExitStatus.UNREACHABLE


def test_node_lost_mid_run_is_unreachable_for_the_rest_of_the_run():
    lost = Fails("base.a", on={"spark2"}, error=Unreachable("spark2: connection reset", hint="is it up?"))
    later = Ensure("net.b", "net")
    result, _, _ = run([lost, later])
    assert result.outcome("base.a", "spark2").status is Status.UNREACHABLE
    assert "spark2" not in later.checked and result.unreachable == {"spark2": "spark2: connection reset"}
    assert result.recap()["spark2"]["unreachable"] == 1
    assert result.exit_status() == ExitStatus.UNREACHABLE


def test_unexpected_exception_is_an_internal_error_with_traceback():
    result, events, _ = run([Fails("base.a", on={"spark1"}, error=KeyError("eth9")), Ensure("base.b")])
    failed = result.outcome("base.a", "spark1")
    assert failed.message == "internal error: KeyError: 'eth9'"
    event = next(e for e in events if e.event == "task_result" and e.status == "failed")
    assert "Traceback" in event.traceback and "KeyError" in event.to_dict()["traceback"]
    assert result.outcome("base.b", "spark1").status is Status.CHANGED  # not a dependent


def test_exit_status_precedence_failed_over_unreachable():
    result, _, _ = run([Fails("base.a", on={"spark1"})], unreachable={"spark2": "down"})
    assert result.exit_status() == ExitStatus.TASK_FAILED


def test_limit_runs_only_the_named_nodes():
    task = Ensure("base.a")
    result, events, _ = run([task], limit={"spark2"})
    assert set(task.checked) == {"spark2"} and list(result.recap()) == ["spark2"]
    assert events[0].to_dict()["nodes"] == ["spark2"]
    with pytest.raises(UnknownSelection, match="did you mean 'spark2'"):
        run([task], limit={"sprak2"})


def test_limit_changes_only_limited_nodes_but_cluster_tasks_see_every_node():
    """Ansible's --limit: the cluster-wide task computes from every node (its context holds them all) and
    applies only what is on the limited node; the rest is reported as left alone, never applied."""
    mesh = Ensure("net.mesh", "net", scope=Scope.CLUSTER)
    seen = []
    mesh.on_check = lambda ctx: seen.append(sorted(ctx))
    result, events, nodes = run([Ensure("base.a"), mesh], limit={"spark2"})
    assert sorted(mesh.applied) == ["spark2"] and "net.mesh" not in nodes["spark1"].state
    assert seen[0] == NODES  # computed from every node, not only the limited one
    outcome = result.outcome("net.mesh")
    assert outcome.status is Status.CHANGED and [c.node for c in outcome.changes] == ["spark2"]
    assert [c.node for c in outcome.outside] == ["spark1", "spark3"]
    warning = next(e for e in events if e.event == "warning" and e.task == "net.mesh")
    assert warning.message == "left alone outside --limit: 2 change(s)"
    assert warning.hint.startswith("run with --limit spark1,spark3")
    assert result.outcome("base.a", "spark1") is None and list(result.recap()) == ["spark2", CLUSTER_ROW]
    assert events[-1].to_dict()["outside_limit"] == 2 and result.exit_status() == ExitStatus.SUCCESS

    again, _, _ = run([Ensure("base.a"), mesh], nodes=nodes, limit={"spark2"})
    assert again.outcome("net.mesh").status is Status.OK
    assert again.outcome("net.mesh").message == "2 change(s) outside --limit left alone"


def test_limit_with_an_unreadable_node_outside_it_refuses_cluster_tasks_naming_it():
    node_task, mesh = Ensure("base.a"), Ensure("net.mesh", "net", scope=Scope.CLUSTER)
    result, events, _ = run([node_task, mesh], limit={"spark1"}, unreachable={"spark3": "spark3: timed out"})
    assert result.outcome("base.a", "spark1").status is Status.CHANGED
    refused = result.outcome("net.mesh")
    assert refused.status is Status.FAILED and mesh.checked == []
    assert refused.message == "cannot read spark3 (outside --limit): spark3: timed out"
    assert "spark3" not in result.recap() and result.exit_status() == ExitStatus.TASK_FAILED
    assert any(e.event == "warning" and e.node == "spark3" for e in events)


def test_durations_and_recap_event_shape():
    result, events, _ = run([Ensure("base.a", on_check=lambda ctx: time.sleep(0.01))])
    assert all(o.duration >= 0.01 for o in result.outcomes)
    recap = events[-1].to_dict()
    assert set(recap) == {"schema", "event", "time", "nodes", "exit_status", "duration", "check_mode"}
    assert recap["nodes"]["spark1"] == {"ok": 0, "changed": 1, "failed": 0, "skipped": 0, "unreachable": 0}
    assert recap["check_mode"] is False
    json.dumps([e.to_dict() for e in events])  # everything JSON-safe


def test_event_to_dict_has_no_noise_and_round_trips():
    event = Event("task_result", task="a", node=None, status=Status.OK, changes=[], would_change=False)
    assert event.to_dict().keys() == {"schema", "event", "time", "task", "status"}
    assert event.to_dict()["schema"] == SCHEMA_VERSION
    assert event.to_dict()["status"] == "ok"
    assert Event.from_dict({**event.to_dict(), "severity": "x"}).data == {"severity": "x"}
    with pytest.raises(ValueError):
        Event("tasks_result")


def test_event_bus_fans_out_in_order():
    first, second = [], []
    bus = EventBus([first.append])
    bus.add(second.append)
    bus.warning("MTU 1500 on enp1s0f1np1", node="spark1", hint="set 9000")
    assert first == second and first[0].event == "warning" and first[0].hint == "set 9000"


# -- journal -----------------------------------------------------------------------------------------

def test_journal_writes_one_file_per_run_and_prunes(tmp_path):
    for i in range(5):
        with Journal(tmp_path, command="bootstrap", keep=3) as journal:
            journal(Event("log", message=f"run {i}"))
    files = sorted(tmp_path.glob("*.jsonl"))
    assert len(files) == 3 and all(f.name.endswith("-bootstrap.jsonl") for f in files)
    assert (files[0].stat().st_mode & 0o777) == 0o600
    newest = latest_runs(2, tmp_path)
    assert [read_run(p)[0]["message"] for p in newest] == ["run 4", "run 3"]


def test_journal_records_a_whole_run_and_default_dir_follows_xdg(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path))
    journal = Journal(command="check")
    result, events, _ = run([Ensure("base.a")], check_mode=True)
    for e in events:
        journal(e)
    journal.close()
    assert journal.path.parent == tmp_path / "sparkctl" / "runs"
    lines = read_run(journal.path)
    assert lines[0]["event"] == "run_start" and lines[-1]["event"] == "recap"
    assert lines[-1]["exit_status"] == 4 and journal.latest_runs(5) == [journal.path]


def test_journal_redacts_registered_secrets(tmp_path):
    register_secret("hf_SECRET")
    try:
        with Journal(tmp_path) as journal:
            journal(Event("task_result", status="failed", message="bad token hf_SECRET", details=["hf_SECRET"]))
    finally:
        forget_secrets()
    text = journal.path.read_text()
    assert "hf_SECRET" not in text and text.count(MASK) == 2


def test_a_broken_sink_stops_the_run_without_starting_more_nodes():
    task = Ensure("base.a")

    def sink(event: Event) -> None:
        if event.event == "task_result":
            raise BrokenPipeError("stdout closed")

    graph = Graph([task], ["base"])
    nodes = make_nodes([f"spark{i}" for i in range(1, 9)])
    runner = Runner(graph, nodes=list(nodes), node_contexts=nodes, cluster_context=nodes, unreachable={},
                    forks=1, emit=sink)
    with pytest.raises(BrokenPipeError):
        runner.run()
    assert len(set(task.checked)) < 8


# -- faults mid-run: attribution, lost nodes, Ctrl-C -------------------------------------------------------

class ReachesPeer(Ensure):
    """A node task that reads a peer on the way (as planning reads every node's facts): the peer is gone."""

    def __init__(self, name: str, peer: str, **kw):
        super().__init__(name, **kw)
        self.peer = peer

    def check(self, ctx) -> list[Change]:
        if ctx.name != self.peer:
            raise Unreachable(f"{self.peer}: stopped answering", node=self.peer)
        return super().check(ctx)


def test_a_peer_lost_during_a_node_task_is_the_peer_s_never_the_node_s():
    tasks = [ReachesPeer("base.a", peer="spark2"), Ensure("base.b"), Ensure("base.c", needs=("base.b",)),
             Ensure("net.all", "net", scope=Scope.CLUSTER)]
    result, events, _ = run(tasks, nodes=make_nodes(["spark1", "spark2"]))
    met = result.outcome("base.a", "spark1")
    assert met.status is Status.SKIPPED and met.lost_node == "spark2"
    assert met.message == "needs spark2, which became unreachable: spark2: stopped answering"
    assert result.unreachable == {"spark2": "spark2: stopped answering"}
    # spark1 finishes every node task that does not need spark2; spark2 does nothing more
    assert statuses(result, "base.b") == {"spark1": "changed"} and statuses(result, "base.c") == {"spark1": "changed"}
    assert result.outcome("net.all").message == "needs every node, spark2 unreachable"
    assert not [o for o in result.outcomes if o.status is Status.FAILED]
    assert result.exit_status() == ExitStatus.UNREACHABLE
    lost = [e for e in events if e.event == "node_lost"]
    assert [(e.node, e.task) for e in lost] == [("spark2", "base.a")]
    recap = events[-1].to_dict()
    ran = {o.task for o in result.outcomes if o.node == "spark2"}  # base.a, unless spark1 lost it first
    assert recap["lost"] == {"spark2": {"reason": "spark2: stopped answering", "during": "base.a",
                                        "undone": [t for t in ("base.a", "base.b", "base.c") if t not in ran]}}
    assert recap["left_undone"] == ["base.a", "net.all"]
    assert recap["nodes"]["spark1"]["unreachable"] == 0 and recap["nodes"]["spark2"]["unreachable"] == 1


def test_a_cluster_task_cut_by_a_lost_node_is_that_node_s_unreachability_not_a_failure():
    def lose_spark3(_ctx):
        raise Unreachable("spark3: the connection was lost while a command ran", node="spark3")

    tasks = [Ensure("base.a"), Ensure("net.all", "net", scope=Scope.CLUSTER, on_check=lose_spark3),
             Ensure("net.after", "net", needs=("net.all",), scope=Scope.CLUSTER), Ensure("serve.b", "serve")]
    result, _, _ = run(tasks)
    cut = result.outcome("net.all")
    assert cut.status is Status.UNREACHABLE and cut.lost_node == "spark3"
    assert result.outcome("net.after").message == "needs every node, spark3 unreachable"
    assert statuses(result, "serve.b") == {"spark1": "changed", "spark2": "changed"}
    assert result.recap()[CLUSTER_ROW]["unreachable"] == 1 and result.recap()["spark3"]["unreachable"] == 1
    assert result.exit_status() == ExitStatus.UNREACHABLE


def test_a_cluster_task_that_only_judges_facts_goes_on_without_a_lost_or_failed_node():
    class Judge(Ensure):
        needs_every_node = False

    judged = []
    tasks = [Fails("base.a", on={"spark2"}), ReachesPeer("base.b", peer="spark3"),
             Judge("net.judge", "net", needs=("base.a",), scope=Scope.CLUSTER, on_check=lambda _c: judged.append(1)),
             Ensure("net.apply", "net", needs=("net.judge",)),
             Ensure("net.all", "net", needs=("net.apply",), scope=Scope.CLUSTER)]
    result, _, _ = run(tasks)
    assert judged and result.outcome("net.judge").status is Status.CHANGED
    assert statuses(result, "net.apply") == {"spark1": "changed", "spark2": "skipped"}
    assert result.outcome("net.apply", "spark2").message == "needs base.a, failed on spark2"
    assert result.outcome("net.all").status is Status.SKIPPED


def test_ctrl_c_cuts_what_runs_starts_nothing_more_and_exits_130():
    interruption = Interruption()

    def ctrl_c(ctx):
        if ctx.name == "spark2":
            interruption.request()  # what the SIGINT handler does
            assert interruption.done.wait(5)
            raise Interrupted("spark2")  # what a transport raises once interrupted

    tasks = [Ensure("base.a"), Ensure("base.b", on_check=ctrl_c), Ensure("net.c", "net"),
             Ensure("net.all", "net", scope=Scope.CLUSTER)]
    result, events, _ = run(tasks, nodes=make_nodes(["spark1", "spark2"]), interruption=interruption)
    assert result.outcome("base.b", "spark2").status is Status.INTERRUPTED
    assert result.interrupted and result.exit_status() == ExitStatus.INTERRUPTED
    spark1_started_b = result.outcome("base.b", "spark1") is not None
    assert result.not_started == ([] if spark1_started_b else ["base.b"]) + ["net.c", "net.all"]
    assert not [e for e in events if e.event == "task_start" and e.task in ("net.c", "net.all")]
    notice = [e for e in events if e.event == "interrupt"]
    assert len(notice) == 1 and "base.b on spark2" in notice[0].message
    recap = events[-1].to_dict()
    assert recap["exit_status"] == 130 and recap["nodes"]["spark2"]["interrupted"] == 1
    assert {"task": "base.b", "node": "spark2"} in recap["interrupted"]["cut"]


def test_the_interrupt_event_comes_before_the_recap_even_when_cutting_the_transports_is_slow():
    """The callbacks run on a thread of their own, the transports' first (the lab saw a recap with no interrupt
    event before it, a connection being slow to close): the recap waits for them."""
    interruption = Interruption()
    interruption.on_request(lambda: time.sleep(0.5))  # a transport slow to close, registered before the runner

    def ctrl_c(ctx):
        if ctx.name == "spark2":
            interruption.request()
            raise Interrupted("spark2")

    tasks = [Ensure("base.a"), Ensure("base.b", on_check=ctrl_c), Ensure("net.c", "net")]
    result, events, _ = run(tasks, nodes=make_nodes(["spark1", "spark2"]), interruption=interruption)
    kinds = [e.event for e in events]
    assert result.interrupted and "interrupt" in kinds and kinds.index("interrupt") < kinds.index("recap")


def test_a_ctrl_c_between_a_walk_looking_and_the_task_starting_starts_nothing():
    """A node's walk read "not interrupted", then Ctrl-C landed (its notice emitted) before the next task started:
    that task does not start after the notice (the lab saw ssh.keys start on the other node after it)."""

    class LandsAfterTheLook(Interruption):
        armed = False

        @property
        def requested(self) -> bool:
            if self.armed and not self._event.is_set():
                self.armed = False
                self.request()
                assert self.done.wait(5)
                return False  # what the walk read a moment before
            return self._event.is_set()

    interruption = LandsAfterTheLook()
    tasks = [Ensure("base.a", on_check=lambda _ctx: setattr(interruption, "armed", True)), Ensure("base.b")]
    result, events, _ = run(tasks, nodes=make_nodes(["spark1"]), interruption=interruption)
    kinds = [(e.event, e.task) for e in events]
    after = kinds[kinds.index(("interrupt", None)):]
    assert ("task_start", "base.b") not in after, kinds
    assert result.interrupted and result.not_started == ["base.b"]


def test_the_stage_hook_marks_node_stages_and_cluster_tasks():
    seen = []
    tasks = [Ensure("base.a"), Ensure("base.b"), Ensure("base.all", scope=Scope.CLUSTER, needs=("base.b",)),
             Ensure("net.c", "net")]
    run(tasks, on_stage=seen.append)
    assert seen == [True, False, True]
