"""Start-up: `sparkctl --version` and `--help` import only what they use (no pydantic, paramiko or rich: those are
the commands' own), and `--help` lists each command with its own summary."""

from __future__ import annotations

import subprocess
import sys

import click
import pytest

from sparkctl.cli.main import SUMMARIES, cli

HEAVY = ("pydantic", "paramiko", "rich", "fabric", "jinja2", "prometheus_client")


@pytest.mark.parametrize("args", [["--version"], ["--help"]])
def test_version_and_help_import_none_of_the_heavy_libraries(args):
    probe = ("import sys; from sparkctl.cli.main import cli\n"
             f"try:\n    cli({args!r}, prog_name='sparkctl')\nexcept SystemExit:\n    pass\n"
             f"print(sorted(m for m in sys.modules if m.split('.')[0] in {HEAVY!r}))")
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().splitlines()[-1] == "[]", result.stdout


def test_a_run_command_loads_what_runs_the_tasks_after_it_starts_connecting():
    """`cluster bootstrap` and `cluster down` start connecting once their input is checked (runs/opening.py);
    what only runs the tasks (the tasks, the plan's templates, the console) loads while the nodes answer."""
    later = ("jinja2", "rich", "sparkctl.tasks.context", "sparkctl.runs.playbooks", "sparkctl.runs.session",
             "sparkctl.plan", "sparkctl.cli.views")
    probe = ("import sys; import sparkctl.cli.cluster_cmd\n"
             f"print(sorted(m for m in {later!r} if m in sys.modules))")
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().splitlines()[-1] == "[]", result.stdout


def test_each_summary_is_the_command_s_own_first_paragraph():
    ctx = click.Context(cli)
    names = cli.list_commands(ctx)
    assert set(SUMMARIES) == set(names)
    for name in names:
        command = cli.get_command(ctx, name)
        assert command is not None
        for limit in (40, 65, 200):
            summary = click.Command(name, help=SUMMARIES[name])
            assert summary.get_short_help_str(limit) == command.get_short_help_str(limit)
