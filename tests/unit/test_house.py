"""The test suite's own house rules: no test module imports another (shared helpers live in *_kit modules), and
every module under tests/lab is a lab test (`-m "not lab and not slow"` is the fast loop)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parents[1]


def imported_modules(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return found


def test_no_test_module_imports_another():
    offenders = {}
    for path in sorted(TESTS.rglob("*.py")):
        others = {m for m in imported_modules(path) if m.rsplit(".", 1)[-1].startswith("test_")}
        if others:
            offenders[str(path.relative_to(TESTS))] = sorted(others)
    assert offenders == {}


@pytest.mark.slow
def test_the_fast_loop_collects_no_lab_test():
    """What `-m "not lab"` keeps of tests/lab: nothing, whether a module says pytestmark or not."""
    result = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
                             "-m", "not lab", str(TESTS / "lab")], capture_output=True, text=True, timeout=300,
                            cwd=TESTS.parent)
    assert "no tests collected" in result.stdout and " deselected" in result.stdout, result.stdout[-2000:]
