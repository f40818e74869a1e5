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
  lands in (from_cli_args' renames, e.g. tensor_parallel_size -> tp_size). From 0.5.18 most flags are derived from
  the record's `A[T, "help" | Arg(...)]` fields by add_cli_args_from_dataclass (arg_groups/arg_utils.py): those are
  read as the add_argument calls it makes (bool -> store_true, Literal -> choices, List -> nargs "+", a field with no
  default -> required), in the record's field order; from 0.5.20 the fields live in arg_groups/fields/, one class per
  namespace, assembled by collect_input_fields in POSITIONAL_FIELD_ORDER.
- parser: how prepare_server_args builds its argparse.ArgumentParser (prog, allow_abbrev) and reads `--config`.
- speculative: the algorithms the release accepts (--speculative-algorithm choices, or SpeculativeAlgorithm's members
  when the name is a free string upper-cased and looked up), the aliases it rewrites (NEXTN -> EAGLE), and the checks
  of ServerArgs._handle_speculative_decoding flattened to data: each assert/raise with the if-tests that lead to it,
  and each if-test that may raise TypeError (a None ordered against a number), as expression trees over ServerArgs
  fields, assignments made earlier in the method substituted in. From 0.5.18 the handler is
  arg_groups/speculative_hook.py's handle_speculative_decoding: the record is read as `cfg = resolving_view(...)`,
  written with `declare_resolution(server_args, hook, field=value)`, and the per-algorithm functions it reaches
  (directly, or through SpeculativeAlgorithm.handle_server_args' `self.is_eagle()` dispatch) are read in place.
- multi_node: the flags (--nnodes, --node-rank, --dist-init-addr, --tp-size, --pp-size) and the checks of ServerArgs'
  methods (and, from 0.5.18, of arg_groups/ functions that read the record) whose test names nnodes, node_rank or
  dist_init_addr.
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
ARG_GROUPS = "sglang/srt/arg_groups"  # 0.5.18 and later: the record's fields and its resolution hooks
CHOICES = f"{ARG_GROUPS}/choices.py"
SPECULATIVE_HOOK = f"{ARG_GROUPS}/speculative_hook.py"
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

    def modules(self, package: str) -> list[str]:
        """The .py files directly in a package directory of the release, by path."""
        if self.ref:
            run = subprocess.run(["git", "-C", str(self.root), "ls-tree", "--name-only",
                                  f"{self.ref}:python/{package}/"], capture_output=True, text=True)
            names = run.stdout.split() if run.returncode == 0 else []
        else:
            folder = self.root / package
            names = [p.name for p in folder.iterdir()] if folder.is_dir() else []
        return sorted(f"{package}/{name}" for name in names if name.endswith(".py"))

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
        if isinstance(node, ast.Call) and _last(node.func) in ("list", "sorted", "set") and len(node.args) == 1:
            return list(self.value(node.args[0], env, path))
        if isinstance(node, ast.Call) and _last(node.func) == "keys" and isinstance(node.func, ast.Attribute):
            return list(self.value(node.func.value, env, path))
        raise Unresolved(ast.unparse(node))


class AnnotatedFields:
    """The add_argument calls add_cli_args_from_dataclass makes (SGLang 0.5.18 and later,
    python/sglang/srt/arg_groups/arg_utils.py) for the record's `A[T, "help" | Arg(...)]` fields, in the record's
    field order, each with the module that declares it. 0.5.18 declares them in ServerArgs itself; from 0.5.20 they
    live in arg_groups/fields/, one class per namespace, assembled by collect_input_fields in POSITIONAL_FIELD_ORDER
    with ServerArgs' own after them. Fields with neither a help string nor an Arg, and `Arg(no_cli=True)`, get no
    flag, as there."""

    def __init__(self, source: Source, server_args: ast.ClassDef):
        self.source, self.values = source, Values(source, SERVER_ARGS)
        self.calls: list[tuple[str, ast.Call]] = []
        self.defaults: dict[str, tuple[str, ast.AST]] = {}
        self.names: set[str] = set()
        for path, st in self.declared(server_args):
            name = st.target.id  # type: ignore[attr-defined]
            self.names.add(name)
            default = self.default_of(st.value)
            if default is not None:
                self.defaults[name] = (path, default)
            call = self.call(path, name, st.annotation, default)
            if call is not None:
                self.calls.append((path, call))

    def declared(self, server_args: ast.ClassDef) -> list[tuple[str, ast.AnnAssign]]:
        own = [(SERVER_ARGS, st) for st in server_args.body if isinstance(st, ast.AnnAssign)
               and isinstance(st.target, ast.Name)]
        collect = next((n.value for n in (self.source.tree(SERVER_ARGS) or ast.Module(body=[], type_ignores=[])).body
                        if isinstance(n, ast.Assign) and isinstance(n.value, ast.Call)
                        and _last(n.value.func) == "collect_input_fields"), None)
        if collect is None:
            return own
        listed = collect.args[0]
        if isinstance(listed, ast.Name):
            listed = self.values.lookup(SERVER_ARGS, listed.id)[1]
        fields: dict[str, tuple[str, ast.AnnAssign]] = {}
        for name in listed.elts if isinstance(listed, (ast.List, ast.Tuple)) else []:
            path, cls = self.values.lookup(SERVER_ARGS, ast.unparse(name))
            fields.update({st.target.id: (path, st) for st in cls.body if isinstance(st, ast.AnnAssign)
                           and isinstance(st.target, ast.Name)})
        where, _ = self.values.lookup(SERVER_ARGS, _last(collect.func))
        order = ast.literal_eval(self.values.lookup(where, "POSITIONAL_FIELD_ORDER")[1])
        ordered = [n for n in order if n in fields] + [n for n in fields if n not in set(order)]
        return [fields[n] for n in ordered] + own

    @staticmethod
    def default_of(node: ast.AST | None) -> ast.AST | None:
        """`= x`, `= field(default=x)`, `= field(default_factory=list)` as the value argparse is given."""
        if not (isinstance(node, ast.Call) and _last(node.func) == "field"):
            return node
        kw = {k.arg: k.value for k in node.keywords}
        if "default" in kw:
            return kw["default"]
        factory = kw.get("default_factory")
        if isinstance(factory, ast.Name) and factory.id in ("list", "dict"):
            return ast.List(elts=[]) if factory.id == "list" else ast.Dict(keys=[], values=[])
        return node

    def call(self, path: str, name: str, annotation: ast.AST, default: ast.AST | None) -> ast.Call | None:
        if not (isinstance(annotation, ast.Subscript) and _last(annotation.value) in ("A", "Annotated")):
            return None
        parts = annotation.slice.elts if isinstance(annotation.slice, ast.Tuple) else [annotation.slice]
        meta: dict[str, ast.AST] | None = None
        for part in parts[1:]:
            if isinstance(part, ast.Call) and _last(part.func) == "Arg":
                meta = {k.arg: k.value for k in part.keywords if k.arg}
                break
            if isinstance(part, (ast.JoinedStr, ast.BinOp)) or isinstance(part, ast.Constant) \
                    and isinstance(part.value, str):
                meta = {"help": part}
                break
        if meta is None or _value_or_text(meta.get("no_cli", ast.Constant(False))) is True:
            return None
        cli = meta["cli_name"].value if isinstance(meta.get("cli_name"), ast.Constant) else \
            "--" + name.replace("_", "-")
        names = [cli, *(ast.literal_eval(meta["aliases"]) if "aliases" in meta else [])]
        kw: dict[str, ast.AST] = {"help": meta.get("help", ast.Constant(""))}
        if cli.lstrip("-").replace("-", "_") != name:
            kw["dest"] = ast.Constant(name)
        with_default = {"default": default} if default is not None else {}
        with_const = {"const": meta["const"]} if "const" in meta else {}
        if "action" in meta:
            extra = meta.get("action_kwargs")
            kw.update(action=meta["action"], **with_default)
            if isinstance(extra, ast.Dict):
                kw.update({k.value: v for k, v in zip(extra.keys, extra.values, strict=True)
                           if isinstance(k, ast.Constant)})
            return self.made(names, kw)
        inner = self.unwrapped(path, parts[0])
        if isinstance(inner, ast.Subscript) and _last(inner.value) == "Literal":
            literals = inner.slice.elts if isinstance(inner.slice, ast.Tuple) else [inner.slice]
            first = type(literals[0].value).__name__ if literals and isinstance(literals[0], ast.Constant) else "str"
            kw.update(type=meta.get("type_parser", ast.Name(self.type_name(first))),
                      choices=meta.get("choices", ast.List(elts=literals)), **with_default, **with_const)
            return self.made(names, kw)
        if isinstance(inner, ast.Subscript) and _last(inner.value) in ("List", "list") and "type_parser" not in meta:
            kw.update(type=ast.Name(self.type_name(ast.unparse(inner.slice))),
                      nargs=meta.get("nargs", ast.Constant("+")),
                      **({"choices": meta["choices"]} if "choices" in meta else {}), **with_default, **with_const)
            return self.made(names, kw)
        if ast.unparse(inner) == "bool":
            kw.update(action=ast.Constant("store_true"), **with_default)
            return self.made(names, kw)
        kw["type"] = meta.get("type_parser", ast.Name(self.type_name(ast.unparse(inner))))
        kw.update({k: meta[k] for k in ("choices", "nargs") if k in meta}, **with_default, **with_const)
        required = _value_or_text(meta["required"]) if "required" in meta else None
        if required is True or required is None and default is None:
            kw["required"] = ast.Constant(True)
        return self.made(names, kw)

    def unwrapped(self, path: str, node: ast.AST) -> ast.AST:
        """T of `Optional[T]`, `T | None`, `Union[T, None]`, through the module's type aliases."""
        for _ in range(6):
            if isinstance(node, ast.Name) and node.id not in ("str", "int", "float", "bool"):
                try:
                    path, found = self.values.lookup(path, node.id)
                except Unresolved:
                    return node
                if not isinstance(found, (ast.Subscript, ast.BinOp, ast.Name)):
                    return node
                node = found
            elif isinstance(node, ast.Subscript) and _last(node.value) == "Optional":
                node = node.slice
            elif isinstance(node, ast.Subscript) and _last(node.value) == "Union":
                kept = [e for e in getattr(node.slice, "elts", [node.slice]) if ast.unparse(e) != "None"]
                if len(kept) != 1:
                    return node
                node = kept[0]
            elif isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
                kept = [e for e in (node.left, node.right) if ast.unparse(e) != "None"]
                if len(kept) != 1:
                    return node
                node = kept[0]
            else:
                return node
        return node

    @staticmethod
    def type_name(text: str) -> str:
        """arg_utils._infer_type_func: str, int and float are themselves; anything else reads as str."""
        return text if text in ("str", "int", "float") else "str"

    @staticmethod
    def made(names: list[str], kw: dict[str, ast.AST]) -> ast.Call:
        return ast.Call(func=ast.Attribute(value=ast.Name("parser"), attr="add_argument"),
                        args=[ast.Constant(n) for n in names], keywords=[ast.keyword(arg=k, value=v)
                                                                         for k, v in kw.items()])


class Flags:
    """ServerArgs.add_cli_args read statement by statement: every flag it adds, in the parser's order."""

    def __init__(self, source: Source, server_args: ast.ClassDef):
        self.source, self.cls = source, server_args
        self.values = Values(source, SERVER_ARGS)
        annotated = AnnotatedFields(source, server_args)
        #: field -> (the module it is declared in, its default as written)
        self.defaults = {st.target.id: (SERVER_ARGS, st.value) for st in server_args.body
                         if isinstance(st, ast.AnnAssign) and isinstance(st.target, ast.Name) and st.value is not None}
        self.defaults.update(annotated.defaults)
        self.fields = {*self.defaults, *annotated.names}
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
            for call in (n for n in ast.walk(st) if isinstance(n, ast.Call)):
                if _last(call.func) == "add_argument":
                    self.add(call, env)
                elif _last(call.func) == "add_cli_args_from_dataclass":
                    for path, derived in annotated.calls:
                        self.add(derived, {}, path)

    def field_renames(self) -> dict[str, str]:
        """from_cli_args' `args.tp_size = args.tensor_parallel_size`: dest -> the ServerArgs field it fills."""
        found = _method(self.cls, "from_cli_args")
        return {ast.unparse(st.value).split(".", 1)[1]: ast.unparse(st.targets[0]).split(".", 1)[1]
                for st in (found.body if found else []) if isinstance(st, ast.Assign)
                and ast.unparse(st.value).startswith("args.") and ast.unparse(st.targets[0]).startswith("args.")}

    def extended_lists(self) -> set[str]:
        """The choice lists that `add_*_choices` functions (or, from 0.5.20, `add_*_choices = LIST.extend`) let other
        code extend (plugins), in server_args.py and arg_groups/choices.py."""
        out = set()
        for path in (SERVER_ARGS, CHOICES):
            for node in (self.source.tree(path) or ast.Module(body=[], type_ignores=[])).body:
                if isinstance(node, ast.FunctionDef):
                    out |= {ast.unparse(c.func.value) for c in ast.walk(node) if isinstance(c, ast.Call)
                            and _last(c.func) == "extend" and isinstance(c.func, ast.Attribute)}
                elif isinstance(node, ast.Assign) and isinstance(node.value, ast.Attribute) \
                        and node.value.attr == "extend":  # add_load_format_choices = LOAD_FORMAT_CHOICES.extend
                    out.add(ast.unparse(node.value.value))
        return out

    def add(self, call: ast.Call, env: dict[str, Any], path: str = SERVER_ARGS) -> None:
        """One add_argument call; its names are read in `path`, the module that wrote it."""
        values = Values(self.source, path)
        names = [a.value for a in call.args if isinstance(a, ast.Constant) and isinstance(a.value, str)]
        kw = {k.arg: k.value for k in call.keywords if k.arg}
        key = next((n for n in names if n.startswith("--")), names[0])
        dest = kw["dest"].value if isinstance(kw.get("dest"), ast.Constant) else key.lstrip("-").replace("-", "_")
        entry: dict[str, Any] = {"dest": dest}
        if len(names) > 1:
            entry["aliases"] = [n for n in names if n != key]
        field = self.renames.get(dest, dest)
        entry.update({"field": field} if field in self.fields else {})
        entry.update(self.action(kw, path))
        if "nargs" in kw and "nargs" not in entry:
            entry["nargs"] = _value_or_text(kw["nargs"])
        if entry.get("nargs") in ("*", "+") or isinstance(entry.get("nargs"), int) and entry["kind"] != "flag":
            entry["item"], entry["kind"] = entry["kind"], "list"
        if "choices" in kw:
            try:
                entry["choices"] = list(values.value(kw["choices"], env))
            except Unresolved:
                entry["choices_from"] = ast.unparse(kw["choices"])
            if set(re.findall(r"[A-Z_]{3,}", ast.unparse(kw["choices"]))) & self.extendable:
                entry["choices_extendable"] = True
        entry.update(self.default(kw, entry, path))
        if "required" in kw and _value_or_text(kw["required"]) is True:
            entry["required"] = True
        self.flags[key] = entry

    def action(self, kw: dict[str, ast.AST], path: str) -> dict[str, Any]:
        """kind from action= (store_true, BooleanOptionalAction, the package's own Action classes) or type=."""
        action = kw.get("action")
        if action is None:
            text = ast.unparse(kw["type"]) if "type" in kw else "str"
            out: dict[str, Any] = {"kind": TYPES.get(text, "str"), "type": _last(kw["type"]) if "type" in kw
                                   else "str"}
            out.update(self.type_facts(text, path))
            return out
        text = _value_or_text(action)
        if text in ("store_true", "store_false"):
            return {"kind": "flag", **({"action": text} if text == "store_false" else {})}
        if isinstance(text, str) and text.endswith("BooleanOptionalAction"):
            return {"kind": "bool"}
        try:
            _, cls = Values(self.source, path).lookup(path, str(text))
        except Unresolved:
            cls = None
        if not isinstance(cls, ast.ClassDef):
            return {"kind": "str", "action": str(text)}
        init, call = _method(cls, "__init__"), _method(cls, "__call__")
        nargs = next((_value_or_text(d) for a, d in zip(init.args.args[-len(init.args.defaults):],
                                                         init.args.defaults, strict=True) if a.arg == "nargs"),
                     None) if init and init.args.defaults else None
        nargs = _value_or_text(kw["nargs"]) if "nargs" in kw else nargs
        raises = [r for r in ast.walk(call) if isinstance(r, ast.Raise)] if call else []
        if nargs == 0 and raises and ast.unparse(raises[0].exc).endswith("(self.help)"):
            return {"kind": "refused", "action": cls.name, "error": _last(raises[0].exc),
                    "message": _message(kw.get("help"))}
        # 0.5.18's DeprecatedAction: `if self.error_message is not None: parser.error(self.error_message)`
        errors = [c for c in ast.walk(call) if isinstance(c, ast.Call) and _last(c.func) == "error"
                  and c.args and ast.unparse(c.args[0]).startswith("self.")] if call else []
        said = ast.unparse(errors[0].args[0]).split(".", 1)[1] if errors else None
        if nargs == 0 and said in kw:
            return {"kind": "refused", "action": cls.name, "error": "parser.error", "message": _message(kw[said])}
        if nargs == 0:
            return {"kind": "flag", "action": cls.name}
        out = {"kind": TYPES.get(ast.unparse(kw["type"]), "str") if "type" in kw else "str", "action": cls.name}
        return out | ({"nargs": nargs} if nargs is not None else {})

    def type_facts(self, name: str, path: str) -> dict[str, Any]:
        """A type= function of the package: the ArgumentTypeError message it gives for a bad value (its only one,
        raised from an except), and the suffix pattern of human_readable_int."""
        try:
            _, fn = Values(self.source, path).lookup(path, name)
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

    def default(self, kw: dict[str, ast.AST], entry: dict[str, Any], path: str) -> dict[str, Any]:
        """The value argparse stores when the flag is absent: default=, else the action's (False for store_true),
        else None. `ServerArgs.x` (and 0.5.20's `_declared_default("x")`) reads the record's default; a default that
        is not a constant is left out."""
        node = kw.get("default")
        if node is None:
            return {"default": False} if entry["kind"] == "flag" and entry.get("action") != "store_false" else \
                {"default": True} if entry.get("action") == "store_false" else {"default": None}
        text = ast.unparse(node)
        named = text.split(".", 1)[1] if text.startswith("ServerArgs.") else node.args[0].value \
            if isinstance(node, ast.Call) and _last(node.func) == "_declared_default" and node.args \
            and isinstance(node.args[0], ast.Constant) else None
        if named is not None:
            if named not in self.defaults:
                return {}
            path, node = self.defaults[named]
        try:
            value = Values(self.source, path).value(node, {})
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
    method leaves it: its own rewrites (speculative_algorithm: upper-cased, aliases) are applied before the checks.
    Given the release's `source`, a call that hands the record to another function of the package is read in place
    (0.5.18's hooks split a handler into per-algorithm functions), and `algo.handle_server_args(server_args)` as
    SpeculativeAlgorithm's dispatch: each branch's `self.is_x()` as a test of the algorithm's name."""

    def __init__(self, path: str, fn: ast.FunctionDef, normalised: frozenset[str] = frozenset(),
                 assignments: list[dict[str, Any]] | None = None, source: Source | None = None):
        self.path, self.fn, self.normalised, self.source = path, fn, normalised, source
        self.records = _record_names(fn)
        self.reading: list[tuple[str, str]] = [(path, fn.name)]
        self.locals: dict[str, Any] = {}  # a local name -> what it holds, e.g. 0.5.18's `algo`
        self.assignments = [] if assignments is None else assignments  # each once; expressions name them ["set", i]
        self.state: dict[str, Any] = {}
        self.steps: list[dict[str, Any]] = []
        self.block(fn.body, [])

    def where(self, node: ast.AST) -> str:
        return _at(self.path, node, f"ServerArgs.{self.fn.name}" if self.path == SERVER_ARGS else self.fn.name)

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
            elif isinstance(st, ast.Expr) and isinstance(st.value, ast.Call) \
                    and _last(st.value.func) == "declare_resolution":
                self.declared(st, st.value, when)
            elif isinstance(st, ast.Expr) and isinstance(st.value, ast.Call) and self.source is not None \
                    and any(isinstance(a, ast.Name) and a.id in self.records for a in st.value.args):
                self.inline(st.value, when)
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
                field = _record_field(name, self.records)
                if isinstance(name, ast.Name):
                    self.local(name.id, value if isinstance(st, ast.Assign) and name is target else None, when)
                if field is None or field in self.normalised:
                    continue
                if isinstance(st, ast.AugAssign) or isinstance(target, ast.Tuple) or value is None:
                    new: Any = ["opaque", ast.unparse(value) if value is not None else ast.unparse(st)]
                else:
                    new = self.expr(value)
                self.assignments.append({"at": self.where(st), "field": field,
                                         "value": ["cond", ["and", *when], new, self.current(field)] if when else new})
                self.state[field] = ["set", len(self.assignments) - 1]

    def local(self, name: str, value: ast.AST | None, when: list[Any]) -> None:
        """A local name holds what it was given when that reads as data (0.5.18's `algo = None`, then
        `algo = SpeculativeAlgorithm.from_string(...)` under an `if`); anything else leaves it opaque."""
        new = self.expr(value) if value is not None else None
        if new is None or _opaque(new):
            self.locals.pop(name, None)
            return
        self.locals[name] = ["cond", ["and", *when], new, self.locals.get(name, ["opaque", name])] if when else new

    def inline(self, call: ast.Call, when: list[Any]) -> None:
        assert self.source is not None
        if _last(call.func) == "handle_server_args":
            enum = _class(self.source.tree(SPEC_INFO), "SpeculativeAlgorithm")
            method = _method(enum, "handle_server_args") if enum else None
            if enum is not None and method is not None:
                self.dispatch(enum, method, method.body, when)
            return
        if isinstance(call.func, ast.Name):
            self.enter(self.path, self.fn, call.func.id, when)

    def enter(self, path: str, caller: ast.FunctionDef, name: str, when: list[Any]) -> None:
        """Read the function `name` (as `caller`, in `path`, sees it) in place when the handler's own module has it
        (not the resolution machinery it calls), once per chain of calls."""
        assert self.source is not None
        found = _resolve_in(self.source, path, caller, name)
        if found is None or found[0] != self.reading[0][0] or (found[0], name) in self.reading \
                or len(self.reading) > 6:
            return
        saved = self.path, self.fn, self.records, self.locals
        self.path, self.fn = found
        self.records, self.locals = self.records | _record_names(self.fn), {}
        self.reading.append((self.path, name))
        try:
            self.block(self.fn.body, when)
        finally:
            self.reading.pop()
            self.path, self.fn, self.records, self.locals = saved

    def dispatch(self, enum: ast.ClassDef, method: ast.FunctionDef, body: list[ast.stmt], when: list[Any]) -> None:
        for st in body:
            if isinstance(st, ast.If):
                test = self.algorithm_test(enum, st.test)
                self.dispatch(enum, method, st.body, [*when, test])
                self.dispatch(enum, method, st.orelse, [*when, ["not", test]])
            elif isinstance(st, ast.Expr) and isinstance(st.value, ast.Call) and isinstance(st.value.func, ast.Name):
                self.enter(SPEC_INFO, method, st.value.func.id, when)

    def algorithm_test(self, enum: ast.ClassDef, node: ast.AST) -> Any:
        """`self.is_eagle()` of SpeculativeAlgorithm as a test of the algorithm's (normalised) name."""
        name = self.current("speculative_algorithm")
        if isinstance(node, ast.BoolOp):
            return ["and" if isinstance(node.op, ast.And) else "or",
                    *(self.algorithm_test(enum, v) for v in node.values)]
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
            return ["not", self.algorithm_test(enum, node.operand)]
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and ast.unparse(node.func.value) == \
                "self":
            method = _method(enum, node.func.attr)
            returned = next((st.value for st in method.body if isinstance(st, ast.Return)), None) if method else None
            if returned is not None:
                return self.algorithm_test(enum, returned)
        if isinstance(node, ast.Compare) and ast.unparse(node.left) == "self" and len(node.ops) == 1:
            members = [e.attr for e in getattr(node.comparators[0], "elts", [node.comparators[0]])
                       if isinstance(e, ast.Attribute)]
            op = {ast.Eq: "==", ast.NotEq: "!=", ast.In: "in", ast.NotIn: "not in"}.get(type(node.ops[0]))
            if op in ("==", "!=") and len(members) == 1:
                return ["cmp", op, name, ["const", members[0]]]
            if op in ("in", "not in") and members:
                return ["cmp", op, name, ["tuple", *(["const", m] for m in members)]]
        return ["opaque", ast.unparse(node)]

    def declared(self, st: ast.stmt, call: ast.Call, when: list[Any]) -> None:
        """0.5.18's hooks write a field as `declare_resolution(server_args, "hook", field=value)`; what the record's
        view reads afterwards is that value."""
        for kw in call.keywords:
            if kw.arg is None or kw.arg in self.normalised:
                continue
            new = self.expr(kw.value)
            self.assignments.append({"at": self.where(st), "field": kw.arg,
                                     "value": ["cond", ["and", *when], new, self.current(kw.arg)] if when else new})
            self.state[kw.arg] = ["set", len(self.assignments) - 1]

    def current(self, field: str) -> Any:
        return self.state.get(field, ["field", field])

    def expr(self, node: ast.AST) -> Any:
        field = _record_field(node, self.records)
        if field is not None:
            return self.current(field)
        if isinstance(node, ast.Name) and node.id in self.locals:
            return self.locals[node.id]
        if isinstance(node, ast.Call) and _last(node.func) == "isinstance" and len(node.args) == 2 \
                and _last(node.args[1]) == "CustomSpecAlgo" and self.source is not None:
            enum = _class(self.source.tree(SPEC_INFO), "SpeculativeAlgorithm")  # a built-in name is not a plugin's
            members = [ast.unparse(st.targets[0]) for st in enum.body if isinstance(st, ast.Assign)] if enum else []
            return ["cmp", "not in", self.current("speculative_algorithm"), ["tuple", *(["const", m] for m in members)]]
        if isinstance(node, ast.Call) and _last(node.func) == "from_string" and len(node.args) == 1:
            return self.expr(node.args[0])  # SpeculativeAlgorithm.from_string(name): None only for None
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Call) \
                and _last(node.value.func) in ("resolving_view", "resolved_view") \
                and any(isinstance(a, ast.Name) and a.id in self.records for a in node.value.args):
            return self.current(node.attr)
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


def _opaque(tree: Any) -> bool:
    return isinstance(tree, list) and bool(tree) and (tree[0] == "opaque" or any(_opaque(t) for t in tree[1:]))


def _record_names(fn: ast.FunctionDef) -> set[str]:
    """The names a method or hook reads the record's fields through: `self`; a hook's `server_args` parameter; and
    (0.5.18 and later) `cfg = resolving_view(server_args)`."""
    names = {"self", *(a.arg for a in fn.args.args if a.arg == "server_args"
                       or a.annotation is not None and "ServerArgs" in ast.unparse(a.annotation))}
    names |= {t.id for st in ast.walk(fn) if isinstance(st, ast.Assign) and isinstance(st.value, ast.Call)
              and _last(st.value.func) in ("resolving_view", "resolved_view") for t in st.targets
              if isinstance(t, ast.Name)}
    return names


def _resolve_in(source: Source, path: str, fn: ast.FunctionDef, name: str) -> tuple[str, ast.FunctionDef] | None:
    """The function a name means inside `fn`: imported in its body, or the module's own or imported."""
    for st in ast.walk(fn):
        if isinstance(st, ast.ImportFrom) and st.module and not st.level \
                and any((a.asname or a.name) == name for a in st.names):
            other = source.module_path(st.module)
            real = next(a.name for a in st.names if (a.asname or a.name) == name)
            found = _function(source.tree(other), real) if other else None
            return (other, found) if other and found else None
    try:
        where, found = Values(source, path).lookup(path, name)
    except Unresolved:
        return None
    return (where, found) if isinstance(found, ast.FunctionDef) else None


def _record_field(node: ast.AST, records: set[str]) -> str | None:
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in records:
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
    """--speculative-algorithm's names and aliases, and the checks of the handler: ServerArgs'
    _handle_speculative_decoding, or from 0.5.18 arg_groups/speculative_hook.py's handle_speculative_decoding."""
    path, tree = SERVER_ARGS, source.tree(SERVER_ARGS)
    handler = _method(server_args, SPECULATIVE_HANDLER)
    if handler is None:
        path, tree = SPECULATIVE_HOOK, source.tree(SPECULATIVE_HOOK)
        handler = _function(tree, SPECULATIVE_HANDLER.lstrip("_"))
    if handler is None or tree is None:
        raise SystemExit(f"neither ServerArgs.{SPECULATIVE_HANDLER} nor python/{SPECULATIVE_HOOK}: "
                         f"{SPECULATIVE_HANDLER.lstrip('_')} was found")
    aliases = alias_functions(tree)
    checks = Checks(path, handler, frozenset({"speculative_algorithm"}), source=source)
    flag = flags.get("--speculative-algorithm", {})
    out: dict[str, Any] = {"flag": "--speculative-algorithm", "evidence": checks.where(handler)}
    upper = any(isinstance(n, ast.Call) and _last(n.func) == "upper"
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
            out["alias_conditional"] = _at(path, fn, f"{fn_name}: other rewrites depend on the draft "
                                                                      "model's config (not read here)")
    for st in ast.walk(handler):  # if self.speculative_algorithm == "NEXTN": ... = "EAGLE"
        if isinstance(st, ast.If) and isinstance(st.test, ast.Compare) \
                and ast.unparse(st.test.left) == "self.speculative_algorithm" and isinstance(st.test.ops[0], ast.Eq):
            for inner in st.body:
                if isinstance(inner, ast.Assign) and ast.unparse(inner.targets[0]) == "self.speculative_algorithm" \
                        and isinstance(inner.value, ast.Constant):
                    alias_table[st.test.comparators[0].value] = inner.value.value
    out["aliases"] = alias_table
    assignments = checks.assignments
    steps = [s for s in checks.steps
             if s["kind"] != "test" or _fields_of(s["test"], assignments) & _spec_fields(flags)]
    used = _used_assignments(steps, assignments)
    renumber = {old: new for new, old in enumerate(used)}
    out["checks"] = _renumbered(steps, renumber)
    out["assignments"] = _renumbered([assignments[i] for i in used], renumber)
    return out


def _spec_fields(flags: dict[str, dict[str, Any]]) -> set[str]:
    return {spec["field"] for spec in flags.values() if spec.get("field", "").startswith("speculative_")}


def multi_node(source: Source, server_args: ast.ClassDef, flags: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The multi-node flags (by their canonical option string) and every check that names nnodes, node_rank or
    dist_init_addr, in a ServerArgs method or (0.5.18 and later) in a function of arg_groups/ that reads the record,
    each function read on its own."""
    canonical = {name: key for key, spec in flags.items() for name in [key, *spec.get("aliases", [])]}
    checks: list[dict[str, Any]] = []
    assignments: list[dict[str, Any]] = []
    functions = [(SERVER_ARGS, n) for n in server_args.body if isinstance(n, ast.FunctionDef)]
    for path in source.modules(ARG_GROUPS):
        functions += [(path, n) for n in (source.tree(path) or ast.Module(body=[], type_ignores=[])).body
                      if isinstance(n, ast.FunctionDef) and _record_names(n) - {"self"}]
    for path, fn in functions:
        for step in Checks(path, fn, assignments=assignments).steps:
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
        called = [f for c in (ast.walk(getter) if getter else []) if isinstance(c, ast.Call)
                  and isinstance(c.func, ast.Name) and (f := _function(utils, c.func.id)) is not None]
        spellings = sorted({c.value for fn in ([getter] if getter else []) + called for n in ast.walk(fn)
                            if isinstance(n, (ast.Compare, ast.Call)) for c in ast.walk(n)
                            if isinstance(c, ast.Constant) and isinstance(c.value, str)
                            and c.value.startswith("--model")})
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
    renamed = _function(tree, "_convert_SGL_to_SGLANG") or next(
        (fn for fn in (tree.body if tree else []) if isinstance(fn, ast.FunctionDef) and any(
            isinstance(c, ast.Call) and _last(c.func) == "replace" and len(c.args) >= 2
            and [ast.unparse(a) for a in c.args[:2]] == ["'SGL_'", "'SGLANG_'"] for c in ast.walk(fn))), None)
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
