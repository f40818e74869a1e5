"""Ctrl-C: outside a run one line and exit 130 (never click's "Aborted!" and exit 1); during a run the first SIGINT
asks the run to stop, a second one exits at once."""

from __future__ import annotations

import subprocess
import sys
import textwrap

from click.testing import CliRunner

from sparkctl.cli import cluster_cmd
from sparkctl.cli.main import cli
from sparkctl.exitcodes import ExitStatus


def test_ctrl_c_outside_a_run_is_one_line_and_exit_130(monkeypatch, tmp_path):
    def interrupted(_file, **_options):
        raise KeyboardInterrupt

    monkeypatch.setattr(cluster_cmd, "load", interrupted)
    result = CliRunner().invoke(cli, ["cluster", "bootstrap", str(tmp_path / "inventory.yaml")])
    assert result.exit_code == ExitStatus.INTERRUPTED == 130
    assert "sparkctl: interrupted; nothing more was started" in result.output
    assert "Aborted!" not in result.output and "Traceback" not in result.output


SCRIPT = textwrap.dedent("""
    import os, signal, sys, time
    from sparkctl.taskgraph import Interruption
    from sparkctl.runs.interrupts import ctrl_c_stops

    stop = Interruption()
    stop.on_request(lambda: print("stopping", flush=True))
    with ctrl_c_stops(stop):
        os.kill(os.getpid(), signal.SIGINT)
        assert stop.done.wait(5) and stop.requested
        print("still running after the first", flush=True)
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(5)
    print("never", flush=True)
""")


def test_the_first_ctrl_c_asks_the_run_to_stop_and_the_second_stops_at_once():
    done = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=30)
    assert done.stdout.splitlines() == ["stopping", "still running after the first"]
    assert done.returncode == 130
    assert "sparkctl: interrupted again: stopped at once" in done.stderr
