"""tasks/early.py: an ask started as the run begins counts only where no change was applied since it began."""

from __future__ import annotations

import threading
import time

from sparkctl.tasks.early import EarlyAsks


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


def test_a_change_applied_since_the_ask_began_makes_it_count_for_nothing_without_waiting_for_it():
    changes, release = Changes(), threading.Event()
    asks = EarlyAsks(changes)
    asks.start("serve.smoke", lambda: release.wait(30) and "stale")
    changes.n += 1
    started = time.monotonic()
    assert asks.take("serve.smoke") is None
    assert time.monotonic() - started < 5  # not waited for: the task asks for itself at once
    release.set()


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
