#!/usr/bin/env python3
"""Write sparkctl/knowledge/sglang_releases.json from SGLang's own source, release by release.

    scripts/sglang_knowledge.py --release 0.5.8=/tmp/sglang-src/0.5.8 [--release VERSION=PATH[@REF] ...] \
        [--dist-sha256 0.5.8=HEX ...] [--image nvcr.io/nvidia/sglang:26.02-py3=0.5.8 ...] \
        [--image-source TAG=TEXT ...] [--out sparkctl/knowledge/sglang_releases.json]

PATH is an unpacked PyPI distribution of the release: an sdist (`sglang/` beside PKG-INFO and pyproject.toml) or a
wheel (`sglang/` beside sglang-VERSION.dist-info/). PATH@REF is a git checkout of sgl-project/sglang read with
`git show REF:python/...`. SGLang is never imported: the files are parsed with `ast`, and every file read is recorded
by its path in the repository (python/sglang/...) with its sha256.

- server_flags: ServerArgs.add_cli_args (python/sglang/srt/server_args.py), its parser.add_argument calls in order:
  option strings, kind (the type= callable or the action), choices (list literals and module constants followed
  through imports), default (ServerArgs.<field> read from the dataclass), nargs, required; the ServerArgs field each
  lands in (from_cli_args' renames, e.g. tensor_parallel_size -> tp_size).
- parser: how prepare_server_args builds its argparse.ArgumentParser (prog, allow_abbrev) and reads `--config`.
- speculative: the algorithms the release accepts (--speculative-algorithm choices, or SpeculativeAlgorithm's members
  when the name is a free string upper-cased and looked up), the aliases it rewrites (NEXTN -> EAGLE), and the checks
  of ServerArgs._handle_speculative_decoding flattened to data: each assert/raise with the if-tests that lead to it,
  and each if-test that may raise TypeError (a None ordered against a number), as expression trees over ServerArgs
  fields, assignments made earlier in the method substituted in.
- multi_node: the flags (--nnodes, --node-rank, --dist-init-addr, --tp-size, --pp-size) and the checks of ServerArgs'
  methods whose test names nnodes, node_rank or dist_init_addr.
- entry_points: `python3 -m sglang.launch_server`; `sglang serve` where the release installs the `sglang` script
  with a serve subcommand, and the model-path spellings its dispatcher looks for.
- env: the Envs registry of python/sglang/srt/environ.py and names read directly in ENV_FILES; metrics: the `sglang:`
  metrics created in METRICS_FILES.

Releases and images already in --out and not named are kept.
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import json
import re
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

SERVER_ARGS = "sglang/srt/server_args.py"
ENVIRON = "sglang/srt/environ.py"
SPEC_INFO = "sglang/srt/speculative/spec_info.py"
ENV_FILES = (ENVIRON, SERVER_ARGS, "sglang/srt/utils/common.py", "sglang/srt/utils/network.py",
             "sglang/srt/utils/__init__.py", "sglang/srt/entrypoints/engine.py",
             "sglang/srt/entrypoints/http_server.py")
METRICS_FILES = ("sglang/srt/metrics/collector.py", "sglang/srt/metrics/func_timer.py",
                 "sglang/srt/metrics/startup_func_log_and_timer.py", "sglang/srt/metrics/cpu_monitor.py",
                 "sglang/srt/observability/metrics_collector.py", "sglang/srt/observability/func_timer.py",
                 "sglang/srt/observability/startup_func_log_and_timer.py", "sglang/srt/observability/cpu_monitor.py",
                 "sglang/srt/utils/common.py")
MULTI_NODE_FLAGS = ("--nnodes", "--node-rank", "--dist-init-addr", "--tp-size", "--pp-size")
MULTI_NODE_FIELDS = {"nnodes", "node_rank", "dist_init_addr"}
SPECULATIVE_HANDLER = "_handle_speculative_decoding"
#: type= callable -> the kind of value it takes; any other callable reads as a str
TYPES = {"int": "int", "float": "float", "str": "str", "json.loads": "json", "json_list_type": "json",
         "nullable_str": "str", "human_readable_int": "int"}
ENV_READERS = {"getenv", "get", "get_bool_env_var", "get_int_env_var", "get_float_env_var", "get_str_env_var"}
REPO = "sgl-project/sglang"
#: lmsysorg/sglang:v<release>[-cu129|-cu130][-amd64|-arm64]: SGLang's Docker Hub tags name the release
VERSION_TAG = {"pattern": r"^(?:docker\.io/)?lmsysorg/sglang:v(?P<version>\d+\.\d+\.\d+(?:\.post\d+)?)"
                          r"(?:-cu\d+)?(?:-(?:amd64|arm64))?$",
               "source": "the release is the tag's own v<version> (SGLang's docs/get-started/install.mdx names "
                         "lmsysorg/sglang:v0.5.19-cu129; -cu130 tags appear in public deployment configs); the "
                         "-amd64/-arm64 suffixes as the sparkctl brief gives them"}
EXPOSITION = ("prometheus_client exposes a Counter named X as X_total (X_total when the name already ends so) plus "
              "X_created, a Histogram as X_bucket, X_sum and X_count, a Gauge as X; metrics_conditional lists the "
              "ones created only under an `if`. SGLang serves them on /metrics with --enable-metrics")
ARGPARSE = {"unknown": "%(prog)s: error: unrecognized arguments: %(args)s",
            "ambiguous": "%(prog)s: error: ambiguous option: %(option)s could match %(matches)s",
            "invalid_type": "%(prog)s: error: argument %(argument)s: invalid %(type)s value: %(value)r",
            "type_message": "%(prog)s: error: argument %(argument)s: %(message)s",
            "choice": "%(prog)s: error: argument %(argument)s: invalid choice: %(value)r (choose from %(choices)s)",
            "expected_one": "%(prog)s: error: argument %(argument)s: expected one argument",
            "expected_at_least_one": "%(prog)s: error: argument %(argument)s: expected at least one argument",
            "ignored_explicit": "%(prog)s: error: argument %(argument)s: ignored explicit argument %(value)r",
            "required": "%(prog)s: error: the following arguments are required: %(arguments)s",
            "from": "CPython Lib/argparse.py (ArgumentParser.error after the usage line, exit status 2); "
                    "'argument %s' is '/'.join(the option strings), e.g. --tensor-parallel-size/--tp-size; invalid "
                    "%s is the type callable's __name__ (int, float, loads for json.loads); choices are joined with "
                    "', ' as repr() before CPython gh-117766 and as str() after it (which patch release is not read "
                    "here); prog, when the parser names none, is os.path.basename(sys.argv[0]): launch_server.py "
                    "under `python3 -m sglang.launch_server` before Python 3.14, `python3 -m sglang.launch_server` "
                    "from 3.14"}


class Source:
    """Files of one release: an unpacked sdist or wheel (PATH) or a ref of a git checkout (PATH@REF), named by
    their path in the repository (python/sglang/...)."""

    def __init__(self, spec: str):
        path, _, ref = spec.rpartition("@") if "@" in spec else (spec, "", "")
        self.root, self.ref = Path(path).expanduser(), ref
        self.files: dict[str, str] = {}
        self.trees: dict[str, ast.Module | None] = {}

    def text(self, path: str, dist_only: bool = False) -> str | None:
        """A file by its path under the repository's python/ directory (the top of a distribution), recorded as
        python/<path>; `dist_only` files (PKG-INFO, a wheel's dist-info) are recorded by their own name."""
        named = path if dist_only else f"python/{path}"
        if self.ref:
            run = subprocess.run(["git", "-C", str(self.root), "show", f"{self.ref}:{named}"], capture_output=True)
            data = None if run.returncode else run.stdout
        else:
            file = self.root / path
            data = file.read_bytes() if file.is_file() else None
        if data is None:
            return None
        self.files[named] = hashlib.sha256(data).hexdigest()
        return data.decode()

    def tree(self, path: str) -> ast.Module | None:
        if path not in self.trees:
            text = self.text(path)
            self.trees[path] = ast.parse(text) if text is not None else None
        return self.trees[path]

    def module_path(self, dotted: str) -> str | None:
        """sglang.srt.utils -> sglang/srt/utils.py or sglang/srt/utils/__init__.py, whichever the release has."""
        if dotted.split(".")[0] != "sglang":
            return None
        base = dotted.replace(".", "/")
        return next((p for p in (f"{base}.py", f"{base}/__init__.py") if self.tree(p) is not None), None)

    def metadata(self, version: str) -> str:
        """The distribution's own Version line (PKG-INFO of an sdist, METADATA of a wheel)."""
        for name in ("PKG-INFO", f"sglang-{version}.dist-info/METADATA"):
            text = self.text(name, dist_only=True)
            if text is not None:
                found = re.search(r"^Version: (\S+)$", text, re.M)
                return found[1] if found else ""
        return ""

    def commit(self) -> str:
        return subprocess.run(["git", "-C", str(self.root), "rev-parse", f"{self.ref}^{{commit}}"],
                              check=True, capture_output=True, text=True).stdout.strip()

    def tags(self) -> list[str]:
        run = subprocess.run(["git", "-C", str(self.root), "tag", "--points-at", self.ref], capture_output=True,
                             text=True)
        return run.stdout.split() if run.returncode == 0 else []


def _last(node: ast.AST) -> str:
    """The called or named thing's own name: `a.b(x).c(y)` -> c."""
    while isinstance(node, ast.Call):
        node = node.func
    return node.attr if isinstance(node, ast.Attribute) else node.id if isinstance(node, ast.Name) else ""


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


def _at(path: str, node: ast.AST, what: str) -> str:
    return f"python/{path}:{node.lineno} {what}"


def _method(cls: ast.ClassDef, name: str) -> ast.FunctionDef | None:
    return next((n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == name), None)


def _class(tree: ast.Module | None, name: str) -> ast.ClassDef | None:
    return next((n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == name), None) if tree else None


def _function(tree: ast.Module | None, name: str) -> ast.FunctionDef | None:
    return next((n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == name), None) if tree else None


class Unresolved(Exception):
    """A value the static reading cannot give (a call, a name from outside the package)."""


class Values:
    """Module-level constants of server_args.py and the modules it imports from, as Python values."""

    def __init__(self, source: Source, path: str):
        self.source, self.path = source, path

    def top(self, path: str) -> tuple[dict[str, ast.AST], dict[str, tuple[str, str]]]:
        names: dict[str, ast.AST] = {}
        imports: dict[str, tuple[str, str]] = {}
        tree = self.source.tree(path)
        package = path.split("/")[:-1]
        for node in tree.body if tree else []:
            if isinstance(node, ast.Assign):
                names.update({ast.unparse(t): node.value for t in node.targets})
            elif isinstance(node, ast.AnnAssign) and node.value is not None:
                names[ast.unparse(node.target)] = node.value
            elif isinstance(node, (ast.ClassDef, ast.FunctionDef)):
                names[node.name] = node
            elif isinstance(node, ast.ImportFrom):
                base = node.module if not node.level else ".".join(
                    [*package[:len(package) - node.level + 1], *([node.module] if node.module else [])])
                imports.update({a.asname or a.name: (base or "", a.name) for a in node.names})
        return names, imports

    def lookup(self, path: str, name: str, depth: int = 0) -> tuple[str, ast.AST]:
        names, imports = self.top(path)
        if name in names:
            return path, names[name]
        if name in imports and depth < 6:
            module, attr = imports[name]
            other = self.source.module_path(module)
            if other:
                return self.lookup(other, attr, depth + 1)
        raise Unresolved(name)

    def value(self, node: ast.AST, env: dict[str, Any], path: str | None = None) -> Any:
        path = path or self.path
        if isinstance(node, ast.Constant):
            return node.value
        if isinstance(node, (ast.List, ast.Tuple, ast.Set)):
            return [self.value(e, env, path) for e in node.elts]
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
            return self.value(node.left, env, path) + self.value(node.right, env, path)
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            return -self.value(node.operand, env, path)
        if isinstance(node, ast.Name):
            if node.id in env:
                return env[node.id]
            where, found = self.lookup(path, node.id)
            return self.value(found, {}, where)
        if isinstance(node, ast.Dict):
            return {self.value(k, env, path): None for k in node.keys if k is not None}
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):  # Class.attribute
            where, cls = self.lookup(path, node.value.id)
            if isinstance(cls, ast.ClassDef):
                for st in cls.body:
                    target = st.targets[0] if isinstance(st, ast.Assign) else getattr(st, "target", None)
                    if target is not None and ast.unparse(target) == node.attr and st.value is not None:
                        return self.value(st.value, {}, where)
        if isinstance(node, ast.Call) and _last(node.func) in ("list", "sorted") and len(node.args) == 1:
            return list(self.value(node.args[0], env, path))
        if isinstance(node, ast.Call) and _last(node.func) == "keys" and isinstance(node.func, ast.Attribute):
            return list(self.value(node.func.value, env, path))
        raise Unresolved(ast.unparse(node))


class Flags:
    """ServerArgs.add_cli_args read statement by statement: every flag it adds, in the parser's order."""

    def __init__(self, source: Source, server_args: ast.ClassDef):
        self.source, self.cls = source, server_args
        self.values = Values(source, SERVER_ARGS)
        self.defaults = {st.target.id: st.value for st in server_args.body
                         if isinstance(st, ast.AnnAssign) and isinstance(st.target, ast.Name)}
        self.renames = self.field_renames()
        self.extendable = self.extended_lists()
        self.flags: dict[str, dict[str, Any]] = {}
        env: dict[str, Any] = {}
        add_cli_args = _method(server_args, "add_cli_args")
        for st in add_cli_args.body if add_cli_args else []:
            if isinstance(st, ast.Assign) and isinstance(st.targets[0], ast.Name):
                try:
                    env[st.targets[0].id] = self.values.value(st.value, env)
                except Unresolved:
                    env.pop(st.targets[0].id, None)
            for call in (n for n in ast.walk(st) if isinstance(n, ast.Call) and _last(n.func) == "add_argument"):
                self.add(call, env)

    def field_renames(self) -> dict[str, str]:
        """from_cli_args' `args.tp_size = args.tensor_parallel_size`: dest -> the ServerArgs field it fills."""
        found = _method(self.cls, "from_cli_args")
        return {ast.unparse(st.value).split(".", 1)[1]: ast.unparse(st.targets[0]).split(".", 1)[1]
                for st in (found.body if found else []) if isinstance(st, ast.Assign)
                and ast.unparse(st.value).startswith("args.") and ast.unparse(st.targets[0]).startswith("args.")}

    def extended_lists(self) -> set[str]:
        """The module's choice lists that `add_*_choices` functions let other code extend (plugins)."""
        tree = self.source.tree(SERVER_ARGS)
        return {ast.unparse(c.func.value) for fn in tree.body if isinstance(fn, ast.FunctionDef)
                for c in ast.walk(fn) if isinstance(c, ast.Call) and _last(c.func) == "extend"
                and isinstance(c.func, ast.Attribute)} if tree else set()

    def add(self, call: ast.Call, env: dict[str, Any]) -> None:
        names = [a.value for a in call.args if isinstance(a, ast.Constant) and isinstance(a.value, str)]
        kw = {k.arg: k.value for k in call.keywords if k.arg}
        key = next((n for n in names if n.startswith("--")), names[0])
        dest = kw["dest"].value if isinstance(kw.get("dest"), ast.Constant) else key.lstrip("-").replace("-", "_")
        entry: dict[str, Any] = {"dest": dest}
        if len(names) > 1:
            entry["aliases"] = [n for n in names if n != key]
        field = self.renames.get(dest, dest)
        entry.update({"field": field} if field in self.defaults else {})
        entry.update(self.action(kw))
        if "nargs" in kw and "nargs" not in entry:
            entry["nargs"] = _value_or_text(kw["nargs"])
        if entry.get("nargs") in ("*", "+") or isinstance(entry.get("nargs"), int) and entry["kind"] != "flag":
            entry["item"], entry["kind"] = entry["kind"], "list"
        if "choices" in kw:
            try:
                entry["choices"] = list(self.values.value(kw["choices"], env))
            except Unresolved:
                entry["choices_from"] = ast.unparse(kw["choices"])
            if set(re.findall(r"[A-Z_]{3,}", ast.unparse(kw["choices"]))) & self.extendable:
                entry["choices_extendable"] = True
        entry.update(self.default(kw, entry))
        if "required" in kw and _value_or_text(kw["required"]) is True:
            entry["required"] = True
        self.flags[key] = entry

    def action(self, kw: dict[str, ast.AST]) -> dict[str, Any]:
        """kind from action= (store_true, BooleanOptionalAction, the module's own Action classes) or type=."""
        action = kw.get("action")
        if action is None:
            text = ast.unparse(kw["type"]) if "type" in kw else "str"
            out: dict[str, Any] = {"kind": TYPES.get(text, "str"), "type": _last(kw["type"]) if "type" in kw
                                   else "str"}
            out.update(self.type_facts(text))
            return out
        text = _value_or_text(action)
        if text in ("store_true", "store_false"):
            return {"kind": "flag", **({"action": text} if text == "store_false" else {})}
        if isinstance(text, str) and text.endswith("BooleanOptionalAction"):
            return {"kind": "bool"}
        cls = _class(self.source.tree(SERVER_ARGS), str(text))
        if cls is None:
            return {"kind": "str", "action": str(text)}
        init, call = _method(cls, "__init__"), _method(cls, "__call__")
        nargs = next((_value_or_text(d) for a, d in zip(init.args.args[-len(init.args.defaults):],
                                                         init.args.defaults, strict=True) if a.arg == "nargs"),
                     None) if init and init.args.defaults else None
        raises = [r for r in ast.walk(call) if isinstance(r, ast.Raise)] if call else []
        if nargs == 0 and raises and ast.unparse(raises[0].exc).endswith("(self.help)"):
            return {"kind": "refused", "action": cls.name, "error": _last(raises[0].exc),
                    "message": _message(kw.get("help"))}
        if nargs == 0:
            return {"kind": "flag", "action": cls.name}
        out = {"kind": TYPES.get(ast.unparse(kw["type"]), "str") if "type" in kw else "str", "action": cls.name}
        return out | ({"nargs": nargs} if nargs is not None else {})

    def type_facts(self, name: str) -> dict[str, Any]:
        """A type= function of the package: the ArgumentTypeError message it gives for a bad value (its only one,
        raised from an except), and the suffix pattern of human_readable_int."""
        try:
            path, fn = Values(self.source, SERVER_ARGS).lookup(SERVER_ARGS, name)
        except Unresolved:
            return {}
        if not isinstance(fn, ast.FunctionDef):
            return {}
        out: dict[str, Any] = {}
        raises = [r for r in ast.walk(fn) if isinstance(r, ast.Raise) and _last(r.exc) == "ArgumentTypeError"]
        handlers = [r for h in ast.walk(fn) if isinstance(h, ast.ExceptHandler) for r in ast.walk(h)
                    if isinstance(r, ast.Raise)]
        if len(raises) == 1 and raises[0] in handlers:
            out["type_error"] = _message(raises[0].exc).replace("{" + fn.args.args[0].arg + "}", "{value}")
        patterns = [c.args[0].value for c in ast.walk(fn) if isinstance(c, ast.Call) and _last(c.func) == "fullmatch"
                    and c.args and isinstance(c.args[0], ast.Constant)]
        return out | ({"pattern": patterns[0]} if patterns else {})

    def default(self, kw: dict[str, ast.AST], entry: dict[str, Any]) -> dict[str, Any]:
        """The value argparse stores when the flag is absent: default=, else the action's (False for store_true),
        else None. `ServerArgs.x` reads the dataclass default; a default that is not a constant is left out."""
        node = kw.get("default")
        if node is None:
            return {"default": False} if entry["kind"] == "flag" and entry.get("action") != "store_false" else \
                {"default": True} if entry.get("action") == "store_false" else {"default": None}
        text = ast.unparse(node)
        if text.startswith("ServerArgs."):
            node = self.defaults.get(text.split(".", 1)[1])
            if node is None:
                return {}
        try:
            value = Values(self.source, SERVER_ARGS).value(node, {})
        except Unresolved:
            return {"default_from": text}
        return {"default": value} if _jsonable(value) else {"default_from": text}


def _value_or_text(node: ast.AST) -> Any:
    try:
        return ast.literal_eval(node)
    except ValueError:
        return ast.unparse(node)


def _jsonable(value: Any) -> bool:
    try:
        json.dumps(value)
    except TypeError:
        return False
    return True


def parser_facts(source: Source) -> tuple[dict[str, Any], dict[str, Any]]:
    """How prepare_server_args builds and feeds its parser; the error wording that follows (argparse's own unless
    the release sets a prog)."""
    tree = source.tree(SERVER_ARGS)
    prepare = _function(tree, "prepare_server_args")
    parsers = [c for c in ast.walk(prepare) if isinstance(c, ast.Call) and _last(c.func) == "ArgumentParser"]
    last = max(parsers, key=lambda c: c.lineno)  # the one that parses (an earlier one only lists the flags)
    kw = {k.arg: _value_or_text(k.value) for k in last.keywords if k.arg}
    config = next((n for n in ast.walk(prepare) if isinstance(n, ast.Compare) and isinstance(n.ops[0], ast.In)
                   and isinstance(n.left, ast.Constant) and n.left.value == "--config"), None)
    parser = {"prog": kw.get("prog"), "allow_abbrev": kw.get("allow_abbrev", True),
              "underscores": False,  # plain argparse: an option string is matched as written
              "evidence": _at(SERVER_ARGS, last, f"prepare_server_args: {ast.unparse(last)}")}
    if config is not None:
        parser["config"] = {"spelling": "--config", "exact_token": True,
                            "evidence": _at(SERVER_ARGS, config, f"prepare_server_args: if {ast.unparse(config)}")}
    errors = {**ARGPARSE, "prog": kw.get("prog")}
    return parser, errors


# -- checks as data: expression trees over ServerArgs fields --------------------------------------------------------
CMP = {ast.Eq: "==", ast.NotEq: "!=", ast.Lt: "<", ast.LtE: "<=", ast.Gt: ">", ast.GtE: ">=", ast.In: "in",
       ast.NotIn: "not in", ast.Is: "is", ast.IsNot: "is not"}
BIN = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.Mod: "%", ast.FloorDiv: "//", ast.Div: "/"}
ORDERING = {"<", "<=", ">", ">="}


class Checks:
    """One method of ServerArgs flattened in source order: its asserts and raises with the if-tests leading to them,
    and its if-tests that can raise TypeError, all over the fields as the user set them (assignments made earlier in
    the method substituted in as ["set", i], the i-th of `assignments`: ["cond", test, new, old] when made under an
    `if`). A `normalised` field is read as the
    method leaves it: its own rewrites (speculative_algorithm: upper-cased, aliases) are applied before the checks."""

    def __init__(self, path: str, fn: ast.FunctionDef, normalised: frozenset[str] = frozenset(),
                 assignments: list[dict[str, Any]] | None = None):
        self.path, self.fn, self.normalised = path, fn, normalised
        self.assignments = [] if assignments is None else assignments  # each once; expressions name them ["set", i]
        self.state: dict[str, Any] = {}
        self.steps: list[dict[str, Any]] = []
        self.block(fn.body, [])

    def where(self, node: ast.AST) -> str:
        return _at(self.path, node, f"ServerArgs.{self.fn.name}")

    def block(self, body: list[ast.stmt], when: list[Any]) -> None:
        when = list(when)
        for st in body:
            if isinstance(st, ast.If):
                test = self.expr(st.test)
                self.test_step(st, test, when)
                self.block(st.body, [*when, test])
                if st.orelse:
                    self.block(st.orelse, [*when, ["not", test]])
                if st.body and isinstance(st.body[-1], (ast.Return, ast.Raise)):
                    when.append(["not", test])  # what follows runs only when the branch did not leave
            elif isinstance(st, ast.Assert):
                test = self.expr(st.test)
                self.steps.append({"at": self.where(st), "kind": "assert", "when": list(when), "test": test,
                                   "error": "AssertionError", "message": _message(st.msg) if st.msg else "",
                                   "source": "assert " + ast.unparse(st.test)})
            elif isinstance(st, ast.Raise) and st.exc is not None:
                self.steps.append({"at": self.where(st), "kind": "raise", "when": list(when), "error": _last(st.exc),
                                   "message": _message(st.exc)})
            elif isinstance(st, (ast.Assign, ast.AugAssign, ast.AnnAssign)):
                self.assign(st, when)
            elif isinstance(st, (ast.With, ast.Try)):
                self.block(st.body, when)

    def test_step(self, st: ast.If, test: Any, when: list[Any]) -> None:
        if any(isinstance(n, ast.Compare) and any(type(op) in (ast.Lt, ast.LtE, ast.Gt, ast.GtE) for op in n.ops)
               or isinstance(n, ast.BinOp) for n in ast.walk(st.test)):
            self.steps.append({"at": self.where(st), "kind": "test", "when": list(when), "test": test,
                               "error": "TypeError", "message": "", "source": "if " + ast.unparse(st.test)})

    def assign(self, st: ast.Assign | ast.AugAssign | ast.AnnAssign, when: list[Any]) -> None:
        targets = st.targets if isinstance(st, ast.Assign) else [st.target]
        value = st.value
        for target in targets:
            names = target.elts if isinstance(target, ast.Tuple) else [target]
            for name in names:
                field = _self_field(name)
                if field is None or field in self.normalised:
                    continue
                if isinstance(st, ast.AugAssign) or isinstance(target, ast.Tuple) or value is None:
                    new: Any = ["opaque", ast.unparse(value) if value is not None else ast.unparse(st)]
                else:
                    new = self.expr(value)
                self.assignments.append({"at": self.where(st), "field": field,
                                         "value": ["cond", ["and", *when], new, self.current(field)] if when else new})
                self.state[field] = ["set", len(self.assignments) - 1]

    def current(self, field: str) -> Any:
        return self.state.get(field, ["field", field])

    def expr(self, node: ast.AST) -> Any:
        field = _self_field(node)
        if field is not None:
            return self.current(field)
        if isinstance(node, ast.Constant) and _jsonable(node.value):
            return ["const", node.value]
        if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
            return ["tuple", *(self.expr(e) for e in node.elts)]
        if isinstance(node, ast.BoolOp):
            return ["and" if isinstance(node.op, ast.And) else "or", *(self.expr(v) for v in node.values)]
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
            return ["not", self.expr(node.operand)]
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub) and isinstance(node.operand, ast.Constant):
            return ["const", -node.operand.value]
        if isinstance(node, ast.Compare):
            pairs = zip([node.left, *node.comparators], node.comparators, node.ops, strict=False)
            parts = [["cmp", CMP[type(op)], self.expr(a), self.expr(b)] for a, b, op in pairs]
            return parts[0] if len(parts) == 1 else ["and", *parts]
        if isinstance(node, ast.BinOp) and type(node.op) in BIN:
            return ["bin", BIN[type(node.op)], self.expr(node.left), self.expr(node.right)]
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and not node.args \
                and node.func.attr in ("upper", "lower"):
            return [node.func.attr, self.expr(node.func.value)]
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "startswith" \
                and len(node.args) == 1:
            return ["startswith", self.expr(node.func.value), self.expr(node.args[0])]
        return ["opaque", ast.unparse(node)]


def _self_field(node: ast.AST) -> str | None:
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "self":
        return node.attr
    return None


def _fields_of(tree: Any, assignments: list[dict[str, Any]]) -> set[str]:
    """The fields an expression reads, through the assignments it names."""
    if not isinstance(tree, list) or not tree:
        return set()
    if tree[0] == "field":
        return {tree[1]}
    if tree[0] == "set":
        return _fields_of(assignments[tree[1]]["value"], assignments)
    parts = tree[1:] if isinstance(tree[0], str) else tree  # an expression, or a list of them
    return {f for part in parts for f in _fields_of(part, assignments)}


def alias_functions(tree: ast.Module) -> dict[str, dict[str, str]]:
    """Module functions that rewrite a speculative algorithm name: `if name == "NEXTN" or name == "EAGLE": ...
    return "EAGLE"`, the last unconditional return of each such branch (branches that read the draft model's config
    first are not data: see `alias_conditional`)."""
    out: dict[str, dict[str, str]] = {}
    for fn in (n for n in tree.body if isinstance(n, ast.FunctionDef) and "speculative_algorithm" in n.name):
        param = fn.args.args[0].arg
        table: dict[str, str] = {}
        for branch in (n for n in fn.body if isinstance(n, ast.If)):
            names = [c.comparators[0].value for c in ast.walk(branch.test) if isinstance(c, ast.Compare)
                     and ast.unparse(c.left) == param and isinstance(c.ops[0], ast.Eq)
                     and isinstance(c.comparators[0], ast.Constant)]
            returned = [st.value.value for st in branch.body if isinstance(st, ast.Return)
                        and isinstance(st.value, ast.Constant)]
            if names and returned:
                table.update(dict.fromkeys(names, returned[-1]))
        if table:
            out[fn.name] = table
    return out


def speculative(source: Source, server_args: ast.ClassDef, flags: dict[str, dict[str, Any]]) -> dict[str, Any]:
    tree = source.tree(SERVER_ARGS)
    handler = _method(server_args, SPECULATIVE_HANDLER)
    aliases = alias_functions(tree)
    checks = Checks(SERVER_ARGS, handler, frozenset({"speculative_algorithm"})) if handler else None
    flag = flags.get("--speculative-algorithm", {})
    out: dict[str, Any] = {"flag": "--speculative-algorithm", "evidence": _at(SERVER_ARGS, handler,
                                                                                f"ServerArgs.{SPECULATIVE_HANDLER}")}
    upper = bool(handler) and any(isinstance(n, ast.Call) and _last(n.func) == "upper"
                                  and "speculative_algorithm" in ast.unparse(n) for n in ast.walk(handler))
    if "choices" in flag:
        out.update(algorithms=flag["choices"], names="choices", case_sensitive=True)
    else:
        enum = _class(source.tree(SPEC_INFO), "SpeculativeAlgorithm")
        members = [ast.unparse(st.targets[0]) for st in enum.body if isinstance(st, ast.Assign)] if enum else []
        from_string = _method(enum, "from_string") if enum else None
        raised = next((r for r in ast.walk(from_string) if isinstance(r, ast.Raise)), None) if from_string else None
        out.update(algorithms=[m for m in members if m != "NONE"], names="free string, upper-cased and looked up",
                   case_sensitive=not upper, registered_plugins=True,
                   names_evidence=_at(SPEC_INFO, enum, "class SpeculativeAlgorithm") if enum else None)
        if raised is not None:
            out.update(unknown_error=_last(raised.exc), unknown_message=_message(raised.exc))
    alias_table: dict[str, str] = {}
    for fn_name, table in aliases.items():
        if handler and any(isinstance(n, ast.Call) and _last(n.func) == fn_name for n in ast.walk(handler)):
            alias_table.update(table)
            fn = _function(tree, fn_name)
            out["alias_conditional"] = _at(SERVER_ARGS, fn, f"{fn_name}: other rewrites depend on the draft "
                                                                      "model's config (not read here)")
    for st in ast.walk(handler) if handler else []:  # if self.speculative_algorithm == "NEXTN": ... = "EAGLE"
        if isinstance(st, ast.If) and isinstance(st.test, ast.Compare) \
                and ast.unparse(st.test.left) == "self.speculative_algorithm" and isinstance(st.test.ops[0], ast.Eq):
            for inner in st.body:
                if isinstance(inner, ast.Assign) and ast.unparse(inner.targets[0]) == "self.speculative_algorithm" \
                        and isinstance(inner.value, ast.Constant):
                    alias_table[st.test.comparators[0].value] = inner.value.value
    out["aliases"] = alias_table
    assignments = checks.assignments if checks else []
    steps = [s for s in (checks.steps if checks else [])
             if s["kind"] != "test" or _fields_of(s["test"], assignments) & _spec_fields(flags)]
    used = _used_assignments(steps, assignments)
    renumber = {old: new for new, old in enumerate(used)}
    out["checks"] = _renumbered(steps, renumber)
    out["assignments"] = _renumbered([assignments[i] for i in used], renumber)
    return out


def _spec_fields(flags: dict[str, dict[str, Any]]) -> set[str]:
    return {spec["field"] for spec in flags.values() if spec.get("field", "").startswith("speculative_")}


def multi_node(source: Source, server_args: ast.ClassDef, flags: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The multi-node flags (by their canonical option string) and every check of a ServerArgs method that names
    nnodes, node_rank or dist_init_addr, each method read on its own."""
    canonical = {name: key for key, spec in flags.items() for name in [key, *spec.get("aliases", [])]}
    checks: list[dict[str, Any]] = []
    assignments: list[dict[str, Any]] = []
    for fn in (n for n in server_args.body if isinstance(n, ast.FunctionDef)):
        for step in Checks(SERVER_ARGS, fn, assignments=assignments).steps:
            named = _fields_of([step.get("test"), *step["when"]], assignments)
            if named & MULTI_NODE_FIELDS and step["kind"] != "test":
                checks.append(step)
    used = _used_assignments(checks, assignments)
    renumber = {old: new for new, old in enumerate(used)}
    return {"flags": {flag: canonical.get(flag) for flag in MULTI_NODE_FLAGS},
            "checks": _renumbered(checks, renumber),
            "assignments": _renumbered([assignments[i] for i in used], renumber)}


def _used_assignments(tree: Any, assignments: list[dict[str, Any]]) -> list[int]:
    """The assignments an expression names, and those they name in turn, in order."""
    found: set[int] = set()
    todo = [tree]
    while todo:
        node = todo.pop()
        if isinstance(node, dict):
            todo.extend(node.values())
        elif isinstance(node, list):
            if len(node) == 2 and node[0] == "set" and isinstance(node[1], int) and node[1] not in found:
                found.add(node[1])
                todo.append(assignments[node[1]])
            else:
                todo.extend(node)
    return sorted(found)


def _renumbered(tree: Any, renumber: dict[int, int]) -> Any:
    if isinstance(tree, dict):
        return {k: _renumbered(v, renumber) for k, v in tree.items()}
    if isinstance(tree, list):
        if len(tree) == 2 and tree[0] == "set" and isinstance(tree[1], int):
            return ["set", renumber[tree[1]]]
        return [_renumbered(v, renumber) for v in tree]
    return tree


def entry_points(source: Source, parser: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    launch = source.tree("sglang/launch_server.py")
    if launch is not None and "prepare_server_args" in ast.unparse(launch):
        out["launch_server"] = {"command": "python3 -m sglang.launch_server", "prog": parser["prog"],
                                "evidence": "python/sglang/launch_server.py: prepare_server_args(sys.argv[1:])"}
    script = _console_script(source)
    main = source.tree("sglang/cli/main.py")
    subcommands = [c.args[0].value for c in ast.walk(main) if isinstance(c, ast.Call) and _last(c.func) ==
                   "add_parser" and c.args and isinstance(c.args[0], ast.Constant)] if main else []
    if script and "serve" in subcommands:
        utils = source.tree("sglang/cli/utils.py")
        getter = _function(utils, "get_model_path")
        spellings = sorted({c.value for n in ast.walk(getter) if isinstance(n, (ast.Compare, ast.Call))
                            for c in ast.walk(n) if isinstance(c, ast.Constant) and isinstance(c.value, str)
                            and c.value.startswith("--model")}) if getter else []
        raised = [_message(r.exc) for r in ast.walk(getter) if isinstance(r, ast.Raise)] if getter else []
        out["serve"] = {"command": "sglang serve", "script": script, "prog": parser["prog"],
                        "model_path_spellings": spellings,
                        "model_path_missing": next((m for m in raised if "required" in m), None),
                        "evidence": "python/sglang/cli/main.py: add_parser('serve'); python/sglang/cli/utils.py: "
                                    "get_model_path"}
    return out


def _console_script(source: Source) -> str | None:
    """The `sglang` console script: [project.scripts] of pyproject.toml (sdist, git) or entry_points.txt (wheel)."""
    dist_info = [] if source.ref else sorted(p.relative_to(source.root).as_posix()
                                             for p in source.root.glob("sglang-*.dist-info/entry_points.txt"))
    for name in ["pyproject.toml", *dist_info]:
        text = source.text(name, dist_only=name in dist_info) or ""
        found = re.search(r'^sglang\s*=\s*"?(sglang\.cli\.main:main)"?\s*$', text, re.M)
        if found:
            return f"sglang = {found[1]}"
    return None


def env_facts(source: Source) -> tuple[list[str], dict[str, Any], dict[str, list[str]]]:
    """The Envs registry (name -> kind, default) and names read with os.getenv / os.environ / get_*_env_var in
    ENV_FILES outside it; and the SGL_ -> SGLANG_ renaming environ.py applies at import."""
    registry: dict[str, Any] = {}
    direct: dict[str, list[str]] = {}
    tree = source.tree(ENVIRON)
    envs = _class(tree, "Envs")
    for st in envs.body if envs else []:
        if isinstance(st, ast.Assign) and isinstance(st.value, ast.Call) and _last(st.value.func).startswith("Env"):
            default = _value_or_text(st.value.args[0]) if st.value.args else None
            registry[ast.unparse(st.targets[0])] = {"kind": _last(st.value.func)[3:].lower(),
                                                    **({"default": default} if _jsonable(default) else {})}
    for path in ENV_FILES:
        file_tree = source.tree(path)
        for node in ast.walk(file_tree) if file_tree else []:
            name = _env_read(node)
            if name and name not in registry:
                direct.setdefault(name, []).append(f"python/{path}")
    renamed = _function(tree, "_convert_SGL_to_SGLANG")
    extra = {"renames_prefix": {"SGL_": "SGLANG_"}} if renamed else {}
    return sorted({*registry, *direct}), {"registry": registry, **extra}, {k: sorted(set(v)) for k, v in
                                                                            sorted(direct.items())}


def _env_read(node: ast.AST) -> str | None:
    if isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant) \
            and isinstance(node.args[0].value, str) and _last(node.func) in ENV_READERS:
        text = ast.unparse(node.func)
        if "environ" in text or text in ("os.getenv", "getenv") or _last(node.func).endswith("_env_var"):
            return node.args[0].value
    if isinstance(node, ast.Subscript) and ast.unparse(node.value) == "os.environ" \
            and isinstance(node.slice, ast.Constant) and isinstance(node.slice.value, str):
        return node.slice.value
    if isinstance(node, ast.Compare) and isinstance(node.ops[0], ast.In) and isinstance(node.left, ast.Constant) \
            and ast.unparse(node.comparators[0]) == "os.environ":
        return str(node.left.value)
    return None


def metrics(source: Source) -> tuple[dict[str, str], dict[str, str]]:
    """`sglang:` metric -> gauge/counter/histogram/summary, and the `if` guarding the ones created conditionally."""
    kinds: dict[str, str] = {}
    guarded: dict[str, str] = {}
    for path in METRICS_FILES:
        tree = source.tree(path)
        if tree is None:
            continue
        parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
        for call in (n for n in ast.walk(tree) if isinstance(n, ast.Call)):
            named = [k.value for k in call.keywords if k.arg == "name"] or call.args[:1]
            name = named[0].value if named and isinstance(named[0], ast.Constant) else None
            kind = next((k for k in ("gauge", "counter", "histogram", "summary") if k == _last(call.func).lower()),
                        None)
            if not (isinstance(name, str) and name.startswith("sglang:") and kind):
                continue
            kinds[name] = kind
            node = parents.get(call)
            while node is not None and not isinstance(node, (ast.If, ast.FunctionDef)):
                node = parents.get(node)
            if isinstance(node, ast.If):
                guarded[name] = f"python/{path}: if {ast.unparse(node.test)}"
    return dict(sorted(kinds.items())), dict(sorted(guarded.items()))


def release_entry(version: str, spec: str, dist_sha256: str | None) -> dict[str, Any]:
    source = Source(spec)
    if source.ref and f"v{version}" not in source.tags():
        raise SystemExit(f"{spec}: {source.ref} is not tagged v{version} (name the release's tag)")
    if not source.ref and source.metadata(version) != version:
        raise SystemExit(f"{spec}: its PKG-INFO or sglang-{version}.dist-info/METADATA is not SGLang {version}")
    tree = source.tree(SERVER_ARGS)
    server_args = _class(tree, "ServerArgs")
    if server_args is None or _method(server_args, "add_cli_args") is None:
        raise SystemExit(f"{spec}: python/{SERVER_ARGS} has no ServerArgs.add_cli_args")
    flags = Flags(source, server_args).flags
    parser, errors = parser_facts(source)
    env, env_registry, env_direct = env_facts(source)
    kinds, guarded = metrics(source)
    out = {"server_flags": flags, "parser": parser, "errors": errors,
           "speculative": speculative(source, server_args, flags), "multi_node": multi_node(source, server_args,
                                                                                            flags),
           "entry_points": entry_points(source, parser), "env": env, "env_registry": env_registry,
           "env_direct": env_direct, "metrics": kinds, "metrics_conditional": guarded,
           "metrics_exposition": EXPOSITION}
    dist = "" if source.ref else ("sdist" if (source.root / "PKG-INFO").is_file() else "wheel")
    out["source"] = {"repo": REPO, "ref": f"v{version}", **({"commit": source.commit()} if source.ref else {}),
                     **({"dist": dist, "dist_url": f"https://pypi.org/project/sglang/{version}/#files",
                         "dist_sha256": dist_sha256} if dist else {}),
                     "files": dict(sorted(source.files.items()))}
    return out


def _pairs(items: list[str], what: str) -> dict[str, str]:
    if bad := [item for item in items if "=" not in item]:
        raise SystemExit(f"expected {what}, got {bad}")
    return dict(item.split("=", 1) for item in items)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--release", action="append", required=True, metavar="VERSION=PATH[@REF]")
    parser.add_argument("--dist-sha256", action="append", default=[], metavar="VERSION=HEX")
    parser.add_argument("--image", action="append", default=[], metavar="TAG=VERSION")
    parser.add_argument("--image-source", action="append", default=[], metavar="TAG=TEXT",
                        help="where the tag's release is said (a secondary source says so)")
    parser.add_argument("--out", type=Path,
                        default=Path(__file__).resolve().parents[1] / "sparkctl/knowledge/sglang_releases.json")
    args = parser.parse_args(argv)
    data = json.loads(args.out.read_text()) if args.out.exists() else {}
    images = data.get("images") or {"tags": {}, "sources": {}}
    images["version_tag"] = VERSION_TAG
    images["tags"].update(_pairs(args.image, "TAG=VERSION"))
    images["sources"].update(_pairs(args.image_source, "TAG=TEXT"))
    releases, hashes = data.get("releases", {}), _pairs(args.dist_sha256, "VERSION=HEX")
    for version, spec in _pairs(args.release, "VERSION=PATH[@REF]").items():
        before = releases.get(version, {}).get("source", {})
        got = releases[version] = release_entry(version, spec, hashes.get(version))
        if got["source"].get("dist_sha256", "") is None and before.get("files") == got["source"]["files"]:
            got["source"]["dist_sha256"] = before.get("dist_sha256")  # same files: keep the hash given before
        print(f"{version}: {len(got['server_flags'])} server flags, {len(got['env'])} env vars, "
              f"{len(got['metrics'])} metrics, {len(got['speculative']['checks'])} speculative checks",
              file=sys.stderr)
    about = ("What `python3 -m sglang.launch_server` / `sglang serve` accept and how each SGLang release behaves "
             "(flags, parser, speculative algorithms and checks, multi-node checks, entry points, env vars, "
             "metrics), read statically (ast; SGLang never imported) from the release source by "
             "scripts/sglang_knowledge.py. Last run: " + shlex.join(["scripts/sglang_knowledge.py", *argv]))
    out = {"about": about, "format": 1, "images": images, "releases": releases}
    args.out.write_text(json.dumps(out, indent=1, sort_keys=True) + "\n")  # keys sorted; the loader orders releases
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
