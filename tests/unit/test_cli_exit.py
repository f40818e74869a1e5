"""The command's exit (cli/main.py `main`, `_leave`): without the interpreter's teardown, and with nothing lost to it:
the exit status, every byte of standard output through a pipe, and a thread that is not a daemon finishing first."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def sparkctl(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", "from sparkctl.cli.main import main; main()", *args],
                          capture_output=True, text=True, timeout=120, cwd=ROOT)


def test_exit_statuses_and_all_of_standard_output_arrive():
    playbooks = sparkctl("playbooks", "--markdown")
    assert playbooks.returncode == 0
    assert playbooks.stdout == (ROOT / "playbooks.md").read_text()  # tens of kB through the pipe, all of it
    missing = sparkctl("inventory", "validate", "/nonexistent/inventory.yaml")
    assert missing.returncode == 2 and "file not found" in missing.stderr


def test_a_thread_that_is_not_a_daemon_finishes_before_the_exit(tmp_path):
    marker = tmp_path / "written"
    code = textwrap.dedent(f"""
        import threading, time
        from sparkctl.cli import main
        def late():
            time.sleep(0.3)
            open({str(marker)!r}, "w").write("done")
        threading.Thread(target=late).start()
        main._leave(3)
        """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert done.returncode == 3 and marker.read_text() == "done"
