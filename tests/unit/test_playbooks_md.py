"""playbooks.md is generated from the code (`sparkctl playbooks --markdown > playbooks.md`) and kept in sync here."""

from __future__ import annotations

from pathlib import Path

from click.testing import CliRunner

from sparkctl.cli.main import cli
from sparkctl.runs.playbooks import PLAYBOOKS, playbooks_markdown

REPO = Path(__file__).resolve().parents[2]


def test_playbooks_md_is_committed_and_current():
    result = CliRunner().invoke(cli, ["playbooks", "--markdown"])
    assert result.exit_code == 0, result.output
    committed = (REPO / "playbooks.md").read_text()
    assert result.stdout == committed, "playbooks.md is stale: run `sparkctl playbooks --markdown > playbooks.md`"


def test_every_task_is_described_in_words():
    text = playbooks_markdown()
    for name, (factory, usage, _summary) in PLAYBOOKS.items():
        assert f"## {name}\n" in text and f"`{usage}`" in text
        graph = factory()
        for phase in {t.phase for t in graph.ordered()}:
            assert f"### phase: {phase}\n" in text
        for task in graph.ordered():
            assert task.description and task.checks and task.changes, f"{task.name} lacks words"
            assert f"#### `{task.name}` ({task.scope.value})" in text
            assert f"- checks: {task.checks}\n" in text
