"""tasks/early.py: an ask started as the run begins counts only where no change was applied since it began."""

from __future__ import annotations

import threading
import time

from sparkctl.taskgraph import Change, Event, Graph, Runner, Scope, Task
from sparkctl.tasks import early
from sparkctl.tasks.early import EarlyAsks
from tests.taskkit import inventory_from_yaml, make_kit, spark_facts


class Changes:
    def __init__(self):
        self.n = 0

    def __call__(self) -> int:
        return self.n


def test_what_was_asked_early_is_taken_once_when_nothing_changed():
    asks = EarlyAsks(Changes())
    asks.start("serve.smoke", lambda: ["answer"])
    assert asks.take("serve.smoke") == ["answer"]
    assert asks.take("serve.smoke") is None  # once
    assert asks.take("never.started") is None


def test_a_change_applied_since_the_ask_began_makes_it_count_for_nothing_waiting_a_bounded_time_for_it(
        monkeypatch):
    """A stale ask still under way is given STALE_WAIT_S to end (its request and the task's own must not meet at
    the server), and no longer."""
    monkeypatch.setattr(early, "STALE_WAIT_S", 0.3)
    changes, release = Changes(), threading.Event()
    asks = EarlyAsks(changes)
    asks.start("serve.smoke", lambda: release.wait(30) and "stale")
    changes.n += 1
    started = time.monotonic()
    assert asks.take("serve.smoke") is None
    assert 0.3 <= time.monotonic() - started < 5
    release.set()


def test_a_stale_ask_that_ends_is_not_waited_for_any_longer():
    changes = Changes()
    asks = EarlyAsks(changes)
    asks.start("serve.smoke", lambda: "stale")
    changes.n += 1
    started = time.monotonic()
    assert asks.take("serve.smoke") is None
    assert time.monotonic() - started < early.STALE_WAIT_S


def test_a_change_applied_while_it_was_waited_for_makes_it_count_for_nothing():
    changes = Changes()
    asks = EarlyAsks(changes)

    def ask():
        changes.n += 1  # as a task applying a change while the answer comes
        return "stale"
    asks.start("serve.smoke", ask)
    assert asks.take("serve.smoke") is None


def test_a_take_waits_for_an_ask_still_running():
    release = threading.Event()
    asks = EarlyAsks(Changes())
    asks.start("serve.smoke", lambda: release.wait(30) and "late")
    threading.Timer(0.2, release.set).start()
    assert asks.take("serve.smoke") == "late"


def test_an_ask_that_fails_or_finds_nothing_leaves_the_task_to_ask_for_itself():
    asks = EarlyAsks(Changes())

    def fails():
        raise RuntimeError("the proxy hung up")
    asks.start("a", fails)
    asks.start("b", lambda: None)
    assert asks.take("a") is None and asks.take("b") is None


def test_a_second_start_of_the_same_ask_keeps_the_first():
    asks = EarlyAsks(Changes())
    asks.start("serve.smoke", lambda: "first")
    asks.start("serve.smoke", lambda: "second")
    assert asks.take("serve.smoke") == "first"


PAIR = """
user: nvidia
cluster: {name: duo}
nodes: [{name: spark1, host: 10.0.0.11}, {name: spark2, host: 10.0.0.12}]
"""


class SetOnce(Task):
    """A node task that changes its node once."""

    name, phase = "base.set", "base"

    def __init__(self):
        self.done: set[str] = set()

    def check(self, ctx):
        return [] if ctx.name in self.done else [Change(f"set on {ctx.name}")]

    def apply(self, ctx, changes):
        self.done.add(ctx.name)


class AsksEarly(Task):
    """A read-only cluster task that asks early and notes what its check was handed."""

    name, phase, scope, read_only = "serve.asks", "serve", Scope.CLUSTER, True

    def __init__(self):
        self.taken: list[object] = []

    def ask_early(self, ctx):
        ctx.early.start(self.name, lambda: "asked as the run began")

    def check(self, ctx):
        self.taken.append(ctx.early.take(self.name))
        return []


def run_with_changes_counted(tmp_path, tasks, **kw):
    """The runner over a real ClusterContext, every event counted by it first, as runs/session.py wires them."""
    inventory = inventory_from_yaml(PAIR, tmp_path)
    kit = make_kit(inventory, {n.name: spark_facts(n.name) for n in inventory.nodes})
    events: list[Event] = []

    def emit(event: Event) -> None:
        kit.cluster.note(event)
        events.append(event)
    kw.setdefault("unreachable", {})
    runner = Runner(Graph(tasks, ["base", "serve"]), nodes=list(kit.cluster.nodes), node_contexts=kit.cluster.nodes,
                    cluster_context=kit.cluster, emit=emit, **kw)
    return runner.run(), events


def test_through_the_runner_an_early_answer_counts_on_a_no_op_and_not_after_a_change(tmp_path):
    setter, asker = SetOnce(), AsksEarly()
    run_with_changes_counted(tmp_path, [setter, asker])
    assert asker.taken == [None]  # base.set changed both nodes after the ask began
    run_with_changes_counted(tmp_path, [setter, asker])
    assert asker.taken == [None, "asked as the run began"]  # the rerun changed nothing


def test_nothing_is_asked_early_in_check_mode_or_with_a_node_out_of_the_run(tmp_path):
    asker = AsksEarly()
    run_with_changes_counted(tmp_path, [asker], check_mode=True)
    run_with_changes_counted(tmp_path, [asker], unreachable={"spark2": "connection refused"})
    assert asker.taken == [None]  # checked once (spark2 out blocks it), asked early neither time


def test_an_early_ask_that_cannot_start_is_a_warning_and_the_run_goes_on(tmp_path):
    class Broken(AsksEarly):
        def ask_early(self, ctx):
            raise RuntimeError("no thread left")
    asker = Broken()
    result, events = run_with_changes_counted(tmp_path, [asker])
    assert asker.taken == [None] and result.exit_status() == 0
    (warning,) = [e for e in events if e.event == "warning"]
    assert warning.task == "serve.asks" and warning.message == "could not ask early: no thread left"
