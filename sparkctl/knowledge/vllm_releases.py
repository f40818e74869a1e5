"""What each vLLM release's `vllm serve` accepts, and a check of flags and of a `--config` mapping against it.

The data is `vllm_releases.json` beside this module, written by `scripts/vllm_knowledge.py` from vLLM's own source
of each release (the PyPI sdist of the tag: `vllm/engine/arg_utils.py`, `vllm/entrypoints/openai/cli_args.py`,
`vllm/entrypoints/cli/serve.py`, the config dataclasses, `vllm/envs.py`); each release records its source (commit
id, the sdist's sha256, the sha256 of every file read). The lab's `vllm` stand-in reads the same file, so sparkctl
and the stand-in judge flags alike.

The release of an image comes from NVIDIA's tag map (NGC `nvcr.io/nvidia/vllm:<YY.MM>-py3`, from NVIDIA's vLLM
release notes) or a version tag (`vllm/vllm-openai:v0.20.1`); a release not in the data is judged against the
nearest known one, and says so.
"""

from __future__ import annotations

import difflib
import json
import re
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

DATA_PATH = Path(__file__).with_name("vllm_releases.json")
_VERSION = re.compile(r"^v?(\d+)\.(\d+)\.(\d+)(?:[.+-].*)?$")
_SCALAR_KINDS = {"int": (int,), "float": (int, float), "str": (str,)}


@dataclass(frozen=True, order=True)
class VllmVersion:
    major: int
    minor: int
    patch: int

    @classmethod
    def parse(cls, text: str) -> VllmVersion | None:
        m = _VERSION.match(text.strip())
        return cls(int(m[1]), int(m[2]), int(m[3])) if m else None

    def __str__(self) -> str:
        return f"{self.major}.{self.minor}.{self.patch}"


@cache
def _data() -> dict:
    return json.loads(DATA_PATH.read_text())


def image_tags() -> dict[str, str]:
    """NGC image -> the vLLM version it ships (NVIDIA's vLLM release notes)."""
    return dict(_data()["images"]["tags"])


def release_of(image: str | None) -> VllmVersion | None:
    """The vLLM release of an image: NVIDIA's tag map first, else a version tag (`...:v0.20.1`)."""
    if not image:
        return None
    bare = image.split("@", 1)[0]
    known = image_tags().get(bare)
    if known:
        return VllmVersion.parse(known)
    if ":" in bare.rsplit("/", 1)[-1]:
        return VllmVersion.parse(bare.rsplit(":", 1)[1])
    return None


def known_releases() -> list[VllmVersion]:
    return sorted(v for v in (VllmVersion.parse(k) for k in _data()["releases"]) if v is not None)


@dataclass(frozen=True)
class Problem:
    """One flag or key the release would refuse (or, where the release ignores it, would silently lose)."""

    where: tuple[str | int, ...]  # ("args", 3) | ("config", "speculative-config", "methd")
    message: str
    hint: str = ""


@dataclass(frozen=True)
class VllmSchema:
    """One release's `vllm serve`: its flags, speculative config, multi-node launch, env, metrics."""

    version: VllmVersion
    raw: dict

    @property
    def flags(self) -> dict[str, dict[str, Any]]:
        return self.raw["serve_flags"]

    @property
    def source(self) -> dict:
        return self.raw["source"]

    @property
    def env(self) -> list[str]:
        return self.raw["env"]

    @property
    def metrics(self) -> dict[str, str]:
        return self.raw["metrics"]

    @property
    def speculative(self) -> dict[str, Any]:
        return self.raw["speculative_config"]

    @property
    def multi_node(self) -> dict[str, Any]:
        return self.raw["multi_node"]

    @property
    def has_nnodes(self) -> bool:
        """The release launches one process per node itself (--nnodes/--node-rank/--master-addr)."""
        return bool(self.multi_node.get("nnodes_flags"))

    def canonical(self, spelled: str) -> str | None:
        """The flag `spelled` names (its --long form), through vLLM's spellings: `--a_b` for `--a-b`, aliases,
        and (argparse's allow_abbrev, which vLLM leaves on) a unique prefix of a long flag."""
        name = spelled.split("=", 1)[0]
        if name.startswith("--") and self.raw.get("parser", {}).get("underscores", True):
            name = "--" + name[2:].replace("_", "-")
        if name in self.flags and not self.flags[name].get("positional"):
            return name
        alias = next((flag for flag, spec in self.flags.items() if name in spec.get("aliases", ())), None)
        if alias or not name.startswith("--") or not self.raw.get("parser", {}).get("abbrev", False):
            return alias
        matches = self.abbreviated(name)
        return matches[0] if len(matches) == 1 else None

    def abbreviated(self, name: str) -> list[str]:
        """The long flags `name` is a prefix of (argparse takes a unique one; more than one is ambiguous)."""
        return sorted(flag for flag in self.flags if flag.startswith(name) and flag.startswith("--"))

    def removed_since(self, flag: str) -> VllmVersion | None:
        """The latest known earlier release that still had `flag` (the flag is gone from this one)."""
        older = [v for v in known_releases() if v < self.version and flag in _releases()[str(v)]["serve_flags"]]
        return older[-1] if older else None

    def env_read_until(self, name: str) -> VllmVersion | None:
        """The latest known earlier release that still read the variable `name` (this one does not)."""
        older = [v for v in known_releases() if v < self.version and name in _releases()[str(v)]["env"]]
        return older[-1] if older else None

    def unknown_flag(self, where: tuple[str | int, ...], flag: str) -> Problem:
        if flag.startswith("--"):
            dashed = "--" + flag[2:].replace("_", "-")
            several = self.abbreviated(dashed)
            if len(several) > 1:
                return Problem(where, f"{flag} is ambiguous in vLLM {self.version}: it could be "
                               + ", ".join(several), "write the whole flag")
            flag = dashed
        had = self.removed_since(flag)
        if had is not None:
            return Problem(where, f"{flag} is gone from vLLM {self.version} (vLLM {had} had it)",
                           "remove it; the release notes say what replaced it")
        close = difflib.get_close_matches(flag, list(self.flags), n=1, cutoff=0.75)
        return Problem(where, f"vLLM {self.version} has no flag {flag}",
                       f"did you mean {close[0]}?" if close else "`vllm serve --help` lists them")

    def check_args(self, argv: list[str], owned: dict[str, str]) -> list[Problem]:
        """Problems of extra `vllm serve` flags, each at its index in argv. `owned`: flag -> the inventory field
        that sets it (sparkctl writes those itself)."""
        out: list[Problem] = []
        i = 0
        while i < len(argv):
            token = argv[i]
            where: tuple[str | int, ...] = ("args", i)
            i += 1
            if not token.startswith("-"):
                out.append(Problem(where, f"{token!r} is not a flag (each value follows its --flag)"))
                continue
            name, eq, inline = token.partition("=")
            shorthand = self.raw.get("parser", {}).get("o_shorthand_to")
            if shorthand and name.startswith("-O") and not name.startswith("--"):
                continue  # -O3 / -O.level=3: vLLM rewrites it to its optimisation flag before argparse sees it
            negated = name.startswith("--no-") and self.canonical("--" + name[5:]) is not None
            flag = self.canonical("--" + name[5:]) if negated else self.canonical(name)
            dotted = None
            if flag is None and "." in name and self.raw.get("parser", {}).get("dotted_json", False):
                base, _, dotted = name.partition(".")
                flag = self.canonical(base)
            if flag is None:
                out.append(self.unknown_flag(where, name))
                while not eq and i < len(argv) and not argv[i].startswith("-"):
                    i += 1  # its values: said once, with the flag
                continue
            if flag in owned or dotted and f"{flag}.{dotted}" in owned:
                flag = flag if flag in owned else f"{flag}.{dotted}"
                out.append(Problem(where, f"{flag} is sparkctl's to set", f"use {owned[flag]}"))
                flag = flag.split(".", 1)[0]
            spec = self.flags[flag]
            kind = spec["kind"]
            if negated and kind != "bool":
                out.append(self.unknown_flag(where, name))
                continue
            if kind in ("bool", "flag"):
                if eq:
                    out.append(Problem(where, f"{flag} takes no value (write {flag} or --no-{flag[2:]})"
                                       if kind == "bool" else f"{flag} takes no value"))
                continue
            values: list[str]
            if eq:
                values = [inline]
            else:
                values = []
                while i < len(argv) and not (argv[i].startswith("-") and len(argv[i]) > 1
                                             and not _number(argv[i])):
                    values.append(argv[i])
                    i += 1
                    if kind != "list":
                        break
            if not values:
                if spec.get("nargs") not in ("?", "*"):
                    out.append(Problem(where, f"{flag} needs a value"))
                continue
            if dotted is None:
                out.extend(self._value_problems(where, flag, spec, values))
        return out

    def check_config(self, config: dict[str, Any], owned: dict[str, str]) -> list[Problem]:
        """Problems of a `--config` mapping (flag names without dashes) at every depth."""
        out: list[Problem] = []
        for key, value in config.items():
            where: tuple[str | int, ...] = ("config", key)
            flag = self.canonical(f"--{key}")
            if flag is None:
                problem = self.unknown_flag(where, f"--{key}")
                out.append(Problem(where, problem.message.replace(f"--{key}", key), problem.hint))
                continue
            if flag in owned:
                out.append(Problem(where, f"{key} is sparkctl's to set", f"use {owned[flag]}"))
                continue
            spec = self.flags[flag]
            if flag == "--speculative-config" and isinstance(value, dict):
                out.extend(self.check_speculative(where, value))
                out.extend(Problem((*where, key), f"{flag[2:]}.{key} is sparkctl's to set",
                                   f"use {owned[f'{flag}.{key}']}") for key in value if f"{flag}.{key}" in owned)
            elif spec["kind"] in ("bool", "flag"):
                if not isinstance(value, bool):
                    out.append(Problem(where, f"{key} is true or false"))
            elif spec["kind"] in ("json", "json_or_str"):
                continue  # a YAML mapping or list is its JSON; vLLM's own model checks the contents
            else:
                values = value if isinstance(value, list) else [value]
                out.extend(self._value_problems(where, flag, spec, [_plain(v) for v in values]))
        return out

    def check_speculative(self, where: tuple[str | int, ...], config: dict[str, Any]) -> list[Problem]:
        spec = self.speculative
        out: list[Problem] = []
        for key in config:
            if key not in spec["fields"]:
                close = difflib.get_close_matches(str(key), list(spec["fields"]), n=1)
                verdict = ("refuses it" if spec["unknown_keys"] == "refused"
                           else "would ignore it without a word (it would have no effect)")
                out.append(Problem((*where, key), f"vLLM {self.version}'s speculative config has no {key}: the "
                                   f"release {verdict}", f"did you mean {close[0]}?" if close else ""))
        method = config.get("method")
        if method is not None and method not in spec["methods"]:
            close = difflib.get_close_matches(str(method), spec["methods"], n=1)
            out.append(Problem((*where, "method"), f"vLLM {self.version} has no speculative method {method!r}",
                               f"did you mean {close[0]!r}?" if close else "methods: " + ", ".join(spec["methods"])))
        return out

    def _value_problems(self, where: tuple[str | int, ...], flag: str, spec: dict[str, Any],
                        values: list[str]) -> list[Problem]:
        kind = spec["kind"] if spec["kind"] != "list" else spec.get("item", "str")
        choices = [str(c) for c in spec.get("choices", ())]
        out = []
        for value in values:
            if spec.get("optional") and value == "None":
                continue
            if choices and value not in choices:
                close = difflib.get_close_matches(value, choices, n=1)
                out.append(Problem(where, f"{flag}: {value!r} is not one of vLLM {self.version}'s choices ("
                                   + ", ".join(choices) + ")", f"did you mean {close[0]!r}?" if close else ""))
            elif kind == "int" and not (_parses(value, int) or spec.get("human_readable") and _human(value)):
                out.append(Problem(where, f"{flag}: {value!r} is not an integer"))
            elif kind == "float" and not _parses(value, float):
                out.append(Problem(where, f"{flag}: {value!r} is not a number"))
            elif kind == "json" and not _json(value):
                out.append(Problem(where, f"{flag}: not JSON (write it as '{{\"key\": value}}')"))
        return out


def _number(token: str) -> bool:
    return _parses(token, float)


def _parses(value: str, kind: type) -> bool:
    try:
        kind(value)
    except ValueError:
        return False
    return True


def _json(value: str) -> bool:
    try:
        json.loads(value)
    except ValueError:
        return False
    return True


_HUMAN = re.compile(r"-?\d+(\.\d+)?[kKmMgGtT]?\Z")


def _human(value: str) -> bool:
    """vLLM's human_readable_int(_or_auto): 32k, 1.5M, 2G (binary with an upper-case letter), auto, -1."""
    return value == "auto" or bool(_HUMAN.match(value))


def _plain(value: Any) -> str:
    """A YAML scalar as the flag's text (vLLM turns --config keys into `--key value`)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


@cache
def _releases() -> dict[str, dict]:
    return _data()["releases"]


def schema_for(version: VllmVersion) -> VllmSchema:
    """The release's own data, else the nearest earlier known release's (else the earliest known)."""
    known = known_releases()
    chosen = max((v for v in known if v <= version), default=known[0])
    return VllmSchema(chosen, _releases()[str(chosen)])


def judged_note(version: VllmVersion, schema: VllmSchema) -> str:
    """Said beside a problem when the release is judged by another one's data."""
    return "" if schema.version == version else f"vLLM {version} is not in sparkctl's data: judged as {schema.version}"


def json_flags() -> frozenset[str]:
    """Flags (dashed, without the leading --) that take a JSON object in any known release."""
    return frozenset(flag[2:] for release in _releases().values() for flag, spec in release["serve_flags"].items()
                     if spec["kind"] == "json")
