"""The fact and probe registries name no field by a string: each entry's read is a function that assigns the
fields itself, or a lambda returning `replace(record, field=value)`, whose names and types mypy checks against the
dataclass (the test command runs mypy). The records have slots, so a misspelt assignment fails at once too."""

from __future__ import annotations

import ast

import pytest

from sparkctl.doctor.snapshot import NodeProbe
from sparkctl.facts.model import Facts
from tests.taskkit import REPO

REGISTRIES = {"sparkctl/facts/sections.py": "FactSection", "sparkctl/doctor/probes.py": "ProbeSection"}


def reads(path: str) -> list[ast.expr]:
    """The `read` argument (the third) of every registry entry in the module."""
    tree = ast.parse((REPO / path).read_text())
    return [node.args[2] for node in ast.walk(tree) if isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name) and node.func.id == REGISTRIES[path] and len(node.args) >= 3]


@pytest.mark.parametrize("path", sorted(REGISTRIES))
def test_no_registry_entry_names_a_field_by_a_string(path):
    found = reads(path)
    assert len(found) >= 15, found  # the reader sees the registry
    source = (REPO / path).read_text()
    assert "setattr(" not in source and "getattr(" not in source
    for read in found:
        if isinstance(read, ast.Lambda):
            body = read.body
            assert isinstance(body, ast.Call) and ast.unparse(body.func) == "replace", ast.unparse(read)
            assert not body.args[1:] and all(k.arg for k in body.keywords), ast.unparse(read)  # fields by keyword
        else:
            assert isinstance(read, ast.Name) and read.id.startswith("_read"), ast.unparse(read)


def test_a_misspelt_field_fails_at_once():
    facts = Facts(node="spark1")
    with pytest.raises(AttributeError):
        facts.hostnmae = "x"  # type: ignore[attr-defined]
    with pytest.raises(AttributeError):
        NodeProbe().ray_fuond = True  # type: ignore[attr-defined]
