"""What each SGLang release's server accepts, and a check of its flags as that release's own argparse would judge them.

The data is `sglang_releases.json` beside this module, written by `scripts/sglang_knowledge.py` from SGLang's own
source of each release (the PyPI distribution of the release: `python/sglang/srt/server_args.py`, `environ.py`, the
metrics collector, the CLI entry points); each release records its source (the distribution and its sha256, the
sha256 of every file read).

SGLang's server parses its flags with plain argparse (ServerArgs.add_cli_args): option strings are matched as
written (`--tp_size` is unknown), a unique prefix of a long option is accepted (`--tp 2`), an on/off flag takes no
value, and `--config FILE` is read only as two tokens. The speculative-decoding and multi-node checks the release
makes at start (ServerArgs.__post_init__) are recorded as expression trees over its fields and evaluated here.

The release of an image comes from the tag map (`lmsysorg/sglang:spark`, NGC `nvcr.io/nvidia/sglang:<YY.MM>-py3`,
each with where its release is said) or a version tag (`lmsysorg/sglang:v0.5.8-cu130`); a release not in the data is
judged against the nearest known one, and says so.
"""

from __future__ import annotations

import difflib
import json
import operator
import re
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

DATA_PATH = Path(__file__).with_name("sglang_releases.json")
_VERSION = re.compile(r"^v?(\d+)\.(\d+)\.(\d+)(?:\.post(\d+))?(?:[-+].*)?$")
_NEGATIVE_NUMBER = re.compile(r"^-\d+$|^-\d*\.\d+$")  # argparse's _negative_number_matcher
_ORDERING = {"<", "<=", ">", ">="}
_ARITHMETIC = {"+": operator.add, "-": operator.sub, "*": operator.mul, "%": operator.mod,
               "//": operator.floordiv, "/": operator.truediv}


@dataclass(frozen=True, order=True)
class SglangVersion:
    """A release number as SGLang tags it: 0.5.3 < 0.5.3.post1 < 0.5.3.post3 < 0.5.4 (post -1: not a post release)."""

    major: int
    minor: int
    patch: int
    post: int = -1

    @classmethod
    def parse(cls, text: str) -> SglangVersion | None:
        m = _VERSION.match(text.strip())
        return cls(int(m[1]), int(m[2]), int(m[3]), int(m[4]) if m[4] else -1) if m else None

    def __str__(self) -> str:
        return f"{self.major}.{self.minor}.{self.patch}" + (f".post{self.post}" if self.post >= 0 else "")


@cache
def _data() -> dict:
    return json.loads(DATA_PATH.read_text())


@cache
def _releases() -> dict[str, dict]:
    return _data()["releases"]


def image_tags() -> dict[str, str]:
    """Image -> the SGLang release it ships, for the tags whose release is not in the tag itself."""
    return dict(_data()["images"]["tags"])


def image_source(image: str) -> str:
    """Where the release of a mapped image is said (a secondary source says so)."""
    return str(_data()["images"].get("sources", {}).get(image.split("@", 1)[0], ""))


def release_of(image: str | None) -> SglangVersion | None:
    """The SGLang release of an image: the tag map first, else a version tag (`lmsysorg/sglang:v0.5.8-cu130`)."""
    if not image:
        return None
    bare = image.split("@", 1)[0]
    known = image_tags().get(bare)
    if known:
        return SglangVersion.parse(known)
    m = re.match(_data()["images"]["version_tag"]["pattern"], bare)
    return SglangVersion.parse(m["version"]) if m else None


def known_releases() -> list[SglangVersion]:
    return sorted(v for v in (SglangVersion.parse(k) for k in _releases()) if v is not None)


@dataclass(frozen=True)
class Problem:
    """One flag the release would refuse at parse time, or a combination it would stop on at start."""

    where: tuple[str | int, ...]  # ("args", 3) | ("speculative",) | ("multi-node",)
    message: str
    hint: str = ""


class _Unknown:
    """A value the recorded checks cannot know from the flags (a model's config, a device, an env var)."""

    def __repr__(self) -> str:
        return "UNKNOWN"


UNKNOWN: Any = _Unknown()


class _Stops(Exception):
    """Python would raise here: the TypeError message, and the field found None."""

    def __init__(self, message: str, field: str | None):
        super().__init__(message)
        self.message, self.field = message, field


def _type_name(value: Any) -> str:
    return type(value).__name__


class _Evaluation:
    """The recorded expressions evaluated as Python would, three-valued: a field the flags do not give, nor its
    default, is UNKNOWN, and so is anything that depends on it; `None > 1` raises as it does in Python."""

    def __init__(self, values: Mapping[str, Any], assignments: list[dict[str, Any]]):
        self.values, self.assignments = values, assignments
        self.done: dict[int, tuple[Any, str | None]] = {}

    def value(self, tree: Any) -> Any:
        return self.named(tree)[0]

    def named(self, tree: Any) -> tuple[Any, str | None]:
        """(value, the field it came from, if it is one field as set)."""
        head = tree[0]
        if head == "field":
            return self.values.get(tree[1], UNKNOWN), tree[1]
        if head == "set":
            if tree[1] not in self.done:
                self.done[tree[1]] = self.named(self.assignments[tree[1]]["value"])
            return self.done[tree[1]]
        if head == "cond":
            test = self.value(tree[1])
            if test is UNKNOWN:
                new, old = self.named(tree[2]), self.named(tree[3])
                return new if new[0] == old[0] and new[0] is not UNKNOWN else (UNKNOWN, None)
            return self.named(tree[2] if test else tree[3])
        return self.compute(tree), None

    def compute(self, tree: Any) -> Any:
        head, args = tree[0], tree[1:]
        if head == "const":
            return args[0]
        if head == "tuple":
            items = [self.value(a) for a in args]
            return UNKNOWN if UNKNOWN in items else tuple(items)
        if head in ("and", "or"):
            return self.boolean(head, args)
        if head == "not":
            inner = self.value(args[0])
            return UNKNOWN if inner is UNKNOWN else not inner
        if head == "cmp":
            return self.compare(args[0], args[1], args[2])
        if head == "bin":
            return self.arithmetic(args[0], args[1], args[2])
        if head in ("upper", "lower"):
            inner = self.value(args[0])
            return getattr(inner, head)() if isinstance(inner, str) else UNKNOWN
        if head == "startswith":
            inner, prefix = self.value(args[0]), self.value(args[1])
            return inner.startswith(prefix) if isinstance(inner, str) and isinstance(prefix, str) else UNKNOWN
        return UNKNOWN  # opaque: a call, a local, an env var

    def boolean(self, op: str, args: list[Any]) -> Any:
        """Short-circuit as Python does; past an UNKNOWN operand a TypeError is not certain, so it is UNKNOWN."""
        result: Any = op == "and"
        for arg in args:
            try:
                value = self.value(arg)
            except _Stops:
                if result is UNKNOWN:
                    return UNKNOWN
                raise
            if value is UNKNOWN:
                result = UNKNOWN
            elif (op == "and") != bool(value):
                return value
            elif result is not UNKNOWN:
                result = value
        return result

    def compare(self, op: str, left_tree: Any, right_tree: Any) -> Any:
        (left, field), right = self.named(left_tree), self.value(right_tree)
        if UNKNOWN in (left, right) and not (op in ("is", "is not") and right is None and left is not UNKNOWN):
            return UNKNOWN
        if op in _ORDERING and (left is None or right is None):
            raise _Stops(f"'{op}' not supported between instances of '{_type_name(left)}' and "
                         f"'{_type_name(right)}'", field if left is None else None)
        operations = {"==": lambda: left == right, "!=": lambda: left != right, "<": lambda: left < right,
                      "<=": lambda: left <= right, ">": lambda: left > right, ">=": lambda: left >= right,
                      "in": lambda: left in right, "not in": lambda: left not in right,
                      "is": lambda: left is right, "is not": lambda: left is not right}
        try:
            return operations[op]()
        except TypeError:
            return UNKNOWN

    def arithmetic(self, op: str, left_tree: Any, right_tree: Any) -> Any:
        (left, field), right = self.named(left_tree), self.value(right_tree)
        if UNKNOWN in (left, right):
            return UNKNOWN
        if left is None or right is None:
            raise _Stops(f"unsupported operand type(s) for {op}: '{_type_name(left)}' and '{_type_name(right)}'",
                         field if left is None else None)
        try:
            return _ARITHMETIC[op](left, right)
        except (TypeError, ZeroDivisionError):
            return UNKNOWN


@dataclass(frozen=True)
class SglangSchema:
    """One release's server: its flags and parser, speculative algorithms and checks, multi-node checks, entry
    points, env, metrics."""

    version: SglangVersion
    raw: dict

    @property
    def flags(self) -> dict[str, dict[str, Any]]:
        return self.raw["server_flags"]

    @property
    def source(self) -> dict:
        return self.raw["source"]

    @property
    def speculative(self) -> dict[str, Any]:
        return self.raw["speculative"]

    @property
    def multi_node(self) -> dict[str, Any]:
        return self.raw["multi_node"]

    @property
    def entry_points(self) -> dict[str, Any]:
        return self.raw["entry_points"]

    def env_names(self) -> list[str]:
        """The environment variables the release reads (its Envs registry and the direct reads recorded)."""
        return list(self.raw["env"])

    def metric_names(self) -> list[str]:
        """The `sglang:` metrics its /metrics can show (with --enable-metrics), as created."""
        return sorted(self.raw["metrics"])

    def prog(self, entry: str = "launch_server") -> str:
        """What argparse names itself in an error: the parser's prog, else its default for the entry point
        (launch_server.py under `python3 -m sglang.launch_server`, sglang under the `sglang` script)."""
        named = self.raw["parser"].get("prog")
        return named or ("sglang" if entry == "serve" else "launch_server.py")

    # -- spelling ---------------------------------------------------------------------------------------------------
    def option_strings(self) -> dict[str, str]:
        """Every option string the parser knows -> its flag (the first option string), in the parser's order;
        BooleanOptionalAction adds --no-<name> for each long one."""
        out: dict[str, str] = {}
        for flag, spec in self.flags.items():
            names = [flag, *spec.get("aliases", [])]
            for name in names:
                out[name] = flag
                if spec["kind"] == "bool" and name.startswith("--"):
                    out["--no-" + name[2:]] = flag
        return out

    def abbreviated(self, name: str) -> list[str]:
        """The long option strings `name` is a prefix of, in the parser's order (argparse's allow_abbrev)."""
        if not name.startswith("--") or not self.raw["parser"].get("allow_abbrev", True):
            return []
        return [option for option in self.option_strings() if option.startswith(name)]

    def canonical(self, spelled: str) -> str | None:
        """The flag `spelled` names: itself, an alias (`--tp-size`), or a unique prefix (`--tp`); None if the parser
        would not know it (`--tp_size`: no `_`-to-`-` rewriting) or it is ambiguous."""
        name = spelled.split("=", 1)[0]
        options = self.option_strings()
        if name in options:
            return options[name]
        matches = self.abbreviated(name)
        return options[matches[0]] if len(matches) == 1 else None

    def field_of(self, flag: str) -> str | None:
        return self.flags.get(flag, {}).get("field")

    def flag_of_field(self, field: str) -> str | None:
        return next((flag for flag, spec in self.flags.items() if spec.get("field") == field), None)

    # -- argv -------------------------------------------------------------------------------------------------------
    def check_flags(self, argv: list[str], owned: Mapping[str, str] | None = None,
                    entry: str = "launch_server") -> list[Problem]:
        """What the release's argparse would say of these extra server flags, each at its index in argv, worded as
        argparse words it (the process stops at the first; all are listed here). `owned`: flag -> the inventory
        field sparkctl sets it from."""
        prog, owned = self.prog(entry), owned or {}
        out: list[Problem] = []
        i = 0
        while i < len(argv):
            token, where = argv[i], ("args", i)
            i += 1
            if not _is_option(token):
                out.append(self._unrecognized(where, [token], prog))
                continue
            name, eq, inline = token.partition("=")
            options = self.option_strings()
            if name not in options:
                several = self.abbreviated(name)
                if len(several) > 1:
                    out.append(Problem(where, f"{prog}: error: ambiguous option: {token} could match "
                                       + ", ".join(several), "write the whole flag"))
                    i = self._skip_values(argv, i, eq)
                    continue
                if not several:
                    values = argv[i:self._skip_values(argv, i, eq)]
                    out.append(self._unrecognized(where, [token, *values], prog, unknown=name))
                    i += len(values)
                    continue
                name = several[0]
            flag = options[name]
            spec = self.flags[flag]
            out.extend(self._config_problem(where, token, flag, name, eq))
            field = next((owned[n] for n in (flag, *spec.get("aliases", [])) if n in owned), None)
            if field is not None:  # owned by any of its names: 0.5.18 made --tp-size the flag, the long one its alias
                out.append(Problem(where, f"{flag} is sparkctl's to set", f"use {field}"))
            i, problems = self._consume(where, argv, i, flag, spec, inline if eq else None, prog)
            out.extend(problems)
        return out

    def _skip_values(self, argv: list[str], i: int, eq: str) -> int:
        while not eq and i < len(argv) and not _is_option(argv[i]):
            i += 1
        return i

    def _unrecognized(self, where: tuple[str | int, ...], tokens: list[str], prog: str,
                      unknown: str | None = None) -> Problem:
        message = f"{prog}: error: unrecognized arguments: " + " ".join(tokens)
        if unknown is None:
            return Problem(where, message, "each value follows its --flag; an on/off flag takes none")
        dashed = "--" + unknown[2:].replace("_", "-") if unknown.startswith("--") else unknown
        had = self.removed_since(unknown)
        if had is not None:
            return Problem(where, message, f"{unknown} is gone from SGLang {self.version} (SGLang {had} had it)")
        if dashed != unknown and self.canonical(dashed):
            return Problem(where, message, f"did you mean {dashed}? (SGLang {self.version}'s argparse matches "
                                           "option strings as written: no _ for -)")
        close = difflib.get_close_matches(unknown, list(self.option_strings()), n=1, cutoff=0.75)
        return Problem(where, message, f"did you mean {close[0]}?" if close else
                       "`python3 -m sglang.launch_server --help` lists them")

    def _config_problem(self, where: tuple[str | int, ...], token: str, flag: str, name: str,
                        eq: str) -> list[Problem]:
        config = self.raw["parser"].get("config")
        if not config or flag != config["spelling"] or (name == flag and not eq):
            return []
        return [Problem(where, f"{token}: SGLang {self.version} reads a config file only from `{flag} FILE` as two "
                               f"tokens; written so, argparse takes it as a plain option and the file is never read",
                        f"write {flag} FILE")]

    def _consume(self, where: tuple[str | int, ...], argv: list[str], i: int, flag: str, spec: dict[str, Any],
                 explicit: str | None, prog: str) -> tuple[int, list[Problem]]:
        """The values argparse gives the flag (nargs), and what it says of them."""
        argument = "/".join([flag, *spec.get("aliases", [])])
        kind, nargs = spec["kind"], spec.get("nargs")
        if kind in ("flag", "bool", "refused"):
            if explicit is not None:
                return i, [Problem(where, f"{prog}: error: argument {argument}: ignored explicit argument "
                                          f"{explicit!r}", f"{flag} is on/off: write {flag} alone")]
            if i < len(argv) and not _is_option(argv[i]):
                return i + 1, [Problem(where, f"{prog}: error: unrecognized arguments: {argv[i]}",
                                       f"{flag} is on/off and takes no value: write {flag} alone")]
            if kind == "refused":
                error = spec.get("error", "ValueError")
                said = f"{prog}: error: {spec.get('message', '')}" if error == "parser.error" else \
                    f"{error}: {spec.get('message', '')}"
                return i, [Problem(where, said, f"SGLang {self.version} refuses {flag}")]
            return i, []
        if explicit is not None:
            values = [explicit]
        else:
            values = []
            while i < len(argv) and not _is_option(argv[i]) and (nargs in ("*", "+") or len(values) < (
                    nargs if isinstance(nargs, int) else 1)):
                values.append(argv[i])
                i += 1
        if not values and nargs not in ("?", "*"):
            said = "expected at least one argument" if nargs == "+" else "expected one argument" \
                if not isinstance(nargs, int) or nargs == 1 else f"expected {nargs} arguments"
            return i, [Problem(where, f"{prog}: error: argument {argument}: {said}", f"{flag} needs a value")]
        for value in values:
            problem = self._value_problem(where, flag, argument, spec, value, prog)
            if problem:
                return i, [problem]
        return i, []

    def _value_problem(self, where: tuple[str | int, ...], flag: str, argument: str, spec: dict[str, Any],
                       value: str, prog: str) -> Problem | None:
        kind = spec.get("item", "str") if spec["kind"] == "list" else spec["kind"]
        type_name = spec.get("type", kind)
        if not _converts(kind, spec, value):
            if spec.get("type_error"):
                return Problem(where, f"{prog}: error: argument {argument}: "
                               + spec["type_error"].replace("{value}", value))
            return Problem(where, f"{prog}: error: argument {argument}: invalid {type_name} value: {value!r}")
        choices = spec.get("choices")
        if choices and value not in [str(c) for c in choices]:
            close = difflib.get_close_matches(value, [str(c) for c in choices], n=1)
            return Problem(where, f"{prog}: error: argument {argument}: invalid choice: {value!r} (choose from "
                           + ", ".join(repr(c) for c in choices) + ")",
                           f"did you mean {close[0]!r}?" if close else "")
        return None

    # -- at start ---------------------------------------------------------------------------------------------------
    def values_of(self, flags: Mapping[str, Any]) -> dict[str, Any]:
        """ServerArgs fields as the flags set them (the rest at their argparse defaults). Keys: a flag as spelled
        (abbreviations, aliases), or a field name; values as written on the command line or as Python values."""
        values = {spec["field"]: spec["default"] for spec in self.flags.values()
                  if "field" in spec and "default" in spec}
        for key, raw in flags.items():
            flag = self.canonical(key if key.startswith("-") else "--" + key.replace("_", "-"))
            field = self.field_of(flag) if flag else key if key in values else None
            if field is None:
                continue
            kind = self.flags[flag]["kind"] if flag else "str"
            values[field] = _as_kind(kind, raw)
        return values

    def speculative_problems(self, flags: Mapping[str, Any]) -> list[Problem]:
        """What the release says at start of these speculative settings: an algorithm it does not know, or the
        first of its recorded checks (ServerArgs._handle_speculative_decoding) that stops it."""
        spec = self.speculative
        values = self.values_of(flags)
        algorithm = values.get("speculative_algorithm")
        if algorithm is None:
            return []
        name = str(algorithm) if spec.get("case_sensitive", True) else str(algorithm).upper()
        if name not in spec["algorithms"] and name not in spec.get("aliases", {}):
            return [self._unknown_algorithm(str(algorithm))]
        values["speculative_algorithm"] = spec.get("aliases", {}).get(name, name)
        return self._stops(("speculative",), values, spec["checks"], spec.get("assignments", []))

    def _unknown_algorithm(self, algorithm: str) -> Problem:
        spec = self.speculative
        close = difflib.get_close_matches(algorithm.upper(), spec["algorithms"], n=1)
        hint = f"did you mean {close[0]}?" if close else "algorithms: " + ", ".join(spec["algorithms"])
        if spec["names"] == "choices":
            return Problem(("speculative",), f"{self.prog()}: error: argument --speculative-algorithm: invalid "
                           f"choice: {algorithm!r} (choose from " + ", ".join(map(repr, spec["algorithms"])) + ")",
                           hint)
        message = spec.get("unknown_message", "").replace("{name}", algorithm)
        return Problem(("speculative",), f"{spec.get('unknown_error', 'ValueError')}: {message}",
                       hint + " (or a name a plugin registers)")

    def multi_node_problems(self, flags: Mapping[str, Any]) -> list[Problem]:
        """The first recorded multi-node check (ServerArgs methods naming nnodes, node_rank, dist_init_addr) these
        flags fail."""
        values = self.values_of(flags)
        return self._stops(("multi-node",), values, self.multi_node["checks"], self.multi_node.get("assignments", []))

    def _stops(self, where: tuple[str | int, ...], values: dict[str, Any], checks: list[dict[str, Any]],
               assignments: list[dict[str, Any]]) -> list[Problem]:
        evaluation = _Evaluation(values, assignments)
        for check in checks:
            try:
                failed = self._fails(evaluation, check)
            except _Stops as stop:
                set_it = self.flag_of_field(stop.field) if stop.field else None
                hint = f"{check['at']}: {check.get('source', '')}".rstrip(": ")
                return [Problem(where, f"SGLang {self.version} stops at start: TypeError: {stop.message}",
                                f"{stop.field} is None: set {set_it} ({hint})" if set_it else hint)]
            if failed:
                said = f": {check['message']}" if check["message"] else f" ({check.get('source', '')})"
                return [Problem(where, f"SGLang {self.version} stops at start: {check['error']}{said}", check["at"])]
        return []

    @staticmethod
    def _fails(evaluation: _Evaluation, check: dict[str, Any]) -> bool:
        for test in check["when"]:
            value = evaluation.value(test)
            if value is UNKNOWN or not value:
                return False
        if check["kind"] == "raise":
            return True
        value = evaluation.value(check["test"])
        return check["kind"] == "assert" and value is not UNKNOWN and not value

    def removed_since(self, flag: str) -> SglangVersion | None:
        """The latest known earlier release that still had `flag` (the flag is gone from this one)."""
        older = [v for v in known_releases() if v < self.version and flag in _releases()[str(v)]["server_flags"]]
        return older[-1] if older else None


def _is_option(token: str) -> bool:
    """argparse's test: starts with '-', is longer than '-', is not a negative number (SGLang has no option that
    looks like one) and has no space."""
    return token.startswith("-") and len(token) > 1 and not _NEGATIVE_NUMBER.match(token) and " " not in token


def _converts(kind: str, spec: dict[str, Any], value: str) -> bool:
    """Whether the type= callable accepts the text: int(), float(), json.loads, human_readable_int's pattern."""
    try:
        if kind == "int":
            pattern = spec.get("pattern")
            if not (pattern and re.fullmatch(pattern, value.strip())):
                int(value)
        elif kind == "float":
            float(value)
        elif kind == "json":
            json.loads(value)
    except ValueError:
        return False
    return True


def _as_kind(kind: str, raw: Any) -> Any:
    """A flag's value as ServerArgs holds it: on/off flags True, numbers converted (text that does not convert is
    left as written: check_flags reports it)."""
    if kind in ("flag", "bool"):
        return raw if isinstance(raw, bool) else True
    if isinstance(raw, str) and kind in ("int", "float"):
        try:
            return int(raw) if kind == "int" else float(raw)
        except ValueError:
            return raw
    return raw


def schema_for(version: SglangVersion) -> SglangSchema:
    """The release's own data, else the nearest earlier known release's (else the earliest known)."""
    known = known_releases()
    chosen = max((v for v in known if v <= version), default=known[0])
    return SglangSchema(chosen, _releases()[str(chosen)])


def judged_note(version: SglangVersion, schema: SglangSchema) -> str:
    """Said beside a problem when the release is judged by another one's data."""
    if schema.version == version:
        return ""
    return f"SGLang {version} is not in sparkctl's data: judged as {schema.version}"
