"""Every doctor finding id closes: the tasks that repair it, or why a person must (sparkctl/doctor/catalog.py).

A finding is made only by `finding(TYPE, ...)` with a type of the catalog, which says how it closes: so no finding
can be added without deciding that. The types the code uses are read from the source itself: every `finding(...)`
anywhere in sparkctl/, its type a catalog name or `FINDINGS[id]` with the id a literal, a name bound to literals,
a dict of literals indexed, or a call of a function whose every return is a literal; a type nothing uses fails.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from click.testing import CliRunner
from rich.console import Console

from sparkctl.cli.doctor_cmd import render_diagnosis
from sparkctl.cli.main import cli
from sparkctl.doctor import catalog
from sparkctl.doctor.catalog import FINDINGS, remedies_markdown
from sparkctl.doctor.findings import KINDS, Diagnosis, FindingType, finding
from sparkctl.runs.playbooks import bootstrap_graph, playbooks_markdown

PACKAGE = Path(__file__).resolve().parents[2] / "sparkctl"


class Unreadable(Exception):
    pass


_MODULES: dict[int, ast.Module] = {}


def module_of(scope: ast.AST) -> ast.Module:
    return _MODULES[id(scope)]


def _literals(expr: ast.AST, scope: ast.AST, functions: dict[str, ast.FunctionDef], seen: set[str]) -> set[str]:
    """The string literals an id expression can evaluate to."""
    if isinstance(expr, ast.Constant) and isinstance(expr.value, str):
        return {expr.value}
    if isinstance(expr, ast.IfExp):
        return _literals(expr.body, scope, functions, seen) | _literals(expr.orelse, scope, functions, seen)
    if isinstance(expr, ast.Call) and isinstance(expr.func, ast.Name) and expr.func.id in functions:
        name = expr.func.id
        if name in seen:
            return set()
        fn = functions[name]
        out: set[str] = set()
        for node in ast.walk(fn):
            if isinstance(node, ast.Return) and node.value is not None:
                out |= _literals(node.value, fn, functions, seen | {name})
        return out
    if isinstance(expr, ast.Subscript) and isinstance(expr.value, ast.Name):
        # ids[key] of a dict literal bound to a name: every value it holds
        out = set()
        for node in ast.walk(module_of(scope)):
            if isinstance(node, ast.Assign | ast.AnnAssign) and isinstance(node.value, ast.Dict) and any(
                    isinstance(t, ast.Name) and t.id == expr.value.id
                    for t in (node.targets if isinstance(node, ast.Assign) else [node.target])):
                for value in node.value.values:
                    out |= _literals(value, scope, functions, seen)
        if out:
            return out
    if isinstance(expr, ast.Name):
        out = set()
        for node in ast.walk(scope):
            if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == expr.id for t in node.targets):
                out |= _literals(node.value, scope, functions, seen)
        if out:
            return out
    raise Unreadable(ast.unparse(expr))


def _enclosing(tree: ast.Module) -> dict[int, ast.AST]:
    """id(call) -> the innermost function around it (or the module)."""
    out: dict[int, ast.AST] = {}

    def visit(node: ast.AST, scope: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            inner = child if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef) else scope
            out[id(child)] = inner
            visit(child, inner)

    visit(tree, tree)
    return out


def finding_ids_in_source() -> tuple[dict[str, list[str]], list[str]]:
    """({id: [file:line, ...]}, [file:line: why an id could not be read])."""
    ids: dict[str, list[str]] = {}
    unreadable = []
    for path in sorted(PACKAGE.rglob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        functions = {n.name: n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)}
        scopes = _enclosing(tree)
        _MODULES.update({id(n): tree for n in ast.walk(tree)})
        for node in ast.walk(tree):
            if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Name):
                continue
            where = f"{path.relative_to(PACKAGE.parent)}:{node.lineno}"
            if node.func.id == "Finding" and path.name != "findings.py":
                unreadable.append(f"{where}: a Finding made by hand: make it with finding(TYPE, ...)")
                continue
            if node.func.id != "finding" or not node.args:
                continue
            kind = node.args[0]
            if isinstance(kind, ast.Name) and isinstance(getattr(catalog, kind.id, None), FindingType):
                ids.setdefault(getattr(catalog, kind.id).id, []).append(where)
                continue
            if not (isinstance(kind, ast.Subscript) and isinstance(kind.value, ast.Name)
                    and kind.value.id == "FINDINGS"):
                unreadable.append(f"{where}: the finding's type {ast.unparse(kind)} is neither a name of the catalog "
                                  "nor FINDINGS[id]")
                continue
            try:
                found = _literals(kind.slice, scopes.get(id(node), tree), functions, set())
            except Unreadable as exc:
                unreadable.append(f"{where}: FINDINGS[{exc}]: the id is not a literal, a name bound to literals, a "
                                  "dict of literals indexed, or a function returning literals")
                continue
            for finding_id in found:
                ids.setdefault(finding_id, []).append(where)
    return ids, unreadable


def test_the_source_reading_sees_the_known_ids_including_computed_ones():
    ids, unreadable = finding_ids_in_source()
    assert not unreadable, "\n".join(unreadable)
    # a literal, a function of literals (container._env_id), the crash report in diagnose.py
    assert {"fabric.port_down", "env.iface_down", "nccl.ib_hca_partial", "doctor.check_failed"} <= set(ids)
    assert len(ids) >= 50


def test_every_finding_id_the_code_can_produce_has_a_repair_or_a_reason():
    ids, _ = finding_ids_in_source()
    missing = {i: where for i, where in ids.items() if i not in FINDINGS}
    assert not missing, (
        "finding ids with neither a repairing task nor a person's reason; add each to FINDINGS in "
        f"sparkctl/doctor/catalog.py (see docs/architecture.md, 'Adding a doctor check'): {missing}")


def test_the_table_names_no_id_the_code_no_longer_produces():
    ids, _ = finding_ids_in_source()
    assert sorted(set(FINDINGS) - set(ids)) == []


def test_every_repairing_task_is_a_bootstrap_task_or_phase():
    graph = bootstrap_graph()
    unknown = {i: [t for t in r.tasks if t not in graph and t not in graph.phases]
               for i, r in FINDINGS.items()}
    assert {i: t for i, t in unknown.items() if t} == {}


def test_every_reason_says_what_a_person_deals_with():
    for finding_id, r in FINDINGS.items():
        assert r.about, finding_id
        if not r.repairable:
            assert r.kind in KINDS and len(r.person) > 20, finding_id
            assert r.needs_person.startswith(f"needs you ({KINDS[r.kind]}): "), finding_id


@pytest.mark.parametrize("bad", [dict(about="x"), dict(about="x", tasks=("network",), person="y", kind="cable"),
                                 dict(about="x", person="a reason", kind="weather"),
                                 dict(about="x", tasks=("network",), severity="fatal"),
                                 dict(about="x", tasks=("network",), phase="lunch")])
def test_a_finding_type_has_exactly_one_of_tasks_or_a_reason_and_a_known_severity_and_phase(bad):
    with pytest.raises(ValueError):
        FindingType(**{"id": "x.y", "severity": "error", "phase": "node", **bad})


def test_the_table_is_generated_into_playbooks_md_and_doctor_list():
    table = remedies_markdown()
    for finding_id in FINDINGS:
        assert f"| `{finding_id}` |" in table
    assert table in playbooks_markdown()  # playbooks.md itself is kept in sync by test_playbooks_md
    result = CliRunner().invoke(cli, ["doctor", "--list"])
    assert result.exit_code == 0 and result.stdout == table


def test_a_finding_says_how_it_closes_in_json_and_on_the_console():
    repairable = finding(catalog.FABRIC_MTU_MISMATCH, "spark2", "mtu", "MTU 1500", "sparkctl cluster bootstrap")
    manual = finding(catalog.FABRIC_NO_CARRIER, "spark1", "no carrier", "no carrier", "check the cable")
    assert repairable.to_dict()["closed_by"] == {"tasks": ["network.netplan", "network.verify"]}
    assert manual.to_dict()["closed_by"] == {"person": "cable", "why": FINDINGS["fabric.no_carrier"].person}
    console = Console(record=True, width=300)
    render_diagnosis(console, Diagnosis([repairable, manual], nodes=["spark1", "spark2"]))
    text = console.export_text()
    assert "repair: `sparkctl doctor --fix` or a bootstrap rerun runs network.netplan, network.verify" in text
    assert f"needs you (a cable or a port): {FINDINGS['fabric.no_carrier'].person}" in text
