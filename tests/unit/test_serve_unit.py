"""The serving unit: its files as planned (plan/serve_unit.py), unit.sh's backoff and record run for real with
stubbed docker, date and sleep, and serve.unit / serve.unit_remove against a head whose files live in this test's
folder."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import time
from pathlib import Path

import pytest

from sparkctl.inventory import load_inventory
from sparkctl.plan import plan_cluster
from sparkctl.plan.render import UnsafeValue
from sparkctl.plan.serve_unit import (
    BACKOFF_MAX_S,
    LASTED_S,
    WORLD_VARIABLE,
    WORLD_WAIT_S,
    failing_early,
    leftovers_script,
    parse_exits,
    units_of_cluster,
)
from sparkctl.tasks.serve.unit import ServeUnitRemoveTask, ServeUnitTask
from tests.taskkit import REPO, inventory_from_yaml, make_kit, spark_facts

PAIR = """
user: nvidia
cluster: {name: duo}
nodes: [{name: spark1, host: 10.0.0.11}, {name: spark2, host: 10.0.0.12}]
serve: {preset: qwen3-235b-eagle3}
"""


def unit_for(tmp_path, state_dir: str = "/home/nvidia/.local/state/sparkctl/duo", user: str = "nvidia",
             extra: str = ""):
    serve = PAIR.replace("serve: {preset: qwen3-235b-eagle3}", f"serve: {{preset: qwen3-235b-eagle3, {extra}}}")
    inv = inventory_from_yaml(serve if extra else PAIR, tmp_path)
    plan = plan_cluster(inv)
    return plan.launch.unit(inv, inv.head.name, state_dir=state_dir, user=user, fingerprint="f00dfeedf00dfeed")


def test_the_cluster_s_units_are_its_first_world_s_by_name_and_the_others_by_the_line_naming_the_cluster(tmp_path):
    """Another cluster's unit, whose key only begins with this cluster's name, is not one of them; a file with no
    final newline is read to its last line; with no other world's file there is nothing to read."""
    script = units_of_cluster("lab").replace("/etc/systemd/system", str(tmp_path))
    run = lambda: subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=30).stdout  # noqa: E731
    assert run() == ""
    (tmp_path / "sparkctl-serve-lab.service").write_text("[Unit]\n")
    (tmp_path / "sparkctl-serve-lab--oss.service").write_text("[Unit]\nX-Sparkctl-Cluster=lab")
    (tmp_path / "sparkctl-serve-lab--b.service").write_text("[Unit]\nX-Sparkctl-Cluster=lab2\n")
    (tmp_path / "sparkctl-serve-lab--c.service").write_text("[Unit]\n X-Sparkctl-Cluster=lab\n")
    assert sorted(run().split()) == ["sparkctl-serve-lab--oss.service", "sparkctl-serve-lab.service"]


def test_the_unit_runs_the_world_as_the_login_user_and_never_gives_up(tmp_path):
    spec = unit_for(tmp_path)
    unit = spec.unit_text()
    assert spec.unit_path == "/etc/systemd/system/sparkctl-serve-duo.service"
    for line in ("User=nvidia", "Restart=always", "StartLimitIntervalSec=0", "RestartPreventExitStatus=78",
                 "After=network-online.target docker.service", "WantedBy=multi-user.target",
                 "ExecStart=docker exec trtllm-multinode bash /sparkctl/serve/world.sh run",
                 "ExecStop=docker exec trtllm-multinode bash /sparkctl/serve/world.sh stop",
                 "ExecStartPre=/bin/sh /home/nvidia/.local/state/sparkctl/duo/run/serve/unit.sh before",
                 "ExecStopPost=/bin/sh /home/nvidia/.local/state/sparkctl/duo/run/serve/unit.sh after",
                 f"TimeoutStartSec={BACKOFF_MAX_S + WORLD_WAIT_S + 60}"):
        assert line in unit.splitlines(), line
    world = spec.world_text()
    # the other serving node, at its hostfile address; the launch line as planned
    assert "waiting for spark2's container to answer over the fabric (192.168.100.11)" in world
    assert "-o ServerAliveCountMax=2 192.168.100.11 " in world and "spark1's container" not in world
    assert spec.run.command + " < /dev/null &" in world


def test_a_percent_is_a_specifier_in_a_unit_and_a_space_is_refused(tmp_path):
    spec = unit_for(tmp_path, state_dir="/srv/100%/sparkctl/duo")
    assert "ExecStartPre=/bin/sh /srv/100%%/sparkctl/duo/run/serve/unit.sh before" in spec.unit_text()
    assert "dir=/srv/100%/sparkctl/duo/run/serve" in spec.host_text()  # not a unit file: as it is
    with pytest.raises(UnsafeValue):
        unit_for(tmp_path, state_dir="/home/a b/.local/state/sparkctl/duo").unit_text()


def test_the_scripts_are_valid_shell(tmp_path):
    spec = unit_for(tmp_path)
    for shell, text in (("sh", spec.host_text()), ("bash", spec.world_text())):
        result = subprocess.run([shell, "-n"], input=text, capture_output=True, text=True)
        assert result.returncode == 0, (shell, result.stderr)


# --- unit.sh, run for real ----------------------------------------------------------------------------------

STUBS = {
    # a clock in a file: `date +%s` reads it, `sleep N` moves it on (and says how long it slept)
    "date": '#!/bin/sh\ncase "$1" in +%s) cat "$CLOCK" ;; *) echo 2026-11-27T20:00:00Z ;; esac\n',
    "sleep": '#!/bin/sh\necho "$1" >> "$SLEPT"\necho $(( $(cat "$CLOCK") + ${1%.*} )) > "$CLOCK"\n',
    # `docker exec C bash world.sh ready`: fails while $NOT_READY holds a count above 0
    "docker": '#!/bin/sh\nn=$(cat "$NOT_READY" 2>/dev/null || echo 0)\n'
              'if [ "$n" -gt 0 ]; then echo $((n - 1)) > "$NOT_READY"; '
              'echo "waiting for spark2\'s container to answer over the fabric (192.168.100.11)"; exit 1; fi\n',
}


class HostScript:
    """unit.sh of a head whose state dir is in this test's folder."""

    def __init__(self, tmp_path):
        self.spec = unit_for(tmp_path, state_dir=str(tmp_path / "state"))
        os.makedirs(self.spec.serve_dir)
        self.script = tmp_path / "unit.sh"
        self.script.write_text(self.spec.host_text())
        bin_dir = tmp_path / "bin"
        bin_dir.mkdir()
        for name, text in STUBS.items():
            (bin_dir / name).write_text(text)
            (bin_dir / name).chmod(0o755)
        self.clock, self.slept, self.not_ready = tmp_path / "clock", tmp_path / "slept", tmp_path / "not-ready"
        self.clock.write_text("1000\n")
        self.env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "CLOCK": str(self.clock), "SLEPT": str(self.slept),
                    "NOT_READY": str(self.not_ready)}

    def run(self, verb: str, **env: str) -> subprocess.CompletedProcess:
        return subprocess.run(["sh", str(self.script), verb], capture_output=True, text=True, timeout=30,
                              env={**self.env, **env})

    def a_run_that_lasts(self, seconds: int, result: str = "exit-code") -> None:
        assert self.run("before").returncode == 0
        self.clock.write_text(f"{int(self.clock.read_text()) + seconds}\n")
        self.run("after", SERVICE_RESULT=result, EXIT_CODE="exited", EXIT_STATUS="137")

    def waited(self) -> list[int]:
        """What `before` slept for the backoff (its 5 s polls for the world are not in it)."""
        slept = [int(s) for s in self.slept.read_text().split()] if self.slept.exists() else []
        self.slept.unlink(missing_ok=True)
        return [s for s in slept if s != 5]

    def ends(self):
        return parse_exits(Path(self.spec.serve_dir, "exits.log").read_text())


def test_each_run_that_ends_early_doubles_the_wait_before_the_next_up_to_the_most(tmp_path):
    host = HostScript(tmp_path)
    waits = []
    for _ in range(8):
        host.a_run_that_lasts(20)
        waits.append(host.waited())
    assert waits == [[], [10], [20], [40], [80], [160], [300], [300]]
    assert [e.lasted_s for e in host.ends()] == [20] * 8 and host.ends()[0].result == "exit-code"
    assert failing_early(host.ends()) == 8


def test_a_run_that_lasted_or_a_start_sparkctl_asked_for_ends_the_series(tmp_path):
    host = HostScript(tmp_path)
    host.a_run_that_lasts(20)
    host.a_run_that_lasts(20)
    host.a_run_that_lasts(LASTED_S + 1)  # it had waited 10 s: a good run after it
    assert host.waited() == [10, 20]
    host.a_run_that_lasts(20)
    assert host.waited() == []
    host.a_run_that_lasts(20)
    assert host.waited() == [10]
    host.run("asked")  # `serve.launch`: the next start is at once
    host.a_run_that_lasts(20)
    assert host.waited() == []
    host.a_run_that_lasts(20, result="success")  # a stop asked for (its run exits 0)
    assert host.waited() == [10]  # the run before it had ended early
    host.a_run_that_lasts(20)
    assert host.waited() == []
    assert failing_early(host.ends()) == 1


def test_before_waits_for_the_world_says_so_once_and_gives_up_after_its_limit(tmp_path):
    host = HostScript(tmp_path)
    host.not_ready.write_text("3\n")
    result = host.run("before")
    assert result.returncode == 0
    assert result.stdout.splitlines() == ["waiting for spark2's container to answer over the fabric (192.168.100.11)"]
    assert (tmp_path / "state/run/serve/started").exists()
    host.not_ready.write_text("1000\n")
    result = host.run("before")
    assert result.returncode == 1 and not (tmp_path / "state/run/serve/started").exists()
    assert result.stdout.splitlines()[-1].startswith(f"not started: the world was not ready within {WORLD_WAIT_S}s")
    # and that failed start is an early end too
    host.run("after", SERVICE_RESULT="exit-code", EXIT_CODE="exited", EXIT_STATUS="1")
    assert host.ends()[-1].lasted_s == 0 and failing_early(host.ends()) == 1


def test_a_world_the_watchdog_ended_is_recorded_stuck_with_what_it_saw(tmp_path):
    """world.sh's watchdog left its evidence: unit.sh's record of that end says `stuck`, with the evidence on the
    same line; the next start clears a leftover one."""
    host = HostScript(tmp_path)
    evidence = Path(host.spec.serve_dir, "stuck.json")
    assert host.run("before").returncode == 0
    seen = {"reason": "no token for 120s with 2 requests running", "last_token_at": "2026-11-29T07:00:00Z",
            "running": 2, "gpu_power_w": [11.5]}
    evidence.write_text(json.dumps(seen) + "\n")
    host.clock.write_text("1300\n")
    host.run("after", SERVICE_RESULT="exit-code", EXIT_CODE="exited", EXIT_STATUS="1")
    (end,) = host.ends()
    assert (end.result, end.lasted_s, end.evidence) == ("stuck", 300, seen) and end.by_itself
    assert end.text().endswith("stuck after 300s: no token for 120s with 2 requests running (last token "
                               "2026-11-29T07:00:00Z, 2 requests running, the head's GPU power 11.5 W); the whole "
                               "world was started again")
    assert not evidence.exists()
    evidence.write_text("{}")  # left from a run that ended without its after
    host.run("before")
    assert not evidence.exists()
    host.run("after", SERVICE_RESULT="success", EXIT_CODE="exited", EXIT_STATUS="0")
    assert host.ends()[-1].result == "success" and host.ends()[-1].evidence is None


def test_the_head_s_world_starts_its_watchdog_and_a_worker_s_does_not(tmp_path):
    spec = unit_for(tmp_path)
    assert spec.watchdog is not None
    world = spec.world_text()
    assert 'python3 /sparkctl/serve/watchdog.py --pid "$server" --evidence /sparkctl/serve/stuck.json' in world
    assert "--metrics http://127.0.0.1:18356/metrics --running sparkctl_trtllm_num_requests_running" in world
    assert "--stall-s 120 --canary-s 60 --canary-deadline-s 30" in world and 'kill "$watchdog"' in world
    assert spec.watchdog_script in spec.files()
    off = unit_for(tmp_path, extra="watchdog: off")
    assert off.watchdog is None and "watchdog.py" not in off.world_text() and off.watchdog_script not in off.files()


def test_exits_log_reads_as_serve_status_shows_it():
    (end,) = parse_exits("2026-11-27T20:31:39Z 1795811499 signal killed KILL 18\nnot a line\n")
    assert end.text() == "2026-11-27T20:31:39Z, killed by SIGKILL after 18s" and end.by_itself
    (asked,) = parse_exits("2026-11-27T20:31:39Z 1795811499 asked none none 0")
    assert not asked.by_itself


# --- serve.unit and serve.unit_remove ----------------------------------------------------------------------

# `is-enabled` of a unit with no file says nothing on stdout
SYSTEMCTL = '#!/bin/sh\n[ "$1" = is-enabled ] && cat "$ENABLED" 2>/dev/null\nexit 0\n'


def unit_kit(tmp_path):
    """A pair whose nodes run serve.unit's reads here: /etc and the home dir mapped into a folder of this test
    per node, the head's `systemctl is-enabled` answering from a file; what the task puts lands there too.
    Returns the kit and the head's folder."""
    inv = inventory_from_yaml(PAIR, tmp_path)
    kit = make_kit(inv, {n.name: spark_facts(n.name) for n in inv.nodes})
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "systemctl").write_text(SYSTEMCTL)
    (bin_dir / "systemctl").chmod(0o755)
    enabled = tmp_path / "enabled"
    for name in ("spark1", "spark2"):
        transport = kit.transport(name)
        root = tmp_path / name

        def here(path: str, root=root) -> str:
            return str(root) + path

        def run_here(script: str, here=here) -> str:
            for prefix in ("/etc/systemd/system", "/home/nvidia"):
                script = script.replace(prefix, here(prefix))
            return subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=30,
                                  env={"PATH": f"{bin_dir}:/usr/bin:/bin", "ENABLED": str(enabled)}).stdout

        run_here.wants_script = True  # type: ignore[attr-defined]
        transport.respond(r"(^|\n)(cat|test -e) ", run_here)
        transport.respond(r"systemctl enable", then=lambda: enabled.write_text("enabled\n"))

        def land(call, here=here):
            os.makedirs(os.path.dirname(here(call.target)), exist_ok=True)
            with open(here(call.target), "w") as f:
                f.write(call.content)

        transport.on_put.append(land)
    return kit, tmp_path / "spark1"


def test_the_head_gets_the_unit_and_its_scripts_enabled_and_a_rerun_changes_nothing(tmp_path):
    kit, _root = unit_kit(tmp_path)
    head, transport = kit.node("spark1"), kit.transport("spark1")
    changes = ServeUnitTask().check(head)
    assert [c.summary for c in changes] == [
        "write /home/nvidia/.local/state/sparkctl/duo/run/serve/watchdog.py",
        "write /home/nvidia/.local/state/sparkctl/duo/run/serve/world.sh",
        "write /home/nvidia/.local/state/sparkctl/duo/run/serve/unit.sh",
        "write /etc/systemd/system/sparkctl-serve-duo.service",
        "enable sparkctl-serve-duo.service"]
    assert "+User=nvidia" in changes[3].diff
    ServeUnitTask().apply(head, changes)
    unit = [c for c in transport.calls if c.kind == "put" and c.target.endswith(".service")]
    assert len(unit) == 1 and unit[0].sudo and unit[0].owner == "root:root" and unit[0].mode == 0o644
    scripts = [c for c in transport.calls if c.kind == "put" and c.target.endswith((".sh", ".py"))]
    assert len(scripts) == 3 and not any(c.sudo for c in scripts)
    sudo = [c.target for c in transport.calls if c.kind == "run" and c.sudo]
    assert sudo == ["systemctl daemon-reload", "systemctl enable sparkctl-serve-duo.service"]
    assert ServeUnitTask().check(head) == []
    # the peer has none, and is left alone
    assert ServeUnitTask().check(kit.node("spark2")) == []


def test_serve_stop_s_disable_and_an_edit_are_put_back_exactly(tmp_path):
    kit, root = unit_kit(tmp_path)
    head = kit.node("spark1")
    ServeUnitTask().apply(head, ServeUnitTask().check(head))
    (tmp_path / "enabled").write_text("disabled\n")
    (change,) = ServeUnitTask().check(head)
    assert change.summary == "enable sparkctl-serve-duo.service (it is disabled, as `sparkctl serve stop` leaves it)"
    ServeUnitTask().apply(head, [change])
    assert not [c for c in kit.transport("spark1").calls[-3:] if c.kind == "put"]
    unit = root / "etc/systemd/system/sparkctl-serve-duo.service"
    unit.write_text(unit.read_text().replace("Restart=always", "Restart=no"))
    (change,) = ServeUnitTask().check(head)
    assert change.summary == "update /etc/systemd/system/sparkctl-serve-duo.service"
    assert "-Restart=no" in change.diff and "+Restart=always" in change.diff
    ServeUnitTask().apply(head, [change])
    assert ServeUnitTask().check(head) == []


def test_a_unit_left_on_a_node_that_is_no_longer_the_head_is_removed(tmp_path):
    kit, _head_root = unit_kit(tmp_path)
    root = tmp_path / "spark2"
    (root / "etc/systemd/system").mkdir(parents=True)
    (root / "etc/systemd/system/sparkctl-serve-duo.service").write_text("[Unit]\n")
    peer = kit.node("spark2")
    (change,) = ServeUnitTask().check(peer)
    assert change.summary == "remove the serving unit sparkctl-serve-duo.service (the head is spark1)"
    ServeUnitTask().apply(peer, [change])
    (removal,) = [c for c in kit.transport("spark2").calls if c.kind == "run" and c.sudo]
    assert "systemctl disable --now sparkctl-serve-duo.service" in removal.target
    assert "rm -f /etc/systemd/system/sparkctl-serve-duo.service" in removal.target
    # cluster down's task says the same on every node that has one
    (down,) = ServeUnitRemoveTask().check(peer)
    assert down.summary == "stop and remove sparkctl-serve-duo.service"
    assert ServeUnitRemoveTask().check(kit.node("spark1")) == []


def test_a_world_ends_only_what_it_or_no_world_left_never_another_world_s(tmp_path):
    """Real processes: a world's leftovers (found by their command line or their process title) are killed when they
    carry the world's own name or none (started before worlds were marked, or by mpirun on a peer); another world's,
    in the same container, are left running."""
    config, title = f"{tmp_path}/serve-config.yaml", f"SPTEST{os.getpid()}::"
    script = leftovers_script((f"--config[ ]{config}", f"^{title}"), "duo")
    started = {}
    for name, marker, argv0 in (("mine", "duo", f"engine serve --config {config}"), ("unmarked", None, f"{title}Core"),
                                ("other", "duo--small", f"engine serve --config {config}"),
                                ("other-core", "duo--small", f"{title}Core")):
        env = {k: v for k, v in os.environ.items() if k != WORLD_VARIABLE}
        if marker:
            env[WORLD_VARIABLE] = marker
        started[name] = subprocess.Popen(["bash", "-c", f"exec -a {shlex.quote(argv0)} sleep 300"], env=env)
    try:
        assert poll_until(lambda: all(Path(f"/proc/{p.pid}/cmdline").read_bytes().startswith(b"engine")
                                      or title.encode() in Path(f"/proc/{p.pid}/cmdline").read_bytes()
                                      for p in started.values()))
        killed = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=30).stdout.split()
        assert sorted(killed) == sorted(str(started[n].pid) for n in ("mine", "unmarked"))
        assert started["mine"].wait(10) == -9 and started["unmarked"].wait(10) == -9
        assert started["other"].poll() is None and started["other-core"].poll() is None
    finally:
        for process in started.values():
            process.kill()
            process.wait()


def poll_until(check, timeout: float = 10) -> bool:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def test_every_world_script_marks_its_processes_with_the_world_s_name():
    for name in ("two-sparks.yaml", "two-sparks-vllm.yaml", "two-sparks-sglang.yaml"):
        inv = load_inventory(str(REPO / "inventories" / name))
        plan = plan_cluster(inv)
        for node in plan.launch.commands():
            unit = plan.launch.unit(inv, node, state_dir="/s", user="nvidia", fingerprint="f")
            text = unit.world_text()
            assert f"export SPARKCTL_WORLD={inv.cluster.name}\n" in text, (name, node)
            assert text.index("export SPARKCTL_WORLD") < text.index(unit.run.command)
