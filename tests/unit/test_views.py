"""The console and JSON views, fed by a real Runner over fake tasks (events are their only input)."""

from __future__ import annotations

import io
import json

import pytest
from rich.console import Console

from sparkctl.cli.json_view import JsonView
from sparkctl.cli.views import ConsoleView
from sparkctl.errors import Interrupted, Unreachable
from sparkctl.taskgraph import Change, Event, EventBus, Graph, Interruption, Runner, Scope, Task, TaskFailed

DIFF = "--- a/etc/netplan/40-cx7.yaml\n+++ b/etc/netplan/40-cx7.yaml\n@@ -1 +1 @@\n-mtu: 1500\n+mtu: 9000\n"


class FileTask(Task):
    name, phase = "network.netplan", "network"

    def __init__(self, state: dict[str, dict], fail_on: str | None = None, crash_on: str | None = None):
        self.state, self.fail_on, self.crash_on = state, fail_on, crash_on

    def check(self, ctx):
        if ctx == self.fail_on:
            raise TaskFailed("netplan apply failed", hint="check the YAML", details=["line 4: mtu"])
        if ctx == self.crash_on:
            raise RuntimeError("boom")
        if self.state[ctx].get("mtu") == 9000:
            return []
        return [Change("write /etc/netplan/40-cx7.yaml", diff=DIFF), Change("run netplan apply")]

    def apply(self, ctx, changes):
        self.state[ctx]["mtu"] = 9000


class MeshTask(Task):
    name, phase, scope, needs = "ssh.mesh", "ssh", Scope.CLUSTER, ("network.netplan",)

    def check(self, ctx):
        return []


class Warns(Task):
    name, phase = "network.mtu", "network"

    def __init__(self, bus):
        self.bus = bus

    def check(self, ctx):
        self.bus.warning("switch port MTU unknown", node=ctx, task=self.name, hint="set it to 9216")
        return []


def run_with(view, *, check_mode=False, fail_on=None, crash_on=None, unreachable=None, tasks=None):
    nodes = ["spark1", "spark2"]
    state = {n: {} for n in nodes}
    bus = EventBus([view])
    graph = Graph(tasks or [FileTask(state, fail_on, crash_on), Warns(bus), MeshTask()], ["network", "ssh"])
    runner = Runner(graph, nodes=nodes, node_contexts={n: n for n in nodes}, cluster_context=None,
                    unreachable=unreachable or {}, check_mode=check_mode, emit=bus)
    return runner.run()


def console_output(**kw) -> str:
    console = Console(record=True, width=120, force_terminal=False, color_system=None)
    verbosity = kw.pop("verbosity", 0)
    show_diff = kw.pop("show_diff", False)
    with ConsoleView(console, verbosity=verbosity, show_diff=show_diff) as view:
        run_with(view, **kw)
    return console.export_text()


def recap_rows(text: str) -> dict[str, list[str]]:
    after = text.split("RECAP", 1)[1]
    rows = {}
    for line in after.splitlines():
        cells = line.split()
        if len(cells) == 6 and cells[0].startswith(("spark", "(cluster)")):
            rows[cells[0]] = cells[1:]
    return rows


def test_console_shows_changes_warnings_and_recap_table():
    text = console_output()
    assert "changed       spark1   network.netplan  2 changes" in text
    assert "    - write /etc/netplan/40-cx7.yaml" in text
    assert "warning       spark2   network.mtu  switch port MTU unknown" in text
    assert "hint: set it to 9216" in text
    assert "ok            cluster  ssh.mesh" in text
    header = next(line for line in text.split("RECAP", 1)[1].splitlines() if "node" in line)
    assert header.split() == ["node", "ok", "changed", "failed", "skipped", "unreachable"]
    assert recap_rows(text) == {"spark1": ["1", "1", "0", "0", "0"], "spark2": ["1", "1", "0", "0", "0"],
                                "(cluster)": ["1", "0", "0", "0", "0"]}
    assert "mtu: 9000" not in text  # no diff unless asked
    assert "\x1b[" not in text and "⠋" not in text  # a plain console gets plain lines


def test_console_check_mode_says_would_change_and_shows_diffs():
    text = console_output(check_mode=True, show_diff=True)
    assert "would change  spark1   network.netplan  2 changes" in text
    assert "      -mtu: 1500" in text and "      +mtu: 9000" in text
    assert "check mode: nothing will be changed" in text
    assert "2 task(s) would change; run without --check to apply" in text


def test_console_failure_shows_message_hint_details_and_skips():
    text = console_output(fail_on="spark2")
    assert "failed        spark2   network.netplan  netplan apply failed" in text
    assert "hint: check the YAML" in text and "| line 4: mtu" in text
    assert "skipped       cluster  ssh.mesh  needs network.netplan, failed on spark2" in text
    assert recap_rows(text)["spark2"] == ["1", "0", "1", "0", "0"]
    assert "FAILED" in text


def test_console_traceback_only_at_vv():
    assert "Traceback" not in console_output(crash_on="spark1")
    assert "internal error: RuntimeError: boom" in console_output(crash_on="spark1")
    assert "Traceback" in console_output(crash_on="spark1", verbosity=2)


def test_console_unreachable_line_and_recap():
    text = console_output(unreachable={"spark2": "ssh: timed out"})
    assert "unreachable   spark2   ssh: timed out" in text
    assert recap_rows(text)["spark2"] == ["0", "0", "0", "0", "1"]
    assert "UNREACHABLE" in text


def test_console_on_a_terminal_uses_a_spinner_and_stops_it():
    console = Console(file=io.StringIO(), width=120, force_terminal=True)
    view = ConsoleView(console, verbosity=1)
    spinning = []

    def watch(event):
        view(event)
        spinning.append(view._spinner is not None)

    run_with(watch)
    assert any(spinning) and view._spinner is None  # ran while tasks ran, stopped at the recap
    assert "RECAP" in console.file.getvalue()


def test_json_view_lines_parse_and_last_is_recap():
    stream = io.StringIO()
    result = run_with(JsonView(stream), check_mode=True)
    lines = [json.loads(line) for line in stream.getvalue().splitlines()]
    assert lines[0]["event"] == "run_start" and lines[0]["nodes"] == ["spark1", "spark2"]
    assert lines[-1] == {"schema": 1, "event": "recap", "time": lines[-1]["time"], "nodes": result.recap(),
                         "exit_status": 4, "duration": lines[-1]["duration"], "check_mode": True}
    changed = [ln for ln in lines if ln.get("status") == "changed"]
    assert changed and all(ln["would_change"] is True for ln in changed)
    assert changed[0]["changes"][0] == {"summary": "write /etc/netplan/40-cx7.yaml", "diff": DIFF}
    assert {ln["event"] for ln in lines} >= {"task_start", "task_result", "warning"}


def test_views_render_findings_and_logs():
    console = Console(record=True, width=120, force_terminal=False)
    view = ConsoleView(console, verbosity=1)
    view(Event("finding", node="spark1", message="MTU 1500 on enp1s0f1np1", hint="set mtu 9000",
               data={"severity": "error"}))
    view(Event("log", node="spark1", message="gathered facts"))
    text = console.export_text()
    assert "error" in text and "MTU 1500 on enp1s0f1np1" in text and "gathered facts" in text


def test_views_mask_registered_secrets():
    secrets = pytest.importorskip("sparkctl.secrets")
    secrets.register_secret("hf_viewtest_token")
    try:
        stream = io.StringIO()
        console = Console(record=True, width=120, force_terminal=False)
        event = Event("task_result", node="spark1", task="model.token", status="failed",
                      message="rejected hf_viewtest_token", details=["token=hf_viewtest_token"])
        JsonView(stream)(event)
        ConsoleView(console)(event)
        assert "hf_viewtest_token" not in stream.getvalue() + console.export_text()
        assert "rejected " + secrets.MASK in stream.getvalue()
    finally:
        secrets.forget_secrets()


class LosesSpark2(Task):
    """spark2 stops answering while its netplan runs."""

    name, phase = "network.netplan", "network"

    def check(self, ctx):
        if ctx == "spark2":
            raise Unreachable("spark2 (10.0.0.12): stopped answering while a command ran", node="spark2")
        return [Change("write /etc/netplan/40-cx7.yaml")]

    def apply(self, ctx, changes):
        pass

    def __init__(self):
        self.done = set()


class KeysTask(Task):
    name, phase = "ssh.keys", "ssh"

    def check(self, ctx):
        return []


def test_console_names_the_lost_node_where_and_what_was_left_undone():
    class Once(LosesSpark2):
        def check(self, ctx):
            if ctx in self.done:
                return []
            self.done.add(ctx)
            return super().check(ctx)

    text = console_output(tasks=[Once(), KeysTask(), MeshTask()])
    assert "lost          spark2   network.netplan  spark2 (10.0.0.12): stopped answering while a command ran" in text
    assert "hint: left out of the rest of this run; the other nodes go on" in text
    assert "skipped       cluster  ssh.mesh  needs every node, spark2 unreachable" in text
    after = text.split("RECAP", 1)[1]
    assert ("spark2 lost during network.netplan: spark2 (10.0.0.12): stopped answering while a command ran"
            in after)
    assert "not done on spark2: ssh.keys" in after
    assert "left undone, they need spark2: ssh.mesh" in after
    assert "UNREACHABLE in" in after and after.rstrip().endswith("spark2")


def test_console_after_ctrl_c_says_what_was_cut_and_what_did_not_start():
    interruption = Interruption()

    class CtrlC(Task):
        name, phase = "network.netplan", "network"

        def check(self, ctx):
            if ctx == "spark1":
                interruption.request()
                interruption.done.wait(5)
                raise Interrupted("spark1")
            return []

    console = Console(record=True, width=120, force_terminal=False, color_system=None)
    with ConsoleView(console) as view:
        nodes = ["spark1"]
        graph = Graph([CtrlC(), KeysTask(), MeshTask()], ["network", "ssh"])
        Runner(graph, nodes=nodes, node_contexts={"spark1": "spark1"}, cluster_context=None, unreachable={},
               emit=EventBus([view]), interruption=interruption).run()
    text = console.export_text()
    assert "interrupted: cutting network.netplan on spark1; nothing more starts" in text
    assert "hint: press Ctrl-C again to stop at once" in text
    header = next(line for line in text.split("RECAP", 1)[1].splitlines() if "node" in line)
    assert header.split()[-1] == "interrupted"
    assert "cut by Ctrl-C: network.netplan on spark1" in text
    assert "not started: ssh.keys, ssh.mesh" in text
    assert "INTERRUPTED in" in text and "1 task(s) cut, 2 not started" in text


@pytest.mark.parametrize("data, check_mode, expected", [
    ({"verified": True}, False, "OK in 1.0s: nothing to change; verified"),
    ({"verified": False, "not_verified": "verify.fabric was not selected"}, False,
     "OK in 1.0s: nothing to change; NOT verified: verify.fabric was not selected"),
    ({}, False, "OK in 1.0s: nothing to change"),
    ({"pending": 3}, True, "check mode in 1.0s: 0 task(s) would change, 3 cannot know until those are applied"),
])
def test_the_closing_line_says_verified_only_when_verify_passed(data, check_mode, expected):
    console = Console(record=True, width=160, force_terminal=False, color_system=None)
    view = ConsoleView(console)
    view(Event("recap", nodes={"spark1": {"ok": 1}}, duration=1.0, check_mode=check_mode, exit_status=0,
               data=data))
    assert expected in console.export_text()


def test_the_start_line_names_what_only_pulled_in():
    console = Console(record=True, width=160, force_terminal=False, color_system=None)
    view = ConsoleView(console)
    view(Event("run_start", data={"nodes": ["spark1"], "added_needs": ["preflight.node", "container.run"]}))
    view(Event("run_start", data={"nodes": ["spark1"], "added_needs": [
        "preflight.node", "preflight.cluster", "network.netplan", "container.run", "mpi.hostfile"]}))
    text = console.export_text()
    assert "also running what the selected tasks need: preflight.node, container.run" in text
    assert "5 tasks of preflight, network, container, mpi" in text


def test_a_serving_run_ends_with_the_endpoint_and_the_smoke_result():
    console = Console(record=True, width=160, force_terminal=False, color_system=None)
    view = ConsoleView(console)
    view(Event("recap", nodes={"spark1": {"ok": 1}}, duration=1.0, check_mode=False, exit_status=0,
               data={"verified": True, "endpoint": "http://10.0.0.11:8355",
                     "smoke": {"seconds": 0.42, "answer": "Two computers share work.", "acceptance_length": 2.5,
                               "reachable_from_here": True}}))
    lines = console.export_text().splitlines()
    assert lines[-2] == "endpoint: http://10.0.0.11:8355/v1"
    assert lines[-1] == "smoke test: answered in 0.4s; 'Two computers share work.'; acceptance length 2.50"


def test_long_steps_show_their_duration_and_the_spinner_its_elapsed_time(monkeypatch):
    console = Console(record=True, width=160, force_terminal=False, color_system=None)
    view = ConsoleView(console)
    view(Event("task_result", task="serve.launch", phase="serve", status="ok", duration=75.0))
    view(Event("task_result", task="ssh.keys", phase="ssh", node="spark1", status="ok", duration=0.2))
    text = console.export_text()
    assert "serve.launch  (1m15s)" in text and "(0.2s)" not in text
    clock = [100.0]
    monkeypatch.setattr("sparkctl.cli.views.time.monotonic", lambda: clock[0])
    view(Event("task_start", task="model.fetch", phase="model", node="spark1"))
    clock[0] = 112.5
    assert view._spinner_text() == "model.fetch: spark1 [12.5s]"


def test_the_recap_passes_event_data_through_the_redaction_too():
    """A secret that is also a host (or a credential-shaped value anywhere in the data) is masked in the recap's
    endpoint and lost/left-undone lines, as in every other line."""
    from sparkctl import secrets

    secrets.register_secret("secrethost.lan")
    try:
        console = Console(record=True, width=200, force_terminal=False, color_system=None)
        view = ConsoleView(console)
        view(Event("recap", nodes={"spark1": {"ok": 1}}, duration=1.0, check_mode=False, exit_status=0,
                   data={"verified": True, "endpoint": "http://secrethost.lan:8355",
                         "smoke": {"seconds": 0.4, "answer": "hf_" + "Q" * 30},
                         "lost": {"spark2": {"during": "network.netplan", "reason": "secrethost.lan: gone"}},
                         "left_undone": ["ssh.mesh"]}))
        text = console.export_text()
        assert "secrethost.lan" not in text and "hf_QQQQ" not in text, text
        assert f"endpoint: http://{secrets.MASK}:8355/v1" in text
        assert f"spark2 lost during network.netplan: {secrets.MASK}: gone" in text
    finally:
        secrets.forget_secrets()
