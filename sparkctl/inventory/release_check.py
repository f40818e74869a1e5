"""The inventory's TensorRT-LLM config against the image's release, at every depth, before anything runs.

`inventory validate`, `cluster plan` and `bootstrap` all load the inventory, so a key of `serve.config` that the
release would refuse is reported by all three, as `file:line: serve.config.<path>: ...`, exit 2. A key the preset
carries that the release lacks is not the user's to fix: the plan leaves it out (plan/serve.py).
"""

from __future__ import annotations

import copy
from typing import Any

from sparkctl.inventory.presets import DECODING_SPELLINGS
from sparkctl.inventory.serve import resolve_serve
from sparkctl.knowledge.trtllm_releases import ReleaseSchema, judged_note, release_of, schema_for

Problem = tuple[tuple, str]


def spell_decoding(config: dict, decoding: str, schema: ReleaseSchema | None, user_set: bool) -> dict:
    """decoding_type as the release spells it (DraftTarget in 1.1/1.2, Draft_Target in 1.3), unless the user wrote
    one: theirs is kept and judged."""
    speculative = config.get("speculative_config")
    if schema is None or user_set or not isinstance(speculative, dict) or decoding not in DECODING_SPELLINGS:
        return config
    tag = schema.decoding_tag(DECODING_SPELLINGS[decoding])
    if tag:
        speculative["decoding_type"] = tag
    return config


def without_paths(config: dict, dotted: list[str]) -> dict:
    """A copy of config without the keys at those dotted paths."""
    out = copy.deepcopy(config)
    for path in dotted:
        *parents, last = path.split(".")
        node: Any = out
        for key in parents:
            node = node.get(key) if isinstance(node, dict) else None
        if isinstance(node, dict):
            node.pop(last, None)
    return out


def release_problems(serve, image: str | None, node_count: int, env: dict[str, str] | None = None) -> list[Problem]:
    """(location, message) for each key of serve.config the image's release would refuse (`env`: container.env,
    which TensorRT-LLM's checks do not need)."""
    release = release_of(image)
    if release is None:
        return []
    schema = schema_for(release)
    spec = resolve_serve(serve, node_count)
    config = copy.deepcopy(spec.config)
    config.setdefault("cuda_graph_config", {})
    if isinstance(config["cuda_graph_config"], dict):
        config["cuda_graph_config"]["max_batch_size"] = spec.max_batch_size
    if spec.decoding != "none" and isinstance(config.get("speculative_config"), dict):
        config["speculative_config"].setdefault("speculative_model_dir", "/draft/")
    user = dict(serve.config or {})
    user_tag = isinstance(user.get("speculative_config"), dict) and "decoding_type" in user["speculative_config"]
    config = spell_decoding(config, spec.decoding, schema, user_set=user_tag)
    note = judged_note(release, schema)
    out: list[Problem] = []
    for problem in schema.validate(config):
        if not _written(user, problem.path):
            continue
        hint = "; ".join(h for h in (problem.hint, note) if h)
        out.append((("serve", "config", *problem.path),
                    f"TensorRT-LLM {release} (the image's release) refuses it: {problem.message}"
                    + (f" ({hint})" if hint else "")))
    return out


def _written(user: dict, path: tuple[str, ...]) -> bool:
    node: Any = user
    for key in path:
        if not isinstance(node, dict) or key not in node:
            return False
        node = node[key]
    return True
