"""The run journal on disk: private, one file per run, newest kept, readable after a crash, never a secret."""

from __future__ import annotations

import os
import stat

from sparkctl.runs.journal import Journal, latest_runs, read_run
from sparkctl.secrets import MASK, forget_secrets, register_secret
from sparkctl.taskgraph import Event


def test_a_journal_is_private_and_created_on_the_first_event(tmp_path):
    directory = tmp_path / "runs"
    journal = Journal(directory, command="bootstrap")
    assert journal.path is None and not directory.exists()
    journal(Event("run_start"))
    journal.close()
    assert stat.S_IMODE(os.stat(directory).st_mode) == 0o700
    assert stat.S_IMODE(os.stat(journal.path).st_mode) == 0o600
    assert journal.path.name.endswith("-bootstrap.jsonl")


def test_a_line_cut_short_by_a_crash_is_dropped_not_fatal(tmp_path):
    with Journal(tmp_path, command="doctor") as journal:
        journal(Event("run_start"))
        journal(Event("log", message="half"))
    text = journal.path.read_text()
    journal.path.write_text(text[:-9])  # the last line loses its end, as when the process is killed mid-write
    events = read_run(journal.path)
    assert [e["event"] for e in events] == ["run_start"]


def test_latest_runs_are_newest_first_and_the_running_journal_is_never_pruned(tmp_path):
    for name in ("20260101T000000.000000Z-bootstrap.jsonl", "20260102T000000.000000Z-doctor.jsonl"):
        (tmp_path / name).write_text("{}\n")
    journal = Journal(tmp_path, command="down", keep=1)
    journal(Event("run_start"))
    journal.close()
    assert latest_runs(5, tmp_path) == [journal.path]  # the two older ones were pruned, ours kept
    assert latest_runs(0, tmp_path) == [] and latest_runs(3, tmp_path / "absent") == []


def test_command_names_cannot_escape_the_directory(tmp_path):
    with Journal(tmp_path, command="../../etc/x y") as journal:
        journal(Event("run_start"))
    assert journal.path.parent == tmp_path and "/" not in journal.path.name.removesuffix(".jsonl")


def test_every_string_of_every_event_is_redacted(tmp_path):
    token = "hf_JournalSecret0123456789abcdef"
    register_secret(token)
    try:
        with Journal(tmp_path) as journal:
            journal(Event("task_changes", task="model.token", changes=[{"summary": f"write {token}", "diff": token}],
                          data={"extra": {"nested": [token]}}))
    finally:
        forget_secrets()
    text = journal.path.read_text()
    assert token not in text and text.count(MASK) == 3


def test_each_cluster_keeps_its_own_journals(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path))
    for i in range(3):
        with Journal(command="bootstrap", cluster="pair", keep=2) as journal:
            journal.write(Event("log", message=f"pair {i}"))
    with Journal(command="bootstrap", cluster="../ring", keep=2) as journal:
        journal.write(Event("log", message="ring"))
    pair = latest_runs(5, cluster="pair")
    assert [read_run(p)[0]["message"] for p in pair] == ["pair 2", "pair 1"]  # pruned within the cluster only
    assert [read_run(p)[0]["message"] for p in latest_runs(5, cluster="../ring")] == ["ring"]
    assert journal.path.parent == tmp_path / "sparkctl" / "runs" / "_ring"
