"""The fact and probe registries set fields by name (`_set("hostname", ...)`, `setattr(p, "ray_found", ...)`): every
name they write must be a field of the record it lands in. The records have slots, so a misspelt name also fails
at run time instead of quietly adding an attribute; this test finds it before any node is asked."""

from __future__ import annotations

import ast
import dataclasses

import pytest

from sparkctl.doctor.node_probes import SystemProbe
from sparkctl.doctor.snapshot import NodeProbe
from sparkctl.facts.model import Facts
from tests.taskkit import REPO

#: module -> {setter helper or "setattr" on the record's name: the record class}
WRITERS = {
    "sparkctl/facts/sections.py": {"_set": Facts, "_stripped": Facts, ("setattr", "f"): Facts},
    "sparkctl/doctor/probes.py": {"_set": NodeProbe, "_set_system": SystemProbe, ("setattr", "p"): NodeProbe,
                                  ("setattr", "p.system"): SystemProbe},
}


def written_names(path: str) -> list[tuple[int, type, str]]:
    """(line, record, name) of every field name a registry writes, read from the module's source."""
    writers = WRITERS[path]
    out = []
    for node in ast.walk(ast.parse((REPO / path).read_text())):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.args):
            continue
        name = node.func.id
        if name == "setattr" and len(node.args) == 3:
            record = writers.get(("setattr", ast.unparse(node.args[0])))
            field = node.args[1]
        elif name in writers:
            record, field = writers[name], node.args[0]
        else:
            continue
        assert record is not None, f"{path}:{node.lineno}: setattr on {ast.unparse(node.args[0])}: add it to WRITERS"
        if isinstance(field, ast.Constant) and isinstance(field.value, str):
            out.append((node.lineno, record, field.value))
    return out


@pytest.mark.parametrize("path", sorted(WRITERS))
def test_every_name_a_registry_writes_is_a_field_of_its_record(path):
    found = written_names(path)
    assert len(found) >= 10, found  # the reader sees the registry (a rename of the helpers would hide it)
    unknown = [(line, record.__name__, name) for line, record, name in found
               if name not in {f.name for f in dataclasses.fields(record)}]
    assert unknown == []


def test_a_misspelt_field_fails_at_once():
    facts = Facts(node="spark1")
    with pytest.raises(AttributeError):
        facts.hostnmae = "x"  # type: ignore[attr-defined]
    with pytest.raises(AttributeError):
        NodeProbe.__new__(NodeProbe).ray_fuond = True  # type: ignore[attr-defined]
