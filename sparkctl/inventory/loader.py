"""Reading an inventory file: every problem in one pass, each `FILE:LINE: FIELD: what is wrong (what to do)`.

Lines come from YAML's composer (each node's start mark), keyed by the same location tuples pydantic uses,
so a schema error and a cross-field problem are placed the same way.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any, get_args

import yaml
from pydantic import BaseModel, TypeAdapter, ValidationError

from sparkctl.errors import InventoryError
from sparkctl.inventory import source
from sparkctl.inventory.checks import (
    SKIP_CROSS_CHECKS,
    InventoryParts,
    Loc,
    Problem,
    credential_problems,
    cross_check_problems,
    cross_check_warnings,
    field_path,
)
from sparkctl.inventory.local_files import local_file_problems
from sparkctl.inventory.model import Inventory
from sparkctl.inventory.sections import Node
from sparkctl.inventory.tls_check import tls_checks
from sparkctl.secrets import looks_like_credential, mask_credentials

# Sections the cross-field checks read; each is validated on its own when the whole file does not validate.
CHECKED_SECTIONS = ("fabric", "serve", "container", "ssh", "firewall")
#: Problems printed at most; past this the rest are counted (a generated file can have thousands).
MAX_SHOWN = 50


def load_inventory(path: str | Path) -> Inventory:
    path = Path(path)
    label = str(path)
    root, data = source.parse(source.read_text(path), label)

    lines: dict[Loc, int] = {}
    problems: list[Problem] = []
    if root is not None:
        problems += _map_lines(root, (), lines)
    if not isinstance(data, dict):
        kind = "an empty file" if data is None else _kind(data)
        line = lines.get((), 1)
        raise InventoryError([f"{label}:{line}: top level: expected a mapping with `user:` and `nodes:`, "
                              f"got {kind} (see inventories/two-sparks.yaml)"])

    inventory = None
    try:
        inventory = Inventory.model_validate(data, context={SKIP_CROSS_CHECKS: True})
        parts = inventory.parts()
    except ValidationError as err:
        errors = _one_branch(err.errors(), data)
        problems += [_describe(error) for error in errors]
        parts = _valid_parts(data, [tuple(error["loc"]) for error in errors])
    problems += cross_check_problems(parts)
    problems += local_file_problems(parts)
    tls_problems, tls_warnings = tls_checks(parts)
    problems += tls_problems
    # a credential where it does not belong is the problem at its place, whatever else is wrong there
    secrets = credential_problems(data)
    pasted = {loc for loc, _ in secrets}
    problems = [p for p in problems if p[0] not in pasted] + secrets

    if problems:
        placed = sorted(((_nearest_line(lines, loc), loc, message) for loc, message in problems),
                        key=lambda item: item[0])
        shown = [mask_credentials(f"{label}:{line}: {field_path(loc)}: {message}")
                 for line, loc, message in placed[:MAX_SHOWN]]
        if len(placed) > MAX_SHOWN:
            shown.append(f"{label}: and {len(placed) - MAX_SHOWN} more problems (fix the ones above, then validate "
                         "again)")
        raise InventoryError(shown)
    assert inventory is not None  # a validation error is a problem: raised above
    inventory._source = path
    inventory._lines = lines
    inventory._warnings = [mask_credentials(f"{label}:{_nearest_line(lines, loc)}: {field_path(loc)}: {message}")
                           for loc, message in [*cross_check_warnings(parts), *tls_warnings]]
    return inventory


#: how pydantic names the branches of a `Settings | Literal["off"]` field in an error's location
_BRANCH = re.compile(r"[A-Z][A-Za-z]*Settings\Z|literal\[")


def _one_branch(errors: list[Any], data: Any) -> list[Any]:
    """The errors of a `Settings | Literal["off"]` field (watchdog, firewall) from the branch the value meant: a
    mapping is the settings (the literal's complaint dropped), a word the literal; the branch's name leaves the
    location, so `firewall.allow[0]` is said, not `firewall.FirewallSettings.allow[0]`."""
    out = []
    for error in errors:
        loc = tuple(error["loc"])
        at = next((i for i, part in enumerate(loc) if isinstance(part, str) and _BRANCH.match(part)), None)
        if at is None:
            out.append(error)
            continue
        given = _value_at(data, loc[:at])
        if isinstance(given, dict) == loc[at].startswith("literal["):
            continue
        out.append({**error, "loc": loc[:at] + loc[at + 1:]})
    return out


def _value_at(data: Any, loc: Loc) -> Any:
    for part in loc:
        try:
            data = data[part]
        except (KeyError, IndexError, TypeError):
            return None
    return data


def _map_lines(node: yaml.Node, loc: Loc, lines: dict[Loc, int]) -> list[Problem]:
    """Fill lines[loc] for every key and list item under node; return the duplicate keys found."""
    problems: list[Problem] = []
    lines.setdefault(loc, node.start_mark.line + 1)
    if isinstance(node, yaml.MappingNode):
        seen: dict[Any, int] = {}
        for key_node, value_node in node.value:
            if not isinstance(key_node, yaml.ScalarNode):
                continue
            key, line = key_node.value, key_node.start_mark.line + 1
            at: Loc = (*loc, key)
            if key in seen:
                problems.append((at, f"duplicate key, line {seen[key]} has it too (YAML keeps only the last one: "
                                     "remove one)"))
            seen[key] = line
            lines[at] = line
            problems += _map_lines(value_node, at, lines)
    elif isinstance(node, yaml.SequenceNode):
        for index, item in enumerate(node.value):
            at = (*loc, index)
            lines[at] = item.start_mark.line + 1
            problems += _map_lines(item, at, lines)
    return problems


def _nearest_line(lines: dict[Loc, int], loc: Loc) -> int:
    while loc not in lines and loc:
        loc = loc[:-1]
    return lines.get(loc, 1)


def _valid_parts(data: dict, error_locs: list[Loc]) -> InventoryParts:
    """Re-validate, section by section, what the whole-file validation did not reject."""
    failed = {loc[0] for loc in error_locs if loc}
    failed_nodes = {loc[1] for loc in error_locs if len(loc) > 1 and loc[0] == "nodes"}

    def section(name: str) -> Any:
        if name in failed:
            return None
        field = Inventory.model_fields[name]
        assert field.annotation is not None  # every section of Inventory is annotated
        try:
            if name in data:
                return TypeAdapter(field.annotation).validate_python(data[name])
            return field.get_default(call_default_factory=True)
        except ValidationError:
            return None

    raw_nodes = data.get("nodes")
    node_count, nodes = None, []
    if isinstance(raw_nodes, list) and raw_nodes and ("nodes",) not in error_locs:
        node_count = len(raw_nodes)
        for index, raw in enumerate(raw_nodes):
            nodes.append(None if index in failed_nodes else Node.model_validate(raw))
    sections = {name: section(name) for name in CHECKED_SECTIONS}
    return InventoryParts(node_count=node_count, nodes=nodes, serving="serve" in data, **sections)


def _describe(error: Mapping[str, Any]) -> Problem:
    loc, kind, msg = tuple(error["loc"]), error["type"], error["msg"]
    given = error.get("input")
    if kind == "extra_forbidden":
        allowed = _allowed_keys(loc[:-1])
        close = difflib.get_close_matches(str(loc[-1]), allowed, n=1)
        if close:
            return loc, f"unknown key (did you mean {close[0]!r}?)"
        return loc, f"unknown key (allowed here: {', '.join(allowed)})"
    if kind == "missing":
        description = _field_description(loc)
        return loc, "required field missing (add it" + (f": {description})" if description else ")")
    if kind == "value_error":
        return loc, str(error["ctx"]["error"])
    if kind == "literal_error":
        expected = error["ctx"]["expected"]
        if isinstance(given, str) and not looks_like_credential(given):
            options = [o.strip(" '") for o in expected.replace(" or ", ", ").split(",")]
            close = difflib.get_close_matches(given, options, n=1)
            hint = f"did you mean {close[0]!r}?" if close else f"use {expected}"
            return loc, f"{given!r} is not allowed ({hint})"
        return loc, f"must be {expected} (use one of these)"
    if kind == "too_short" and loc == ("nodes",):
        return loc, "needs at least one node (list the Sparks, head first)"
    if kind == "too_long":
        most, got = error["ctx"]["max_length"], error["ctx"].get("actual_length", "more")
        return loc, f"at most {most} entries, {got} given (remove some)"
    if kind == "finite_number":
        return loc, "must be a finite number (e.g. 10)"
    # pydantic's detail after the comma ("unable to parse string as an integer") repeats what `got` says
    wanted = msg.removeprefix("Input should be ").split(",")[0]
    if kind in ("greater_than", "greater_than_equal", "less_than", "less_than_equal"):
        return loc, f"must be {wanted} (set a number in that range)"
    how = _WRITE.get(wanted, 'see `sparkctl inventory schema`')
    return loc, f"wrong type: expected {wanted}, got {_kind(given)} ({how})"


#: How to write what a field expects, by pydantic's name for it.
_WRITE = {
    "a valid integer": "write a whole number without quotes, e.g. 2233",
    "a valid number": "write a number without quotes, e.g. 10",
    "a valid string": "write text, quoted if it could read as a number or true/false",
    "a valid boolean": "write true or false",
    "a valid dictionary": "write a mapping of key: value lines",
    "a valid list": "write a list, [a, b] or one `- item` per line",
}


def _kind(value: Any) -> str:
    if value is None:
        return "nothing (null)"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, list):
        return "a list"
    return type(value).__name__


def _model_at(loc: Loc) -> type[BaseModel] | None:
    model: type[BaseModel] | None = Inventory
    for part in loc:
        if isinstance(part, int):
            continue
        if model is None or part not in model.model_fields:
            return None
        model = _model_in(model.model_fields[part].annotation)
    return model


def _model_in(annotation: Any) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in get_args(annotation):
        found = _model_in(arg)
        if found is not None:
            return found
    return None


def _allowed_keys(loc: Loc) -> list[str]:
    model = _model_at(loc)
    return list(model.model_fields) if model else []


def _field_description(loc: Loc) -> str | None:
    model = _model_at(loc[:-1])
    field = model.model_fields.get(str(loc[-1])) if model else None
    return field.description if field else None
