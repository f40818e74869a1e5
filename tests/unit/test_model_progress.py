"""Live download progress: events while `hf download` runs, and how the console view shows them."""

from __future__ import annotations

import io
import threading
import time

from rich.console import Console

from sparkctl.cli.views import ConsoleView
from sparkctl.taskgraph.events import Event
from sparkctl.tasks.model import progress as model_progress
from sparkctl.tasks.model.fetch import ModelFetchTask
from sparkctl.tasks.model.progress import TransferProgress, human_bytes
from tests.taskkit import inventory_from_yaml, make_kit, spark_facts

PAIR = """
user: nvidia
nodes: [{name: spark1, host: 10.0.0.11}, {name: spark2, host: 10.0.0.12}]
serve: {preset: qwen3-235b-eagle3}
"""


def test_progress_reports_the_bytes_so_far_and_the_rate_of_what_arrived():
    sizes = iter([1_000_000, 3_000_000, 5_000_000, 7_000_000, 9_000_000])
    events: list[Event] = []
    with TransferProgress(events.append, task="model.fetch", node="spark1", what="org/m",
                          measure=lambda: next(sizes, 9_000_000), total=10_000_000, interval=0.05):
        deadline = time.monotonic() + 30  # three intervals, however slow the machine is to schedule the thread
        while len(events) < 3 and time.monotonic() < deadline:
            time.sleep(0.01)
    assert len(events) >= 3
    first = events[0]
    assert first.event == "log" and first.task == "model.fetch" and first.node == "spark1"
    assert first.message.startswith("org/m: 3.00 MB of 10.00 MB (30%) after ")
    assert first.data["progress"]["bytes"] == 3_000_000 and first.data["progress"]["total"] == 10_000_000
    assert "MB/s" in first.message
    assert human_bytes(512) == "512 B"


def test_a_failing_reading_never_fails_the_transfer():
    def broken():
        raise OSError("connection reset")

    events: list[Event] = []
    with TransferProgress(events.append, task="t", node="n", what="x", measure=broken, interval=0.02):
        time.sleep(0.1)
    assert events == []


def test_a_reading_refused_by_ctrl_c_ends_the_readings_quietly():
    """Ctrl-C closes the transports; a progress reading then raises Interrupted (a BaseException). The thread stops
    reading, and nothing escapes it (threading's hook printed a traceback on the person's terminal)."""
    from sparkctl.errors import Interrupted

    calls: list[int] = []

    def refused():
        calls.append(1)
        raise Interrupted("spark1")

    escaped: list[object] = []
    hook, threading.excepthook = threading.excepthook, escaped.append
    try:
        with TransferProgress(lambda e: None, task="t", node="n", what="x", measure=refused, interval=0.02):
            time.sleep(0.15)
    finally:
        threading.excepthook = hook
    assert escaped == [] and len(calls) == 1


def test_fetch_logs_progress_while_hf_download_runs(tmp_path, monkeypatch):
    monkeypatch.setattr(model_progress, "PROGRESS_EVERY_S", 0.05)
    inv = inventory_from_yaml(PAIR, tmp_path)
    kit = make_kit(inv, {n.name: spark_facts(n.name) for n in inv.nodes})
    node, transport = kit.node("spark2"), kit.transport("spark2")
    size = {"bytes": 0}
    downloading = threading.Event()

    def download():
        downloading.set()
        deadline = time.monotonic() + 30  # a download that lasts until progress was reported, on a slow machine too
        for step in range(1000):
            size["bytes"] += 2_000_000
            time.sleep(0.05)
            if step >= 5 and (any(e.data.get("progress") for e in kit.events) or time.monotonic() > deadline):
                break

    transport.respond(r"config\.json", "missing\tnvidia/Qwen3-235B-A22B-FP4\t-\t no config.json\n")
    changes = ModelFetchTask().check(node)
    transport.rules.clear()
    transport.respond(r"du -sb", lambda: f"{size['bytes']}\n")
    transport.respond(r"^hf download", then=download)
    ModelFetchTask().apply(node, changes)
    assert downloading.is_set()
    progress = [e for e in kit.events if e.data.get("progress")]
    assert progress and all(e.task == "model.fetch" and e.node == "spark2" for e in progress)
    assert any("MB" in e.message for e in progress)
    done = [e.message for e in kit.events if (e.message or "").startswith("downloaded ")]
    assert done and "MB/s" in done[0]


def progress_event(node: str = "spark1", task: str = "model.fetch") -> Event:
    return Event("log", task=task, node=node, message="org/m: 1.00 GB after 10s, 100.0 MB/s",
                 data={"progress": {"bytes": 10**9}})


def test_console_shows_progress_at_default_verbosity_but_not_other_logs():
    console = Console(record=True, width=160, force_terminal=False, color_system=None)
    view = ConsoleView(console, verbosity=0)
    view(Event("run_start", data={"nodes": ["spark1"]}))
    view(progress_event())
    view(Event("log", task="model.fetch", node="spark1", message="just a log"))
    text = console.export_text()
    assert "progress" in text and "org/m: 1.00 GB after 10s" in text
    assert "just a log" not in text


def test_in_a_terminal_progress_goes_to_the_live_status_line():
    console = Console(file=io.StringIO(), width=200, force_terminal=True)
    view = ConsoleView(console, verbosity=0)
    view(Event("run_start", data={"nodes": ["spark1", "spark2"]}))
    view(Event("task_start", task="model.fetch", node="spark1"))
    view(Event("task_start", task="model.copy", node=None))
    view(progress_event())
    view(progress_event("spark2", "model.copy"))
    status = view._spinner_text()
    view.close()
    assert "model.fetch: spark1 (org/m: 1.00 GB after 10s" in status
    assert "model.copy: cluster (spark2: org/m: 1.00 GB" in status
    view(Event("task_result", task="model.fetch", node="spark1", status="changed"))
    assert "model.fetch" not in view._spinner_text()
