"""An inventory file as text and as YAML, within bounds: a regular file of at most 1 MiB, UTF-8, nested at most 32
deep, at most 10 000 values once aliases are expanded (a YAML alias bomb is refused before it is expanded). YAML's
event stream is read first, iteratively: nothing recursive or expanding runs on a file that is too deep or too big.
Then the text is composed once into a node tree (its marks give the lines) and the data is constructed from that
tree; libyaml does the parsing when PyYAML has it (the pure-Python parser takes seconds on a file near the cap).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from sparkctl.errors import InventoryError
from sparkctl.inventory.checks import field_path
from sparkctl.secrets import redacted
from sparkctl.userfiles import UnreadableFile, read_limited

#: libyaml's parser and composer when PyYAML was built with it; the same SafeConstructor and resolver either way.
_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)

MAX_BYTES = 1 << 20
MAX_DEPTH = 32
#: A 64-node inventory with every section written out is about a thousand values.
MAX_VALUES = 10_000
#: No inventory value is longer than a few hundred characters; this bounds what the checks then scan.
MAX_SCALAR = 1 << 16


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
    """(the composed node tree, for line numbers; the plain data constructed from that same tree)."""
    try:
        _check_shape(text, label)
        loader = _Loader(text)
        try:
            root = loader.get_single_node()
            return root, (None if root is None else loader.construct_document(root))
        except _UnreadableValue as err:
            raise InventoryError([_value_problem(label, root, err.node)]) from None
        finally:
            loader.dispose()
    except yaml.YAMLError as err:
        raise InventoryError([_syntax_problem(label, err)]) from None


class _UnreadableValue(Exception):
    """A scalar its tag's constructor cannot make a value of (an invalid date, `!!int abc`, a 5000-digit int)."""

    def __init__(self, node: yaml.Node):
        super().__init__()
        self.node = node


#: No inventory number needs more (a port, a timeout, a size): a longer one is a mistake or an attack. Hex, octal
#: and binary spellings have no length limit in int(), and a decimal over 4300 digits cannot even be printed.
MAX_INT_DIGITS = 100
_MAX_INT = 10 ** MAX_INT_DIGITS


class _Loader(_LOADER):  # type: ignore[misc,valid-type]
    def construct_object(self, node: yaml.Node, deep: bool = False) -> Any:
        try:
            value = super().construct_object(node, deep)
        except (ValueError, TypeError, KeyError, OverflowError):
            # the constructors raise these on a bad scalar (int(), datetime(), a dict lookup for booleans)
            raise _UnreadableValue(node) from None
        if isinstance(value, int) and not isinstance(value, bool) and abs(value) >= _MAX_INT:
            raise _UnreadableValue(node)
        return value


#: What each tag's scalar must look like, for the message.
_TAG_WORDS = {
    "tag:yaml.org,2002:int": "a whole number", "tag:yaml.org,2002:float": "a number",
    "tag:yaml.org,2002:bool": "true or false", "tag:yaml.org,2002:timestamp": "a valid date",
    "tag:yaml.org,2002:null": "null",
}


def _value_problem(label: str, root: yaml.Node | None, node: yaml.Node) -> str:
    """The bad scalar's place and what it should be, never the value itself (it may be a pasted token)."""
    what = _TAG_WORDS.get(node.tag, "a value of its YAML tag")
    if node.tag == "tag:yaml.org,2002:int" and isinstance(node.value, str) and len(node.value) > MAX_INT_DIGITS:
        what = f"a whole number of at most {MAX_INT_DIGITS} digits"
    return (f"{label}:{node.start_mark.line + 1}: {field_path(_path_to(root, node))}: cannot be read as {what} "
            "(correct it, or quote it to make it text)")


def _path_to(root: yaml.Node | None, target: yaml.Node) -> tuple:
    """The pydantic-style location of `target` in the tree (iterative: the tree is at most MAX_DEPTH deep)."""
    stack: list[tuple[yaml.Node, tuple]] = [(root, ())] if root is not None else []
    seen: set[int] = set()
    while stack:
        node, loc = stack.pop()
        if node is target:
            return loc
        if id(node) in seen:
            continue
        seen.add(id(node))
        if isinstance(node, yaml.MappingNode):
            for key, value in node.value:
                if key is target:
                    return loc
                stack.append((value, (*loc, key.value if isinstance(key, yaml.ScalarNode) else "?")))
        elif isinstance(node, yaml.SequenceNode):
            stack.extend((item, (*loc, index)) for index, item in enumerate(node.value))
    return ()


class _Open:
    """A mapping or list whose end the event stream has not reached yet."""

    __slots__ = ("anchor", "before", "is_map", "children", "key", "part")

    def __init__(self, anchor: str | None, before: int, is_map: bool, part: Any):
        self.anchor, self.before, self.is_map, self.part = anchor, before, is_map, part
        self.children, self.key = 0, "?"


_KEY = object()  # the place of a mapping's key: the problem is the mapping's


def _check_shape(text: str, label: str) -> None:
    """Depth and expanded size from the event stream: an alias counts as many values as what it names. Each
    refusal names the field it was met in (the event stream's path of keys and indexes)."""
    size_of: dict[str, int] = {}
    stack: list[_Open] = []
    values = 0

    def place(event: yaml.Event, part: Any = None) -> str:
        loc = tuple(o.part for o in stack[1:] if o.part is not _KEY)
        if part is not None and part is not _KEY:
            loc = (*loc, part)
        line = event.start_mark.line + 1 if event.start_mark else "?"  # the parser always marks; the stubs allow None
        return f"{label}:{line}: {field_path(loc)}"

    def refuse(event: yaml.Event, what: str, part: Any = None) -> InventoryError:
        # an anchor or a key may be a pasted token
        return InventoryError([redacted(f"{place(event, part)}: {what}")])

    for event in yaml.parse(text, Loader=_LOADER):
        part: Any = None
        if isinstance(event, yaml.NodeEvent) and stack:
            parent = stack[-1]
            index, parent.children = parent.children, parent.children + 1
            part = (_KEY if index % 2 == 0 else parent.key) if parent.is_map else index // 1
            if part is _KEY:
                parent.key = event.value if isinstance(event, yaml.ScalarEvent) else "?"
        if isinstance(event, (yaml.MappingStartEvent, yaml.SequenceStartEvent)):
            stack.append(_Open(event.anchor, values, isinstance(event, yaml.MappingStartEvent), part))
            if len(stack) > MAX_DEPTH:
                raise refuse(event, f"nested more than {MAX_DEPTH} levels deep (an inventory is a few levels of "
                                    "mappings and lists)")
        elif isinstance(event, (yaml.MappingEndEvent, yaml.SequenceEndEvent)):
            done = stack.pop()
            values += 1
            if done.anchor is not None:
                size_of[done.anchor] = values - done.before
        elif isinstance(event, yaml.ScalarEvent):
            values += 1
            if len(event.value) > MAX_SCALAR:
                raise refuse(event, f"a value is longer than {MAX_SCALAR} characters (an inventory value is a name, "
                                    "a number or a path: shorten it)", part)
            if event.anchor is not None:
                size_of[event.anchor] = 1
        elif isinstance(event, yaml.AliasEvent) and event.anchor is not None:  # an alias always names one
            if any(o.anchor == event.anchor for o in stack):
                raise refuse(event, f"the alias *{event.anchor} refers to a value that contains it (a loop: write "
                                    "the value out)", part)
            values += size_of.get(event.anchor, 1)
        if values > MAX_VALUES:
            raise refuse(event, f"expands to more than {MAX_VALUES} values (YAML aliases repeat what they name: "
                                "write the inventory out plainly)", part)


def _syntax_problem(label: str, err: yaml.YAMLError) -> str:
    mark = getattr(err, "problem_mark", None) or getattr(err, "context_mark", None)
    line = f"{mark.line + 1}:" if mark is not None else ""
    what = getattr(err, "problem", None) or str(err).splitlines()[0]
    context = getattr(err, "context", None)
    detail = f"{what} ({context})" if context else what
    # a token pasted as an alias or tag name is quoted back by the parser
    return redacted(f"{label}:{line} YAML syntax error: {detail} (check indentation, colons and quotes on that line)")
