"""An inventory file as text and as YAML, within bounds: a regular file of at most 1 MiB, UTF-8, nested at most 32
deep, at most 50 000 values once aliases are expanded (a YAML alias bomb is refused before it is expanded). YAML's
event stream is read first, iteratively: nothing recursive or expanding runs on a file that is too deep or too big.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from sparkctl.errors import InventoryError
from sparkctl.userfiles import UnreadableFile, read_limited

MAX_BYTES = 1 << 20
MAX_DEPTH = 32
MAX_VALUES = 50_000


def read_text(path: Path) -> str:
    label = str(path)
    try:
        data = read_limited(path, MAX_BYTES)
    except UnreadableFile as err:
        hint = {"file not found": "check the path"}.get(err.reason, "give the inventory's YAML file")
        raise InventoryError([f"{label}: {err.reason} ({hint})"]) from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        line = data[:err.start].count(b"\n") + 1
        raise InventoryError([f"{label}: cannot read: not UTF-8 text (line {line}; save the inventory as UTF-8)"]) \
            from None


def parse(text: str, label: str) -> tuple[yaml.Node | None, Any]:
    """(the composed node tree, for line numbers; the plain data)."""
    try:
        _check_shape(text, label)
        return yaml.compose(text, Loader=yaml.SafeLoader), yaml.safe_load(text)
    except yaml.YAMLError as err:
        raise InventoryError([_syntax_problem(label, err)]) from None


def _check_shape(text: str, label: str) -> None:
    """Depth and expanded size from the event stream: an alias counts as many values as what it names."""
    size_of: dict[str, int] = {}
    stack: list[tuple[str | None, int]] = []  # (anchor, values counted before the collection started)
    values = 0
    for event in yaml.parse(text, Loader=yaml.SafeLoader):
        if isinstance(event, (yaml.MappingStartEvent, yaml.SequenceStartEvent)):
            stack.append((event.anchor, values))
            if len(stack) > MAX_DEPTH:
                raise InventoryError([f"{label}:{event.start_mark.line + 1}: nested more than {MAX_DEPTH} levels "
                                      "deep (an inventory is a few levels of mappings and lists)"])
        elif isinstance(event, (yaml.MappingEndEvent, yaml.SequenceEndEvent)):
            anchor, before = stack.pop()
            values += 1
            if anchor is not None:
                size_of[anchor] = values - before
        elif isinstance(event, yaml.ScalarEvent):
            values += 1
            if event.anchor is not None:
                size_of[event.anchor] = 1
        elif isinstance(event, yaml.AliasEvent):
            if any(anchor == event.anchor for anchor, _ in stack):
                raise InventoryError([f"{label}:{event.start_mark.line + 1}: the alias *{event.anchor} refers to a "
                                      "value that contains it (a loop: write the value out)"])
            values += size_of.get(event.anchor, 1)
        if values > MAX_VALUES:
            raise InventoryError([f"{label}:{event.start_mark.line + 1}: expands to more than {MAX_VALUES} values "
                                  "(YAML aliases repeat what they name: write the inventory out plainly)"])


def _syntax_problem(label: str, err: yaml.YAMLError) -> str:
    mark = getattr(err, "problem_mark", None) or getattr(err, "context_mark", None)
    line = f"{mark.line + 1}:" if mark is not None else ""
    what = getattr(err, "problem", None) or str(err).splitlines()[0]
    context = getattr(err, "context", None)
    detail = f"{what} ({context})" if context else what
    return f"{label}:{line} YAML syntax error: {detail} (check indentation, colons and quotes on that line)"
