"""The token prompt: after the Hub refuses a gated repo, a person at a terminal is asked once; CI is not."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from sparkctl.cli import cluster_cmd
from sparkctl.cli.main import cli
from sparkctl.runs import bootstrap as runs_bootstrap
from sparkctl.runs.opening import Opening
from sparkctl.secrets import forget_secrets, redact_known
from sparkctl.taskgraph.runner import RunResult, TaskOutcome
from sparkctl.taskgraph.task import Status
from sparkctl.tasks.model.fetch import download_failure, gated_repos_failed
from sparkctl.tasks.model.token import hf_token
from sparkctl.transport.base import CommandResult
from tests.taskkit import inventory_from_yaml

TOKEN = "hf_PromptedToken0123456789abcdefXYZ"
DRAFT = "nvidia/Qwen3-235B-A22B-Eagle3"
PAIR = """
user: nvidia
nodes: [{name: spark1, host: 10.0.0.11}, {name: spark2, host: 10.0.0.12}]
serve: {preset: qwen3-235b-eagle3}
"""
GATED_STDERR = ("huggingface_hub.errors.GatedRepoError: 401 Client Error.\n\nCannot access gated repo for url "
                f"https://huggingface.co/{DRAFT}/resolve/main/config.json.\n")


@pytest.fixture(autouse=True)
def _clean(monkeypatch):
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.delenv("HF_TOKEN_FILE", raising=False)
    forget_secrets()
    yield
    forget_secrets()


def gated_result() -> RunResult:
    failure = download_failure("spark2", DRAFT, CommandResult("hf download", 1, "", GATED_STDERR), "HF_TOKEN")
    outcomes = [TaskOutcome("model.fetch", "model", node, Status.FAILED, message=failure.message, hint=failure.hint)
                for node in ("spark1", "spark2")]
    return RunResult(nodes=["spark1", "spark2"], outcomes=outcomes, unreachable={}, check_mode=False, duration=1.0)


def prompted(inventory, result) -> bool:
    """The run's question, answered by the CLI's prompt."""
    return runs_bootstrap.ask_for_gated_token(inventory, result, cluster_cmd.ask_for_gated_token)


def ok_result() -> RunResult:
    return RunResult(nodes=["spark1", "spark2"], outcomes=[], unreachable={}, check_mode=False, duration=1.0)


def test_the_gated_failure_names_its_repo_for_the_prompt():
    assert gated_repos_failed(gated_result().outcomes) == [DRAFT]
    assert gated_repos_failed(ok_result().outcomes) == []


def test_a_terminal_is_asked_once_and_the_token_is_used_and_masked(tmp_path, monkeypatch):
    inventory = inventory_from_yaml(PAIR, tmp_path)
    monkeypatch.setattr(cluster_cmd, "stdin_is_terminal", lambda: True)
    monkeypatch.setattr(cluster_cmd.click, "prompt", lambda *a, **kw: TOKEN + "\n")
    assert hf_token(inventory) is None
    assert prompted(inventory, gated_result())
    assert hf_token(inventory) == TOKEN
    assert redact_known(f"token {TOKEN}") == "token ********"
    import os
    assert TOKEN not in os.environ.values()  # local subprocesses never inherit it
    # now a token is there: no second prompt, even if the Hub still refuses
    assert not prompted(inventory, gated_result())


def test_no_terminal_or_a_set_token_or_an_empty_answer_means_no_rerun(tmp_path, monkeypatch):
    inventory = inventory_from_yaml(PAIR, tmp_path)
    asked = []
    monkeypatch.setattr(cluster_cmd.click, "prompt", lambda *a, **kw: asked.append(a) or "")
    monkeypatch.setattr(cluster_cmd, "stdin_is_terminal", lambda: False)
    assert not prompted(inventory, gated_result())
    monkeypatch.setattr(cluster_cmd, "stdin_is_terminal", lambda: True)
    assert not prompted(inventory, ok_result())
    assert asked == []
    assert not prompted(inventory, gated_result())  # asked, answered nothing
    assert len(asked) == 1
    monkeypatch.setenv("HF_TOKEN", "hf_SetButNotAllowed0123456789abcdef")
    assert not prompted(inventory, gated_result())
    assert len(asked) == 1


def test_bootstrap_runs_again_after_the_prompt(tmp_path, monkeypatch):
    path = tmp_path / "inv.yaml"
    path.write_text(PAIR)
    runs = []

    openings = []

    def fake_run(inventory, graph, request, bus, command="bootstrap", opening=None):
        runs.append(hf_token(inventory))
        openings.append(opening)
        return gated_result() if len(runs) == 1 else ok_result()

    monkeypatch.setattr(runs_bootstrap, "run_playbook", fake_run)
    monkeypatch.setattr(cluster_cmd, "stdin_is_terminal", lambda: True)
    env = {"HOME": str(tmp_path), "XDG_STATE_HOME": str(tmp_path / "state")}
    result = CliRunner().invoke(cli, ["cluster", "bootstrap", str(path)], input=TOKEN + "\n", env=env)
    assert result.exit_code == 0, result.output
    assert runs == [None, TOKEN]
    # the command's early connections go to the first run; the second (with the token) opens its own
    assert isinstance(openings[0], Opening) and openings[1] is None
    assert f"{DRAFT} is gated" in result.output and "running bootstrap again" in result.output
    assert TOKEN not in result.output

    runs.clear()
    forget_secrets()
    monkeypatch.setattr(cluster_cmd, "stdin_is_terminal", lambda: False)
    result = CliRunner().invoke(cli, ["cluster", "bootstrap", str(path)], env=env)
    assert result.exit_code == 1 and runs == [None]
