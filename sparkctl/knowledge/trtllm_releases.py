"""What each TensorRT-LLM release's `trtllm-serve` accepts, and a check of a config against it at every depth.

The data is `trtllm_releases.json` beside this module, in the format `scripts/trtllm_knowledge.py` writes from
TensorRT-LLM's own `tensorrt_llm/llmapi/llm_args.py` and `tensorrt_llm/commands/serve.py`; each release records its
source (commit, files) and how it was obtained. The lab's `trtllm-serve` stand-in reads the same file, so sparkctl
and the stand-in judge a config alike.

The args model forbids unknown keys at every depth (pydantic extra="forbid"), so a key a release does not have is
a hard error at launch, minutes into loading. The release is read from the image's
`com.nvidia.tensorrt-llm.version` label, else from its tag; a release not in the data is judged against the
nearest known one, and says so.
"""

from __future__ import annotations

import difflib
import json
import re
from dataclasses import dataclass
from functools import cache, total_ordering
from pathlib import Path
from typing import Any

VERSION_LABEL = "com.nvidia.tensorrt-llm.version"
DATA_PATH = Path(__file__).with_name("trtllm_releases.json")

_VERSION = re.compile(r"^v?(\d+)\.(\d+)\.(\d+)(?:\.?(rc|a|b|dev|post)\.?(\d+))?(?:\.post\d+)?$")
# A pre-release sorts before its final release; post after it.
_STAGE_ORDER = {"dev": 0, "a": 1, "b": 2, "rc": 3, None: 4, "post": 5}
_TYPES: dict[str, tuple[type, ...]] = {"bool": (bool,), "int": (int,), "float": (int, float), "str": (str,),
                                       "list": (list,), "dict": (dict,)}
_TYPE_WORDS = {"bool": "a valid boolean", "int": "a valid integer", "float": "a valid number",
               "str": "a valid string", "list": "a valid list", "dict": "a valid dictionary"}


@total_ordering
@dataclass(frozen=True)
class Release:
    major: int
    minor: int
    patch: int
    stage: str | None = None  # rc, a, b, dev, post; None: the final release
    number: int = 0

    @classmethod
    def parse(cls, text: str) -> Release | None:
        m = _VERSION.match(text.strip())
        if not m:
            return None
        return cls(int(m[1]), int(m[2]), int(m[3]), m[4], int(m[5] or 0))

    def _key(self) -> tuple:
        return (self.major, self.minor, self.patch, _STAGE_ORDER[self.stage], self.number)

    def __lt__(self, other: Release) -> bool:
        return self._key() < other._key()

    def __str__(self) -> str:
        return f"{self.major}.{self.minor}.{self.patch}" + (f"{self.stage}{self.number}" if self.stage else "")


def release_of(image: str | None, labels: dict[str, str] | None = None) -> Release | None:
    """The TensorRT-LLM release of an image: its version label first, else the tag (`...release:1.3.0rc12`)."""
    label = (labels or {}).get(VERSION_LABEL)
    if label:
        found = Release.parse(label)
        if found:
            return found
    if image and ":" in image.rsplit("/", 1)[-1]:
        return Release.parse(image.rsplit(":", 1)[1].split("@", 1)[0])
    return None


@dataclass(frozen=True)
class ConfigProblem:
    """One key the release would refuse: where (path of keys), what pydantic would say, and what it accepts."""

    path: tuple[str, ...]
    message: str          # pydantic's words: "Extra inputs are not permitted", "Input should be a valid integer", ...
    kind: str             # pydantic's error type: extra_forbidden, union_tag_invalid, int_type, value_error
    value: Any
    hint: str = ""        # did you mean / what the release accepts

    def dotted(self) -> str:
        return ".".join(self.path)


@dataclass(frozen=True)
class ReleaseSchema:
    """One release's accepted keys: top level, nested sections, speculative tags, removed keys, CLI flags."""

    release: Release
    raw: dict

    @property
    def source(self) -> dict:
        return self.raw["source"]

    @property
    def top_level(self) -> dict[str, str]:
        return self.raw["top_level"]

    @property
    def sections(self) -> dict[str, dict[str, str]]:
        return self.raw["sections"]

    @property
    def tags(self) -> dict[str, dict[str, str]]:
        return self.raw["speculative"]["tags"]

    @property
    def aliases(self) -> dict[str, str]:
        return self.raw["speculative"]["aliases"]

    @property
    def serve_flags(self) -> list[str]:
        return self.raw["serve_flags"]

    def has_flag(self, flag: str) -> bool:
        return flag in self.serve_flags

    def decoding_tag(self, wanted: tuple[str, ...]) -> str | None:
        """The first of `wanted` (spellings of one decoding, best first) that this release lists as a tag."""
        return next((tag for tag in wanted if tag in self.tags), None)

    def validate(self, config: Any) -> list[ConfigProblem]:
        """Every key of `config` this release would refuse, at every depth, with the path of the offending key."""
        if not isinstance(config, dict):
            return [ConfigProblem((), "Input should be a valid dictionary", "dict_type", config)]
        problems: list[ConfigProblem] = []
        removed = self.raw.get("removed_keys", {})
        for key, value in config.items():
            if key in removed and key not in self.top_level:
                if value not in removed[key]["accepted_values"]:
                    problems.append(ConfigProblem((key,), "Value error, " + removed[key]["message"].format(
                        value=value), "value_error", value, f"remove {key} (TensorRT-LLM {self.release} removed it)"))
                continue
            if key not in self.top_level:
                problems.append(_extra((key,), value, self.top_level, suggest=len(problems) < SUGGEST_AT_MOST))
                continue
            if key == "speculative_config" and isinstance(value, dict):
                problems += self._speculative(value)
                continue
            problems += _typed((key,), value, self.top_level[key])
            if key in self.sections and isinstance(value, dict):
                problems += _fields((key,), value, self.sections[key])
        return problems

    def _speculative(self, spec: dict) -> list[ConfigProblem]:
        tag = spec.get("decoding_type")
        tag = self.aliases.get(tag, tag) if isinstance(tag, str) else tag
        if tag not in self.tags:
            expected = ", ".join(f"'{t}'" for t in self.tags)
            close = difflib.get_close_matches(str(tag), list(self.tags), n=1, cutoff=0.5)
            hint = f"did you mean {close[0]!r}?" if close else f"use one of {expected}"
            return [ConfigProblem(("speculative_config", "decoding_type"),
                                  f"Input tag {spec.get('decoding_type')!r} found using 'decoding_type' does not match "
                                  f"any of the expected tags: {expected}", "union_tag_invalid", spec, hint)]
        problems = _fields(("speculative_config",), spec, self.tags[tag])
        draft_len = spec.get("max_draft_len")
        if tag in ("Eagle", "Eagle3", "DraftTarget", "Draft_Target", "NGram") and not (
                isinstance(draft_len, int) and not isinstance(draft_len, bool) and draft_len > 0):
            problems.append(ConfigProblem(("speculative_config", "max_draft_len"), "Value error, max_draft_len must "
                                          "be > 0", "value_error", draft_len, "set a whole number above 0"))
        return problems


def _fields(where: tuple[str, ...], values: dict, fields: dict[str, str]) -> list[ConfigProblem]:
    problems: list[ConfigProblem] = []
    for key, value in values.items():
        path = (*where, str(key))
        if key not in fields:
            problems.append(_extra(path, value, fields, suggest=len(problems) < SUGGEST_AT_MOST))
        else:
            problems += _typed(path, value, fields[key])
    return problems


#: Unknown keys past this many get no "did you mean" (difflib per key is what makes a file of thousands slow).
SUGGEST_AT_MOST = 50


def _extra(path: tuple[str, ...], value: Any, allowed: dict[str, str], suggest: bool = True) -> ConfigProblem:
    close = difflib.get_close_matches(path[-1], list(allowed), n=1) if suggest else None
    hint = f"did you mean {close[0]!r}?" if close else f"{len(allowed)} keys are allowed there: " + ", ".join(
        sorted(allowed)[:12]) + (", ..." if len(allowed) > 12 else "")
    return ConfigProblem(path, "Extra inputs are not permitted", "extra_forbidden", value, hint)


def _typed(path: tuple[str, ...], value: Any, kind: str) -> list[ConfigProblem]:
    if value is None or kind not in _TYPES:
        return []
    ok = isinstance(value, _TYPES[kind]) and not (kind in ("int", "float") and isinstance(value, bool))
    if ok:
        return []
    return [ConfigProblem(path, f"Input should be {_TYPE_WORDS[kind]}", f"{kind}_type", value, _WRITE[kind])]


_WRITE = {"bool": "write true or false", "int": "write a whole number without quotes",
          "float": "write a number without quotes", "str": "write text", "list": "write a list",
          "dict": "write a mapping of key: value lines"}


@cache
def _data() -> dict:
    return json.loads(DATA_PATH.read_text())


def known_releases() -> list[Release]:
    return sorted(r for r in (Release.parse(k) for k in _data()["releases"]) if r is not None)


def schema_for(release: Release) -> ReleaseSchema:
    """The known release itself, else the nearest known one: the newest not after it, else the oldest."""
    known = known_releases()
    exact = [r for r in known if r == release]
    older = [r for r in known if r <= release]
    chosen = exact[0] if exact else (older[-1] if older else known[0])
    return ReleaseSchema(chosen, _data()["releases"][str(chosen)])


def judged_note(release: Release, schema: ReleaseSchema) -> str:
    """Empty for a known release; else which known release it is judged against."""
    if schema.release == release:
        return ""
    return f"TensorRT-LLM {release} is not in sparkctl's release data: judged as {schema.release}"


#: Image tags with multi-node problems on Sparks: tag -> what goes wrong (from users' field reports; the TensorRT-LLM
#: issue and pull request numbers where there are some).
KNOWN_BAD_RELEASES = {
    "1.3.0rc13": "two-node TP=2 segfaulted in a field report (the same setup worked on 1.2.0rc6)",
    "1.3.0rc10": "NCCL_SYMMETRIC all-reduce segfaults or hangs on dual GB10 (TensorRT-LLM #12715, fixed by #12902)",
}
