#!/usr/bin/env python3
"""Write sparkctl/knowledge/vllm_releases.json from vLLM's own source, release by release.

    scripts/vllm_knowledge.py --release 0.20.1=/tmp/vllm-src/0.20.1 [--release VERSION=PATH[@REF] ...] \
        [--sdist-sha256 0.20.1=HEX ...] [--image nvcr.io/nvidia/vllm:26.05-py3=0.20.1 ...] \
        [--out sparkctl/knowledge/vllm_releases.json]

PATH is an unpacked PyPI sdist of the release (the tagged tree plus PKG-INFO and vllm/_version.py); PATH@REF is a git
checkout read with `git show REF:file`. vLLM is never imported: the files are parsed with `ast`.

- serve_flags: ServeSubcommand.subparser_init (vllm/entrypoints/cli/serve.py) is run symbolically through
  make_arg_parser, FrontendArgs.add_cli_args (vllm/entrypoints/openai/cli_args.py) and AsyncEngineArgs/EngineArgs
  .add_cli_args (vllm/engine/arg_utils.py): their add_argument calls, the get_kwargs(SomeConfig) tables and the edits
  made to them. A config field's kind follows the if/elif order of that release's _compute_kwargs, type aliases
  followed through imports inside vllm/.
- parser, errors: FlexibleArgumentParser's spelling rules and overrides (argparse's wording where it overrides none).
- speculative_config: SpeculativeConfig's init fields, method Literal, and whether unknown keys are refused (how
  EngineArgs.create_speculative_config builds it and what the class decorators do with extra keys).
- multi_node: ParallelConfig.__post_init__ (executor when the world size exceeds one node's GPUs, nnodes checks).
- env: the keys of environment_variables in vllm/envs.py; metrics: the `vllm:` metrics of METRICS_FILES.

Each release records the sha256 of every file read. Releases and images already in --out and not named are kept.
"""

from __future__ import annotations

import argparse
import ast
import copy
import hashlib
import json
import re
import shlex
import subprocess
import sys
from pathlib import Path
from typing import NamedTuple

SERVE = ("vllm.entrypoints.cli.serve", "ServeSubcommand", "subparser_init")
ARG_UTILS = "vllm.engine.arg_utils"
METRICS_FILES = ("vllm/v1/metrics/loggers.py", "vllm/v1/spec_decode/metrics.py", "vllm/v1/metrics/perf.py")
#: the calls followed from subparser_init: those that add arguments or edit kwargs tables (not plugin loading)
FOLLOW = {"make_arg_parser", "add_cli_args", "_customize_cli_kwargs"}
MULTI_NODE_FLAGS = ("--nnodes", "--node-rank", "--master-addr", "--master-port")
IMAGES_SOURCE = "https://docs.nvidia.com/deeplearning/frameworks/vllm-release-notes/index.html"
EXPOSITION = ("prometheus_client exposes a Counter named X as X_total (plus X_created), a Histogram as X_bucket, "
              "X_sum and X_count, a Gauge as X; metrics_conditional lists the ones created only under an `if`")
TYPES = {"int": "int", "float": "float", "json.loads": "json", "parse_type(json.loads)": "json",
         "human_readable_int": "int", "human_readable_int_or_auto": "int"}  # explicit type= -> kind; else str
DEPRECATED = re.compile(r"\[DEPRECATED\]|DEPRECATED:|\bis deprecated\b|\bwill be removed\b|\bhas been removed\b", re.I)
ERROR_HOOKS = {"error", "exit", "_check_value", "_get_value", "_get_values", "_parse_optional", "_get_option_tuples"}
#: CPython Lib/argparse.py wording, which stands when FlexibleArgumentParser overrides none of ERROR_HOOKS
ARGPARSE = {"unknown": "vllm: error: unrecognized arguments: %s",
            "choice": "vllm serve: error: argument %s: invalid choice: %r (choose from %s)",
            "ambiguous": "vllm serve: error: ambiguous option: %s could match %s",
            "invalid_type": "vllm serve: error: argument %s: invalid %s value: %r",
            "notes": "After the usage line, exit status 2. The serve subparser leaves unknown arguments to the "
                     "top-level parser (prog 'vllm') and reports bad values itself (prog 'vllm serve'); 'argument %s'"
                     " is '/'.join(option strings), e.g. --quantization/-q. Choices are joined with ', ' as repr() "
                     "before CPython gh-117766 and as str() after it (which Python patch release is not read here); "
                     "Python 3.14 adds ', maybe you meant ...?' only when suggest_on_error is set."}


class Ref(NamedTuple):
    """A definition found in the source: a class, function or alias node of a module, or the module (node None)."""

    mod: Module
    node: ast.AST | None


class Source:
    """Files of one release: an unpacked sdist (PATH) or a ref of a git checkout (PATH@REF)."""

    def __init__(self, spec: str):
        path, _, ref = spec.rpartition("@") if "@" in spec else (spec, "", "")
        self.root, self.ref = Path(path).expanduser(), ref
        self.files: dict[str, str] = {}
        self.modules: dict[str, Module | None] = {}

    def text(self, path: str) -> str | None:
        if self.ref:
            run = subprocess.run(["git", "-C", str(self.root), "show", f"{self.ref}:{path}"], capture_output=True)
            data = None if run.returncode else run.stdout
        else:
            data = (self.root / path).read_bytes() if (self.root / path).is_file() else None
        if data is None:
            return None
        self.files[path] = hashlib.sha256(data).hexdigest()
        return data.decode()

    def module(self, dotted: str) -> Module | None:
        if dotted not in self.modules:
            self.modules[dotted] = None
            base = dotted.replace(".", "/")
            for path in (f"{base}.py", f"{base}/__init__.py") if dotted.split(".")[0] == "vllm" else ():
                if (text := self.text(path)) is not None:
                    self.modules[dotted] = Module(self, path, ast.parse(text))
                    break
        return self.modules[dotted]

    def commit(self) -> str:
        """The full commit of a git ref ("" for an sdist, which names only its short id)."""
        if not self.ref:
            return ""
        return subprocess.run(["git", "-C", str(self.root), "rev-parse", f"{self.ref}^{{commit}}"],
                              check=True, capture_output=True, text=True).stdout.strip()

    def commit_id(self) -> str:
        """setuptools-scm's id of the commit (`g` and the short hash), as an sdist's vllm/_version.py writes it."""
        if self.ref:
            return "g" + self.commit()[:9]
        version = ast.parse(self.text("vllm/_version.py") or "")
        return next((_const(n.value) for n in ast.walk(version) if isinstance(n, ast.Assign)
                     and "__commit_id__" in map(ast.unparse, n.targets)), "")

    def tags(self) -> list[str]:
        """The tags of a git ref's commit."""
        run = subprocess.run(["git", "-C", str(self.root), "tag", "--points-at", self.ref], capture_output=True,
                             text=True)
        return run.stdout.split() if run.returncode == 0 else []


class Module:
    """Top-level names of one file as a type checker sees them (`if TYPE_CHECKING:` bodies, not their else)."""

    def __init__(self, source: Source, path: str, tree: ast.Module):
        self.source, self.path, self.tree = source, path, tree
        self.names: dict[str, ast.AST] = {}
        self.imports: dict[str, tuple[str, str | None]] = {}  # local name -> (module, attribute or None)
        package = path.split("/")[:-1]
        for node in _top(tree.body):
            if isinstance(node, (ast.ClassDef, ast.FunctionDef)):
                self.names[node.name] = node
            elif isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None:
                for target in node.targets if isinstance(node, ast.Assign) else [node.target]:
                    self.names[ast.unparse(target)] = node.value
            elif isinstance(node, ast.Import):  # `import a.b as c` binds a.b to c, `import a.b` binds a
                for alias in node.names:
                    bound = alias.name if alias.asname else alias.name.split(".")[0]
                    self.imports[alias.asname or bound] = (bound, None)
            elif isinstance(node, ast.ImportFrom):
                base = node.module if not node.level else ".".join(
                    [*package[:len(package) - node.level + 1], *([node.module] if node.module else [])])
                self.imports.update({alias.asname or alias.name: (base, alias.name) for alias in node.names})

    def resolve(self, name: str, depth: int = 0) -> Ref | None:
        if name in self.names:
            return Ref(self, self.names[name])
        if name not in self.imports or depth > 10:
            return None
        module, attr = self.imports[name]
        other = self.source.module(module)
        if attr is None or other is None:
            return Ref(other, None) if other else None
        sub = other.resolve(attr, depth + 1) or self.source.module(f"{module}.{attr}")
        return Ref(sub, None) if isinstance(sub, Module) else sub

    def lookup(self, dotted: str) -> Ref | None:
        """`Name` or `module.Name`, followed through imports."""
        first, *rest = dotted.split(".")
        found = self.resolve(first)
        for part in rest:
            found = found.mod.resolve(part) if found and found.node is None else None
        return found


def _top(body: list[ast.stmt]):
    for node in body:
        if isinstance(node, (ast.If, ast.Try)):
            yield from _top(node.body)
            if isinstance(node, ast.If) and ast.unparse(node.test) != "TYPE_CHECKING":
                yield from _top(node.orelse)
        else:
            yield node


def _last(node: ast.AST) -> str:
    """The called or named thing's own name: `a.b(x).c(y)` -> c, `@config(...)` -> config."""
    while isinstance(node, ast.Call):
        node = node.func
    return node.attr if isinstance(node, ast.Attribute) else node.id if isinstance(node, ast.Name) else ""


def _const(node: ast.AST | None):
    try:
        return ast.literal_eval(node) if node is not None else None
    except ValueError:
        return None


def _message(node: ast.AST | None) -> str:
    """A message as written: string pieces verbatim, f-string fields as {expr}; `Error(msg)` gives msg."""
    if isinstance(node, ast.Call):
        return _message(node.args[0]) if node.args else ""
    if isinstance(node, ast.JoinedStr):
        return "".join(_message(v) if isinstance(v, ast.Constant) else "{" + ast.unparse(v.value) + "}"
                       for v in node.values)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        return _message(node.left) + _message(node.right)
    return str(node.value) if isinstance(node, ast.Constant) else "{" + ast.unparse(node) + "}" if node else ""


def _at(mod: Module, node: ast.AST, what: str) -> str:
    return f"{mod.path}:{node.lineno} {what}"


def hints(mod: Module, ann: ast.AST, depth: int = 0) -> list[tuple[str, object]]:
    """vLLM's get_type_hints, statically: the members of a union as (kind, detail). Kinds: none, bool, int, float,
    str, dict, list, tuple, set (detail: their arguments), literal (its values), dataclass (its Ref), builtin, other
    (a class vLLM's is_not_builtin() accepts as a string)."""
    if isinstance(ann, ast.Constant):
        if isinstance(ann.value, str):
            return hints(mod, ast.parse(ann.value, mode="eval").body, depth)
        return [("none" if ann.value is None else "other", None)]
    if isinstance(ann, ast.BinOp):
        return hints(mod, ann.left, depth) + hints(mod, ann.right, depth)
    if isinstance(ann, ast.Subscript):
        head, args = _last(ann.value), list(ann.slice.elts) if isinstance(ann.slice, ast.Tuple) else [ann.slice]
        if head in ("Optional", "Union"):
            return [h for arg in args for h in hints(mod, arg, depth)] + [("none", None)] * (head == "Optional")
        if head in ("Annotated", "SkipValidation"):
            return hints(mod, args[0], depth)
        if head == "Literal":  # nested Literal aliases flatten, as typing does
            return [("literal", [v for a in args for v in ([a.value] if isinstance(a, ast.Constant) else
                                 [x for k, d in hints(mod, a) if k == "literal" for x in d])])]
        if head.lower() in ("list", "tuple", "set", "dict"):
            return [(head.lower(), args)]
        return [("builtin" if head == "type" else "other", None)]  # type[X] counts as builtin for vLLM
    if ast.unparse(ann) in ("bool", "int", "float", "str", "dict", "list", "tuple", "set"):
        return [(ast.unparse(ann), [])]
    found = mod.lookup(ast.unparse(ann)) if depth < 12 else None
    if found and isinstance(found.node, ast.ClassDef) and is_dataclass(found):
        return [("dataclass", found)]
    if found and isinstance(found.node, ast.expr):  # a type alias
        return hints(found.mod, found.node, depth + 1)
    return [("other", None)]


def is_dataclass(ref: Ref) -> bool:
    """Decorated @dataclass, or @config where that release's config() makes one, or inheriting from such a class."""
    for deco in ref.node.decorator_list:
        config = ref.mod.lookup("config") if _last(deco) == "config" else None
        if _last(deco) == "dataclass" or config and any(
                isinstance(n, ast.Call) and _last(n.func) == "dataclass" for n in ast.walk(config.node)):
            return True
    return any(b and isinstance(b.node, ast.ClassDef) and is_dataclass(b)
               for b in (ref.mod.lookup(ast.unparse(base)) for base in ref.node.bases))


def dataclass_fields(ref: Ref) -> dict[str, tuple[Module, ast.AnnAssign, str, bool]]:
    """name -> (module, statement, docstring, init) of every field, bases first, as dataclasses.fields() has them."""
    out: dict[str, tuple[Module, ast.AnnAssign, str, bool]] = {}
    for base in ref.node.bases:
        found = ref.mod.lookup(ast.unparse(base))
        out.update(dataclass_fields(found) if found and isinstance(found.node, ast.ClassDef) else {})
    body = ref.node.body
    for st, nxt in zip(body, [*body[1:], None], strict=True):
        if isinstance(st, ast.AnnAssign) and isinstance(st.target, ast.Name) \
                and not re.search(r"\b(ClassVar|InitVar)\b", ast.unparse(st.annotation)):
            doc = _const(nxt.value) if isinstance(nxt, ast.Expr) else ""
            init = not (isinstance(st.value, ast.Call) and any(k.arg == "init" and _const(k.value) is False
                                                                for k in st.value.keywords))
            out[st.target.id] = (ref.mod, st, doc if isinstance(doc, str) else "", init)
    return out


class Rules:
    """How a release's _compute_kwargs maps a field's type to argparse kwargs: the order of its if/elif tests, read
    from the source, and the int fields it reads human-readably ('32k')."""

    def __init__(self, arg_utils: Module):
        compute = arg_utils.names["_compute_kwargs"]
        node = next(n for n in ast.walk(compute) if isinstance(n, ast.If) and "dataclass_cls" in ast.unparse(n.test))
        self.chain: list[str] = []
        self.human: set[str] = set()
        while isinstance(node, ast.If):
            tested = [ast.unparse(c.args[1]) for c in ast.walk(node.test)
                      if isinstance(c, ast.Call) and _last(c.func) == "contains_type"]
            self.chain.append("dict_or_str" if tested[:2] == ["dict", "str"] else (tested or ["dataclass"])[0])
            if tested == ["int"]:
                self.human |= {c.value for c in ast.walk(ast.Module(node.body, [])) if isinstance(c, ast.Constant)
                               and isinstance(c.value, str) and re.fullmatch(r"[a-z_]+", c.value)}
            node = node.orelse[0] if node.orelse else None

    def kwargs(self, mod: Module, ann: ast.AST, name: str) -> dict:
        found = hints(mod, ann)
        kinds, detail = {k for k, _ in found}, {k: d for k, d in reversed(found)}
        custom = bool(kinds & {"other", "dataclass", "literal"})  # vLLM's is_not_builtin
        kw: dict = {}
        for test in self.chain:
            if test == "dataclass" and "dataclass" in kinds:
                kw.update(type="json", schema=detail["dataclass"].node.name)
            elif test == "bool" and "bool" in kinds:
                kw["action"] = "bool"
            elif test == "Literal" and "literal" in kinds:  # with str in the union they are only a metavar
                kw["suggestions" if "str" in kinds else "choices"] = sorted(detail["literal"])
            elif test in ("tuple", "list", "set") and test in kinds:
                args = detail[test]
                fixed = test == "tuple" and "..." not in map(ast.unparse, args)
                item = hints(mod, args[0]) if args else [("str", None)]
                kw.update(nargs=len(args) if fixed else "+", type=item[0][0] if len(item) == 1
                          and item[0][0] in ("int", "float") else "str")
                if len(item) == 1 and item[0][0] == "literal":
                    kw["choices"] = sorted(item[0][1])
            elif test in ("int", "float") and test in kinds:
                kw.update(type=test, human_readable=name in self.human)
            elif test == "dict_or_str" and "dict" in kinds and ("str" in kinds or custom):
                kw["type"] = "json_or_str"
            elif test == "dict" and "dict" in kinds:
                kw["type"] = "json"
            elif test == "str" and ("str" in kinds or custom):
                kw["type"] = "str"
            else:
                continue
            break
        else:
            kw["type"] = "unsupported"
        if "none" in kinds and "bool" not in kinds:
            kw["optional"] = True
            kw.get("choices", []).append("None")
        return kw


def entry(kw: dict) -> dict:
    """The JSON description of one argparse argument from its normalised kwargs."""
    action, nargs = kw.get("action"), kw.get("nargs")
    if action in ("store_true", "bool", "append"):
        kind = "flag" if action == "store_true" else action
    elif nargs in ("+", "*") or isinstance(nargs, int):
        kind = "list"
    else:
        kind = "choice" if "choices" in kw or "choices_from" in kw else kw.get("type", "str")
    out = {"kind": kind, **{k: kw[k] for k in ("choices", "choices_from", "more_choices", "suggestions", "schema",
                                               "optional", "human_readable", "deprecated", "field", "config")
                            if kw.get(k) not in (None, False)}}
    out.update({"item": kw.get("type", "str")} if kind == "list" else {})
    out.update({"nargs": nargs} if nargs not in (None, "+") and kind != "flag" else {})
    out.update({"action": action} if action not in (None, "store_true", "bool", "append") else {})
    return out


class _Return(Exception):
    pass


class Flags:
    """Runs the argument-adding functions of a release symbolically and collects what they add."""

    def __init__(self, source: Source, rules: Rules):
        self.rules, self.flags, self.tables = rules, {}, {}
        module, cls, method = SERVE
        owner = source.module(module).lookup(cls)
        self.run(owner, self.method(owner, method, False)[1], [None, None])

    def run(self, owner: Ref, fn: ast.FunctionDef, args: list) -> object:
        env = {"__class__": owner, **dict(zip([a.arg for a in fn.args.args], args, strict=False))}
        try:
            self.block(owner.mod, fn.body, env)
        except _Return as done:
            return done.args[0]
        return None

    def block(self, mod: Module, body: list[ast.stmt], env: dict) -> None:
        for st in body:
            if isinstance(st, ast.Return):
                raise _Return(self.value(mod, st.value, env))
            if isinstance(st, ast.Assign) and isinstance(st.targets[0], ast.Name):
                env[st.targets[0].id] = self.value(mod, st.value, env)
            elif isinstance(st, (ast.Assign, ast.AugAssign, ast.Delete)):
                self.edit(mod, st, env)
            elif isinstance(st, ast.Expr):
                self.value(mod, st.value, env)
            elif isinstance(st, ast.For):
                self.loop(mod, st, env)
            elif isinstance(st, (ast.If, ast.With, ast.Try)):  # both branches: every flag the parser may get
                self.block(mod, st.body + getattr(st, "orelse", []), env)

    def edit(self, mod: Module, st: ast.Assign | ast.AugAssign | ast.Delete, env: dict) -> None:
        """`kwargs["f"]["type"] = ...`, `del kwargs["f"]["nargs"]`, `kwargs["f"]["choices"] += [...]`."""
        for target in getattr(st, "targets", [getattr(st, "target", None)]):
            obj = self.value(mod, target.value, env) if isinstance(target, ast.Subscript) else None
            key = self.value(mod, target.slice, env) if isinstance(obj, dict) else None
            if isinstance(obj, dict) and isinstance(st, ast.Assign):
                self.put(mod, obj, key, st.value, env)
            elif isinstance(obj, dict) and isinstance(st, ast.Delete):
                obj.pop(key, None)
            elif isinstance(obj, dict) and key == "choices":  # more than the Literal offers
                obj["more_choices"] = ast.unparse(st.value)

    def loop(self, mod: Module, st: ast.For, env: dict) -> None:
        """`for k, v in table.items()`, or over a literal list of tuples (non-constant members bound as nodes, so
        that `type=type` reads the `str` written in the list)."""
        if isinstance(st.iter, ast.Call) and _last(st.iter.func) == "items":
            items = self.value(mod, st.iter.func.value, env)
            rows = list(items.items()) if isinstance(items, dict) else []
        else:
            rows = [[e.value if isinstance(e, ast.Constant) else e for e in getattr(row, "elts", [row])]
                    for row in getattr(st.iter, "elts", [])]
        names = [t.id for t in getattr(st.target, "elts", [st.target])]
        for row in rows:
            env.update(zip(names, row, strict=False))
            self.block(mod, st.body, env)

    def value(self, mod: Module, node: ast.AST | None, env: dict) -> object:
        if isinstance(node, ast.Constant):
            return node.value
        if isinstance(node, ast.Name):
            return env[node.id] if node.id in env else mod.lookup(node.id)
        if isinstance(node, ast.JoinedStr):
            return "".join(str(self.value(mod, v.value if isinstance(v, ast.FormattedValue) else v, env))
                           for v in node.values)
        if isinstance(node, (ast.List, ast.Tuple)):
            return [self.value(mod, e, env) for e in node.elts]
        if isinstance(node, ast.Subscript):
            obj = self.value(mod, node.value, env)
            return obj.get(self.value(mod, node.slice, env)) if isinstance(obj, dict) else None
        if isinstance(node, ast.Dict):  # {**kwargs["x"], "default": None}
            out: dict = {}
            for key, val in zip(node.keys, node.values, strict=True):
                if key is None:
                    out.update(copy.deepcopy(self.value(mod, val, env)) or {})
                else:
                    self.put(mod, out, self.value(mod, key, env), val, env)
            return out
        return self.call(mod, node, env) if isinstance(node, ast.Call) else None

    def call(self, mod: Module, call: ast.Call, env: dict) -> object:
        name, func = _last(call.func), call.func
        if name == "add_argument":
            return self.add(mod, call, env)
        if name not in {*FOLLOW, "get_kwargs", "replace", "pop"}:
            return None
        args = [self.value(mod, a, env) for a in call.args]
        if name == "get_kwargs":
            return self.table(args[0])
        if name in ("replace", "pop"):  # key.replace("_", "-"), value.pop("flags", [])
            obj = self.value(mod, func.value, env) if isinstance(func, ast.Attribute) else None
            return getattr(obj, name)(*args) if isinstance(obj, str if name == "replace" else dict) else None
        if isinstance(func, ast.Name):
            found = mod.lookup(func.id)
            return self.run(found, found.node, args) if found else None
        above = isinstance(func.value, ast.Call) and _last(func.value.func) == "super"
        owner = env.get("__class__") if above else self.value(mod, func.value, env)
        is_class = isinstance(owner, Ref) and isinstance(owner.node, ast.ClassDef)
        defining, fn = self.method(owner, func.attr, above) if is_class else (None, None)
        if fn and "classmethod" in map(_last, fn.decorator_list):
            args = [env.get("cls") if above else owner, *args]
        return self.run(defining, fn, args) if fn else None

    def method(self, owner: Ref, name: str, above: bool) -> tuple[Ref | None, ast.FunctionDef | None]:
        """The class defining `name` for owner (or, for super(), for its bases), depth first, and the def."""
        for node in [] if above else owner.node.body:
            if isinstance(node, ast.FunctionDef) and node.name == name:
                return owner, node
        for base in (owner.mod.lookup(ast.unparse(b)) for b in owner.node.bases):
            if base and isinstance(base.node, ast.ClassDef) and (hit := self.method(base, name, False))[1]:
                return hit
        return None, None

    def table(self, ref: object) -> dict | None:
        """get_kwargs(cls): field -> kwargs, a fresh copy each call (vLLM deep-copies too)."""
        if not isinstance(ref, Ref) or not isinstance(ref.node, ast.ClassDef):
            return None
        key = (ref.mod.path, ref.node.name)
        if key not in self.tables:
            self.tables[key] = {name: {**self.rules.kwargs(fmod, st.annotation, name), "field": name,
                                       "config": ref.node.name, "deprecated": bool(DEPRECATED.search(doc))}
                                for name, (fmod, st, doc, _) in dataclass_fields(ref).items()}
        return copy.deepcopy(self.tables[key])

    def put(self, mod: Module, into: dict, key: object, node: ast.AST, env: dict) -> None:
        """Set one argparse keyword in a kwargs dict, normalised to what entry() reads."""
        node = env[node.id] if isinstance(node, ast.Name) and isinstance(env.get(node.id), ast.AST) else node
        text = ast.unparse(node)
        if key == "type":
            inner = text.removeprefix("optional_type(").removesuffix(")") if text.startswith("optional_") else text
            into.update(type=TYPES.get(inner, "str"), optional=into.get("optional") or inner != text,
                        human_readable=into.get("human_readable") or inner.startswith("human_readable_int"))
            into.pop("schema", None)  # e.g. --speculative-config: plain JSON at parse time, the class checks later
        elif key == "action":
            into["action"] = "bool" if text.endswith("BooleanOptionalAction") else _const(node) or text
        elif key == "choices":
            values = self.enum_values(mod, node) if isinstance(node, ast.ListComp) else _const(node)
            into.pop("choices" if values is None else "choices_from", None)
            into.update({"choices": list(values)} if values is not None else {"choices_from": text})
        elif key in ("nargs", "deprecated"):
            into[key] = _const(node)
        elif key == "help":
            into["deprecated"] = into.get("deprecated") or bool(DEPRECATED.search(_message(node)))
        elif key not in ("default", "metavar", "const", "dest"):
            into[key] = self.value(mod, node, env)

    def enum_values(self, mod: Module, node: ast.ListComp) -> list | None:
        """`[f.value for f in SomeEnum]`: the member values of the enum class."""
        found = mod.lookup(ast.unparse(node.generators[0].iter))
        if not (found and isinstance(found.node, ast.ClassDef) and ast.unparse(node.elt).endswith(".value")):
            return None
        return [st.value.value for st in found.node.body
                if isinstance(st, ast.Assign) and isinstance(st.value, ast.Constant)]

    def add(self, mod: Module, call: ast.Call, env: dict) -> None:
        names = [n for arg in call.args for n in (self.value(mod, arg.value, env) or [] if isinstance(
            arg, ast.Starred) else [self.value(mod, arg, env)]) if isinstance(n, str)]
        kw: dict = {}
        for keyword in sorted(call.keywords, key=lambda k: k.arg is not None):  # the **kwargs first
            if keyword.arg is None:
                kw.update(copy.deepcopy(self.value(mod, keyword.value, env)) or {})
            else:
                self.put(mod, kw, keyword.arg, keyword.value, env)
        key = next((n for n in names if n.startswith("--")), names[0])
        self.flags[key] = {**entry(kw), **({"aliases": [n for n in names if n != key]} if len(names) > 1 else {}),
                           **({} if key.startswith("-") else {"positional": True})}


def parser_facts(source: Source, arg_utils: Module) -> tuple[dict, dict]:
    """FlexibleArgumentParser's spelling rules, and the error wording a stand-in must imitate."""
    found = arg_utils.lookup("FlexibleArgumentParser")
    methods = {n.name: n for n in ast.walk(found.node) if isinstance(n, ast.FunctionDef)}
    calls = [(c, [_const(a) for a in c.args]) for c in ast.walk(methods["parse_args"]) if isinstance(c, ast.Call)]
    places = [found.node, *(m.tree for m in map(source.module, ("vllm.entrypoints.cli.main", SERVE[0])) if m)]
    abbrev_off = any(k.arg == "allow_abbrev" and _const(k.value) is False
                     for place in places for k in ast.walk(place) if isinstance(k, ast.keyword))
    refused = [_message(r.exc) for r in ast.walk(methods["parse_args"]) if isinstance(r, ast.Raise)
               and "--model" in _message(r.exc)]
    moved = any(_last(c.func) == "warning" and "--model" in _message(c) for c, _ in calls)
    o_branch = next((n for n in ast.walk(methods["parse_args"]) if isinstance(n, ast.If) and "'-O'" in ast.unparse(
        n.test)), None)
    o_rewrite = next((_message(v) for v in ast.walk(ast.Module(o_branch.body, [])) if isinstance(
        v, (ast.Constant, ast.JoinedStr)) and _message(v).startswith("-")), None) if o_branch else None
    parser = {"underscores": any(_last(c.func) == "replace" and args == ["_", "-"] for c, args in calls),
              "dotted_json": any(_last(c.func) == "split" and args == ["."] for c, args in calls),
              "abbrev": not abbrev_off, "evidence": _at(found.mod, found.node, "FlexibleArgumentParser.parse_args; "
                                                        f"allow_abbrev {'False' if abbrev_off else 'never set'}"),
              "serve_model_option": "refused" if refused else "moved to model_tag, warning" if moved else "accepted",
              "o_shorthand_to": o_rewrite,  # what -O3 / -O 3 / -O=3 turn into before argparse sees them
              **({"serve_model_option_message": refused[0]} if refused else {})}
    overridden = sorted(set(methods) & ERROR_HOOKS)
    errors = {**({} if overridden else ARGPARSE), "overrides": overridden,
              "from": f"{found.mod.path}: FlexibleArgumentParser overrides "
                      + (", ".join(overridden) if overridden else "none of " + ", ".join(sorted(ERROR_HOOKS))
                         + "; argparse's wording stands")}
    parse_type = arg_utils.lookup("parse_type")  # the type= wrapper of Optional fields raises its own message
    for raise_ in (r for r in ast.walk(parse_type.node) if isinstance(r, ast.Raise)) if parse_type else ():
        errors["optional_type"] = "vllm serve: error: argument %s: " + _message(raise_.exc)
    return parser, errors


def speculative(arg_utils: Module, rules: Rules) -> dict:
    found = arg_utils.lookup("SpeculativeConfig")
    fields = dataclass_fields(found)
    methods = [v for k, d in hints(found.mod, fields["method"][1].annotation) if k == "literal" for v in d]
    post = next((n for n in found.node.body if isinstance(n, ast.FunctionDef) and n.name == "__post_init__"),
                found.node)
    compared = {c.value for n in ast.walk(post) if isinstance(n, ast.Compare) and ast.unparse(n.left) == "self.method"
                for c in ast.walk(ast.Tuple(n.comparators)) if isinstance(c, ast.Constant) and isinstance(c.value, str)}
    assigned = {n.value.value for n in ast.walk(post) if isinstance(n, ast.Assign) and isinstance(n.value, ast.Constant)
                and ast.unparse(n.targets[0]) == "self.method"}
    verdict, evidence = unknown_keys(arg_utils, found)
    return {"fields": {name: entry(rules.kwargs(m, st.annotation, name)) for name, (m, st, _, init) in fields.items()
                       if init},
            "methods": methods, "unknown_keys": verdict, "evidence": evidence,
            "post_init_compares_not_in_methods": sorted(compared - set(methods)), "post_init_assigns": sorted(assigned)}


def unknown_keys(arg_utils: Module, found: Ref) -> tuple[str, str]:
    """How --speculative-config's dict reaches the class, and what its decorators do with extra keys: a pydantic
    dataclass ignores extra init keywords unless its ConfigDict says extra="forbid"; a stdlib one raises."""
    build = next((_at(arg_utils, c, f"{fn.name}(): {ast.unparse(c)}") for fn in ast.walk(arg_utils.tree)
                  if isinstance(fn, ast.FunctionDef) for c in ast.walk(fn) if isinstance(c, ast.Call)
                  and _last(c.func) == "SpeculativeConfig" and any(k.arg is None for k in c.keywords)),
                 f"{arg_utils.path}: no SpeculativeConfig(**...) call")
    extra, notes = None, []
    for deco in found.node.decorator_list:
        name = _last(deco)
        target = found.mod.lookup(name) if name == "config" else None
        setting = next((_const(k.value) for n in ast.walk(target.node if target else deco) if isinstance(n, ast.Call)
                        and _last(n.func) == "ConfigDict" for k in n.keywords if k.arg == "extra"), None)
        if target:
            notes.append(_at(target.mod, target.node, "@config: config() " + (
                f"sets ConfigDict(extra={setting!r})" if setting else "sets no extra")))
        elif name == "dataclass":
            origin = found.mod.imports.get(name, ("?", None))[0]
            default = "ignore (pydantic's default)" if origin.startswith("pydantic") else "forbid (stdlib: TypeError)"
            notes.append(f"@{ast.unparse(deco)} from {origin}: extra " + (repr(setting) if setting else default))
            setting = setting or default.split()[0]
        extra = setting or extra
    verdict = {"forbid": "refused", "ignore": "ignored", "allow": "ignored"}.get(extra, "unknown")
    return verdict, f"{build}; {_at(found.mod, found.node, 'class SpeculativeConfig')}: {'; '.join(notes)}"


def multi_node(arg_utils: Module, flags: dict) -> dict:
    found = arg_utils.lookup("ParallelConfig")
    post = next(n for n in found.node.body if isinstance(n, ast.FunctionDef) and n.name == "__post_init__")
    ifs = [(n, ast.unparse(n.test)) for n in ast.walk(post) if isinstance(n, ast.If)]
    default = next(n for n, test in ifs if "distributed_executor_backend is None" in test and "> 1" in test)
    inner = [(n, ast.unparse(n.test)) for n in ast.walk(default) if isinstance(n, ast.If)]
    short = next(n for n, test in inner if "device_count" in test and "<" in test)  # world size > this node's GPUs
    raises = [r for r in ast.walk(short) if isinstance(r, ast.Raise)]  # breadth first: its own raise comes first
    picked = [_const(st.value) for st in short.body if isinstance(st, ast.Assign)
              and ast.unparse(st.targets[0]) == "backend"]
    ray = next((n for n, test in ifs if "nnodes" in test and "distributed_executor_backend" in test
                and any(isinstance(st, ast.Raise) for st in n.body)), None)
    dp = next((n for n in ast.walk(arg_utils.tree) if isinstance(n, ast.Assert) and "nnodes" in ast.unparse(n.test)),
              None)
    backend, has_nnodes = flags["--distributed-executor-backend"], "nnodes" in dataclass_fields(found)
    out = {"nnodes_flags": all(f in flags for f in MULTI_NODE_FLAGS), "nnodes_field": has_nnodes,
           "executor_backends": [c for c in backend.get("suggestions") or backend.get("choices", []) if c != "None"],
           "ray_with_nnodes": "refused" if ray else "allowed" if has_nnodes else None,
           "default_multi_node_executor": "raises" if raises and raises[0] in short.body else (picked or [None])[0],
           "message": _message(raises[0].exc) if raises else None,
           "default_with_nnodes": next((_const(st.value) for n, test in inner if "nnodes" in test for st in n.body
                                        if isinstance(st, ast.Assign)), None),
           "evidence": _at(found.mod, short, "ParallelConfig.__post_init__: if " + ast.unparse(short.test))}
    if ray:
        out["ray_with_nnodes_message"] = _message(next(st.exc for st in ray.body if isinstance(st, ast.Raise)))
        out["ray_with_nnodes_evidence"] = _at(found.mod, ray, "ParallelConfig.__post_init__: if "
                                              + ast.unparse(ray.test))
    if dp:
        out["dp_backend_with_nnodes_message"] = _message(dp.msg)
        out["dp_backend_with_nnodes_evidence"] = _at(arg_utils, dp, "assert " + ast.unparse(dp.test))
    return out


def env_and_metrics(source: Source) -> tuple[list, dict, dict]:
    """The keys of environment_variables; `vllm:` metric -> gauge/counter/histogram, and the `if` guarding some."""
    table = source.module("vllm.envs").names["environment_variables"]
    kinds, guarded = {}, {}
    for path in METRICS_FILES:
        tree = ast.parse(source.text(path) or "")
        parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
        for call in (n for n in ast.walk(tree) if isinstance(n, ast.Call)):
            name = next((_const(k.value) for k in call.keywords if k.arg == "name"), None)
            if isinstance(name, str) and name.startswith("vllm:"):
                func = ast.unparse(call.func).lower()
                kinds[name] = next((k for k in ("gauge", "counter", "histogram", "info") if k in func), func)
                node = parents.get(call)
                while node is not None and not isinstance(node, (ast.If, ast.FunctionDef)):
                    node = parents.get(node)
                guarded.update({name: f"{path}: if {ast.unparse(node.test)}"} if isinstance(node, ast.If) else {})
    return sorted(k.value for k in table.keys if isinstance(k, ast.Constant)), kinds, guarded


def release_entry(version: str, spec: str, sdist_sha256: str | None) -> dict:
    source = Source(spec)
    info = source.text("PKG-INFO") or ""
    if not source.ref and f"\nVersion: {version}\n" not in info:
        raise SystemExit(f"{spec}: PKG-INFO is not vLLM {version}")
    if source.ref and f"v{version}" not in source.tags():
        raise SystemExit(f"{spec}: {source.ref} is not tagged v{version} (name the release's tag)")
    requires = re.search(r"^Requires-Python: (.+)$", info, re.M) or re.search(
        r'^requires-python\s*=\s*"(.+)"', source.text("pyproject.toml") or "", re.M)
    arg_utils = source.module(ARG_UTILS)
    rules = Rules(arg_utils)
    flags = Flags(source, rules).flags
    parser, errors = parser_facts(source, arg_utils)
    env, kinds, guarded = env_and_metrics(source)
    errors["python"] = f"the container's Python is not read here; vLLM {version} requires-python " + (
        requires[1] if requires else "?")
    out = {"serve_flags": flags, "parser": parser, "errors": errors, "multi_node": multi_node(arg_utils, flags),
           "speculative_config": speculative(arg_utils, rules), "env": env, "metrics": kinds,
           "metrics_conditional": guarded, "metrics_exposition": EXPOSITION,
           "requires_python": requires[1] if requires else None}
    out["source"] = {"repo": "vllm-project/vllm", "ref": source.ref or f"v{version}", "commit_id": source.commit_id(),
                     **({"commit": source.commit()} if source.ref else {}),
                     **({} if source.ref else {"sdist": f"vllm-{version}.tar.gz", "sdist_sha256": sdist_sha256}),
                     "files": dict(sorted(source.files.items()))}
    return out


def _pairs(items: list[str], what: str) -> dict[str, str]:
    if bad := [item for item in items if "=" not in item]:
        raise SystemExit(f"expected {what}, got {bad}")
    return dict(item.split("=", 1) for item in items)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--release", action="append", required=True, metavar="VERSION=PATH[@REF]")
    parser.add_argument("--sdist-sha256", action="append", default=[], metavar="VERSION=HEX")
    parser.add_argument("--image", action="append", default=[], metavar="TAG=VERSION")
    parser.add_argument("--out", type=Path,
                        default=Path(__file__).resolve().parents[1] / "sparkctl/knowledge/vllm_releases.json")
    args = parser.parse_args(argv)
    data = json.loads(args.out.read_text()) if args.out.exists() else {}
    images = data.get("images") or {"source": IMAGES_SOURCE, "tags": {}}
    images["tags"].update(_pairs(args.image, "TAG=VERSION"))
    releases, hashes = data.get("releases", {}), _pairs(args.sdist_sha256, "VERSION=HEX")
    for version, spec in _pairs(args.release, "VERSION=PATH[@REF]").items():
        before = releases.get(version, {}).get("source", {})
        got = releases[version] = release_entry(version, spec, hashes.get(version))
        if got["source"].get("sdist_sha256", "") is None and before.get("commit_id") == got["source"]["commit_id"]:
            got["source"]["sdist_sha256"] = before.get("sdist_sha256")  # same tree: keep the hash given before
        print(f"{version}: {len(got['serve_flags'])} serve flags, {len(got['env'])} env vars, {len(got['metrics'])} "
              f"metrics, unknown speculative keys {got['speculative_config']['unknown_keys']}", file=sys.stderr)
    about = ("What `vllm serve` accepts and how each vLLM release behaves (flags, parser, SpeculativeConfig, "
             "multi-node executor choice, env vars, metrics), read statically (ast; vLLM never imported) from the "
             "release source by scripts/vllm_knowledge.py. Last run: "
             + shlex.join(["scripts/vllm_knowledge.py", *argv]))
    order = sorted(releases, key=lambda v: tuple(int(p) if p.isdigit() else 0 for p in re.split(r"[.+-]", v)))
    out = {"about": about, "format": 1, "images": images, "releases": {v: releases[v] for v in order}}
    args.out.write_text(json.dumps(out, indent=1, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
