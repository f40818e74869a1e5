"""The test suite's own house rules: no test module imports another (shared helpers live in *_kit modules), and
every module under tests/lab is a lab test (`-m "not lab and not slow"` is the fast loop)."""

from __future__ import annotations

import ast
from pathlib import Path

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


def test_every_lab_module_is_marked_by_its_folder():
    conftest = (TESTS / "lab" / "conftest.py").read_text()
    assert "def pytest_collection_modifyitems" in conftest and "pytest.mark.lab" in conftest
