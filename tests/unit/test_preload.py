"""runs/preload.py: what the tasks load at their first use, loaded in the background from a run's start. Safe only
for modules whose import needs nothing of sparkctl that is not loaded already (such an import cannot wait on one
another thread is making), and none of them loaded before the run (the reason they are preloaded)."""

from __future__ import annotations

import json
import subprocess
import sys

from sparkctl.runs.preload import LATER, preload

REPO_MODULES = ("sparkctl.cli.main", "sparkctl.cli.options", "sparkctl.cli.cluster_cmd", "sparkctl.runs.rollback",
                "sparkctl.cli.json_view")


def test_the_preloaded_modules_are_not_loaded_before_a_run_and_load_no_other_part_of_sparkctl():
    code = f"""
import importlib, json, sys
for name in {REPO_MODULES!r}:
    importlib.import_module(name)
before = set(sys.modules)
later = {LATER!r}
loaded_before = [m for m in (*later, "jinja2", "prometheus_client") if m in before]
for name in later:
    importlib.import_module(name)
new = sorted(m for m in set(sys.modules) - before if m.startswith("sparkctl") and m not in later)
print(json.dumps({{"loaded_before": loaded_before, "new_sparkctl": new}}))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120)
    assert json.loads(out.stdout) == {"loaded_before": [], "new_sparkctl": []}


def test_a_module_that_cannot_be_loaded_is_left_to_its_own_import():
    thread = preload(("sparkctl_no_such_module", "json"))
    thread.join(30)
    assert not thread.is_alive() and thread.daemon
