#!/usr/bin/env python3
"""Write sparkctl/knowledge/trtllm_releases.json from TensorRT-LLM's own source, release by release.

    scripts/trtllm_knowledge.py --repo ~/src/TensorRT-LLM --release 1.2.0rc6=v1.2.0rc6 \
        --release 1.3.0rc12=v1.3.0rc12 [--out sparkctl/knowledge/trtllm_releases.json]

For each release it reads, with `git show <ref>:<path>` (never importing TensorRT-LLM), the PyTorch LLM args
(`tensorrt_llm/llmapi/llm_args.py`: TorchLlmArgs and its bases), the nested models sparkctl checks (the classes the
fields name, followed into the files llm_args.py imports them from), the speculative `decoding_type` tags (the
`Literal[...]` of each DecodingBaseConfig subclass in the `SpeculativeConfig` union, or the name table of releases
that resolve the tag through one) and the `trtllm-serve serve` CLI flags (`tensorrt_llm/commands/serve.py`). Each
release records the commit and the blob of every file read. Releases already in --out and not named are kept.

Where no checkout of a release can be had, the files may be excerpts of the real source (class statements, bases and
field annotations verbatim, e.g. transcribed from the release's rendered source on nvidia.github.io) committed to a
scratch repository; `--describe VERSION=provenance.json` then records where they came from (the upstream commit, the
pages read, how) instead of the scratch commit, and may carry the `serve` flags read from the release's CLI reference.
"""

from __future__ import annotations

import argparse
import ast
import json
import re
import subprocess
import sys
from pathlib import Path

ARGS_FILE = "tensorrt_llm/llmapi/llm_args.py"
SERVE_FILE = "tensorrt_llm/commands/serve.py"
#: top-level field -> the nested model sparkctl checks inside
SECTIONS = ("kv_cache_config", "cuda_graph_config", "moe_config", "scheduler_config", "attention_dp_config")
#: where releases before the 1.3 tagged union resolve speculative_config.decoding_type (a dict literal in this method)
NAME_TABLE = ("DecodingBaseConfig", "from_dict", "config_classes")
_CHEAP = {"bool": "bool", "int": "int", "StrictInt": "int", "PositiveInt": "int", "NonNegativeInt": "int",
          "float": "float", "NonNegativeFloat": "float", "str": "str", "List": "list", "list": "list",
          "Set": "list", "Dict": "dict", "dict": "dict"}


class Source:
    """Files of one ref of a git checkout."""

    def __init__(self, repo: Path, ref: str):
        self.repo, self.ref = repo, ref
        self.commit = self._git("rev-parse", f"{ref}^{{commit}}").strip()
        self.read: dict[str, str] = {}

    def _git(self, *args: str) -> str:
        return subprocess.run(["git", "-C", str(self.repo), *args], check=True, capture_output=True,
                              text=True).stdout

    def text(self, path: str) -> str | None:
        try:
            out = self._git("show", f"{self.commit}:{path}")
        except subprocess.CalledProcessError:
            return None
        self.read[path] = self._git("rev-parse", f"{self.commit}:{path}").strip()
        return out


class Module:
    """The pydantic classes of one file: name -> (bases, [(field, annotation, alias names)])."""

    def __init__(self, source: Source, path: str):
        tree = ast.parse(source.text(path) or "")
        self.path, self.source = path, source
        self.classes: dict[str, ast.ClassDef] = {n.name: n for n in tree.body if isinstance(n, ast.ClassDef)}
        self.aliases: dict[str, ast.expr] = {}
        self.imports: dict[str, str] = {}
        for node in tree.body:
            if isinstance(node, (ast.Assign, ast.AnnAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                for target in targets:
                    if isinstance(target, ast.Name) and node.value is not None:
                        self.aliases[target.id] = node.value
            elif isinstance(node, ast.ImportFrom) and node.module:
                for name in node.names:
                    self.imports[name.asname or name.name] = _module_path(path, node.module, node.level)


def _module_path(path: str, module: str, level: int) -> str:
    parts = path.split("/")[:-1]
    if level:
        parts = parts[: len(parts) - level + 1]
        return "/".join([*parts, *module.split(".")]) + ".py"
    return module.replace(".", "/") + ".py"


def fields_of(module: Module, name: str, seen: set[str] | None = None) -> dict[str, str]:
    """Every input key of a pydantic class (bases first, private attributes and ClassVars left out)."""
    seen = seen or set()
    if name in seen:
        return {}
    seen.add(name)
    cls = module.classes.get(name)
    if cls is None:
        other = module.imports.get(name)
        if other and module.source.text(other) is not None:
            return fields_of(Module(module.source, other), name, seen)
        return {}
    out: dict[str, str] = {}
    for base in cls.bases:
        if isinstance(base, ast.Name):
            out.update(fields_of(module, base.id, seen))
    for node in cls.body:
        if not (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)):
            continue
        key = node.target.id
        if key.startswith("_") or key == "model_config" or "ClassVar" in ast.unparse(node.annotation):
            continue
        for input_key in _input_keys(key, node.value):
            out[input_key] = cheap_type(node.annotation, module)
    return out


def _input_keys(key: str, value: ast.expr | None) -> list[str]:
    """The keys a field accepts: its name, or its alias / AliasChoices."""
    if isinstance(value, ast.Call):
        for kw in value.keywords:
            if kw.arg == "alias" and isinstance(kw.value, ast.Constant):
                return [kw.value.value]
            if kw.arg == "validation_alias" and isinstance(kw.value, ast.Call):
                return [a.value for a in kw.value.args if isinstance(a, ast.Constant)]
    return [key]


def cheap_type(annotation: ast.expr, module: Module | None = None) -> str:
    """bool, int, float, str, list, dict or any: what a YAML value must be for the annotation, where that is cheap to
    say (Optional and Annotated unwrapped; a Literal of strings is a str; a nested model is a dict)."""
    while isinstance(annotation, ast.Subscript) and ast.unparse(annotation.value) in ("Optional", "Annotated"):
        inner = annotation.slice
        annotation = inner.elts[0] if isinstance(inner, ast.Tuple) else inner
    head = ast.unparse(annotation.value if isinstance(annotation, ast.Subscript) else annotation)
    if head == "Literal":
        values = annotation.slice.elts if isinstance(annotation.slice, ast.Tuple) else [annotation.slice]
        if all(isinstance(v, ast.Constant) and isinstance(v.value, str) for v in values):
            return "str"
    if module is not None and isinstance(annotation, ast.Name) and annotation.id in module.classes \
            and fields_of(module, annotation.id):
        return "dict"
    return _CHEAP.get(head, "any")


def speculative_tags(module: Module) -> tuple[dict[str, dict[str, str]], dict[str, str]]:
    """decoding_type tag -> keys of its config; and the aliases a release maps to a tag.

    Two shapes exist. The 1.3 sources make speculative_config a union tagged by a `decoding_type: Literal[...]` field
    on each member. Earlier releases give each config a ClassVar name and resolve the tag through a name table in
    DecodingBaseConfig.from_dict (the YAML loader calls it), which pops decoding_type: there the table's keys are the
    accepted tags, whatever the ClassVar says."""
    table = _name_table(module)
    if table:
        return {tag: {**fields_of(module, cls), "decoding_type": "str"} for tag, cls in table.items()}, {}
    tags: dict[str, dict[str, str]] = {}
    for name, cls in module.classes.items():
        for node in cls.body:
            target = node.target.id if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) else None
            if target == "decoding_type" and isinstance(node.annotation, ast.Subscript) \
                    and ast.unparse(node.annotation.value) == "Literal":
                tag = ast.literal_eval(node.annotation.slice)
                tags[tag] = fields_of(module, name)
    union = module.aliases.get("SpeculativeConfig")
    if union is not None:  # the union's members, in its order (pydantic lists the expected tags in that order)
        members = [n.id for n in ast.walk(union) if isinstance(n, ast.Name)]
        order = [tag for tag in (_class_tag(module, m) for m in members) if tag in tags]
        tags = {tag: tags[tag] for tag in dict.fromkeys(order)} or tags
    return tags, {}


def _name_table(module: Module) -> dict[str, str]:
    """`config_classes = {"Tag": SomeDecodingConfig, ...}` in DecodingBaseConfig.from_dict, if the release has one."""
    cls_name, method, variable = NAME_TABLE
    cls = module.classes.get(cls_name)
    for node in cls.body if cls else []:
        if isinstance(node, ast.FunctionDef) and node.name == method:
            for stmt in ast.walk(node):
                if isinstance(stmt, ast.Assign) and any(isinstance(t, ast.Name) and t.id == variable
                                                        for t in stmt.targets) and isinstance(stmt.value, ast.Dict):
                    return {k.value: v.id for k, v in zip(stmt.value.keys, stmt.value.values, strict=True)
                            if isinstance(k, ast.Constant) and isinstance(v, ast.Name)}
    return {}


def _class_tag(module: Module, name: str) -> str | None:
    cls = module.classes.get(name)
    for node in cls.body if cls else []:
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.target.id == "decoding_type" \
                and isinstance(node.annotation, ast.Subscript):
            return ast.literal_eval(node.annotation.slice)
    return None


def serve_flags(text: str) -> list[str]:
    """The option names of the `serve` click command."""
    tree = ast.parse(text)
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name == "serve":
            flags = []
            for deco in node.decorator_list:
                if isinstance(deco, ast.Call) and ast.unparse(deco.func).endswith("option"):
                    flags += [a.value for a in deco.args if isinstance(a, ast.Constant)
                              and str(a.value).startswith("--")]
            return flags
    return []


def release_entry(source: Source, describe: dict | None = None) -> dict:
    module = Module(source, ARGS_FILE)
    top = fields_of(module, "TorchLlmArgs")
    sections = {}
    for field in top:
        if field == "speculative_config":
            continue
        model = _model_name(module, _field_annotation(module, "TorchLlmArgs", field))
        keys = fields_of(module, model) if model else {}
        if keys:
            sections[field] = keys
    tags, aliases = speculative_tags(module)
    serve_text = source.text(SERVE_FILE)
    flags = serve_flags(serve_text) if serve_text else list((describe or {}).get("serve_flags", []))
    described = {k: v for k, v in (describe or {}).items() if k != "serve_flags"}
    return {
        "source": {"repo": "NVIDIA/TensorRT-LLM", "ref": source.ref, "commit": source.commit,
                   "files": dict(sorted(source.read.items())), "method": "generated",
                   "note": "generated by scripts/trtllm_knowledge.py from the files listed (path: git blob)",
                   **described},
        "top_level": top, "sections": dict(sorted(sections.items())),
        "speculative": {"tags": tags, "aliases": aliases, "tag_field": "decoding_type"},
        "removed_keys": {}, "serve_flags": flags,
    }


def _field_annotation(module: Module, cls_name: str, field: str) -> ast.expr | None:
    cls = module.classes.get(cls_name)
    if cls is None:
        return None
    for node in cls.body:
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.target.id == field:
            return node.annotation
    for base in cls.bases:
        if isinstance(base, ast.Name):
            found = _field_annotation(module, base.id, field)
            if found is not None:
                return found
    return None


def _model_name(module: Module, annotation: ast.expr | None) -> str | None:
    """The first class (directly, or through a type alias such as CudaGraphConfigType) the annotation names."""
    if annotation is None:
        return None
    for node in ast.walk(annotation):
        if isinstance(node, ast.Name):
            if node.id in module.classes:
                return node.id
            alias = module.aliases.get(node.id)
            if isinstance(alias, ast.Name) and alias.id in module.classes:
                return alias.id
            if alias is not None and node.id.endswith("Type"):
                return _model_name(module, alias)
            if node.id in module.imports and node.id.endswith("Config"):
                return node.id  # a config model kept in another file (fields_of follows the import)
    return None


def _version_key(version: str) -> tuple:
    """1.3.0rc11 before 1.3.0rc12 before 1.3.0: releases in the order sparkctl compares them."""
    m = re.match(r"^(\d+)\.(\d+)\.(\d+)(?:\.?(rc|a|b|dev|post)\.?(\d+))?", version)
    if not m:
        return (1 << 30,)
    stage = {"dev": 0, "a": 1, "b": 2, "rc": 3, None: 4, "post": 5}[m[4]]
    return (int(m[1]), int(m[2]), int(m[3]), stage, int(m[5] or 0))


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repo", required=True, type=Path, help="a git checkout of NVIDIA/TensorRT-LLM")
    parser.add_argument("--release", action="append", required=True, metavar="VERSION=REF")
    parser.add_argument("--describe", action="append", default=[], metavar="VERSION=FILE.json",
                        help="provenance to record for a release read from excerpts (replaces commit/files/method)")
    parser.add_argument("--out", type=Path,
                        default=Path(__file__).resolve().parents[1] / "sparkctl/knowledge/trtllm_releases.json")
    args = parser.parse_args(argv)
    data = json.loads(args.out.read_text()) if args.out.exists() else {"format": 1, "releases": {}}
    described = {v: json.loads(Path(f).read_text()) for v, _, f in (d.partition("=") for d in args.describe)}
    for item in args.release:
        version, _, ref = item.partition("=")
        data["releases"][version] = release_entry(Source(args.repo, ref or f"v{version}"), described.get(version))
        print(f"{version}: {len(data['releases'][version]['top_level'])} top-level keys", file=sys.stderr)
    data["releases"] = dict(sorted(data["releases"].items(), key=lambda item: _version_key(item[0])))
    args.out.write_text(json.dumps(data, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
