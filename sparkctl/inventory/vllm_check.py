"""The inventory's vLLM flags (serve.args) and `--config` mapping (serve.config) against the image's release.

`inventory validate`, `cluster plan` and `bootstrap` all load the inventory, so a flag the release lacks (or has
dropped), a choice it does not offer, a speculative-config key it refuses or would silently ignore, is reported by
all three at `file:line: serve.args[i]` / `serve.config.<key>`, exit 2, before anything runs.
"""

from __future__ import annotations

import difflib

from sparkctl.inventory.sections import ServeSettings
from sparkctl.inventory.serve import flag_key, resolve_serve
from sparkctl.knowledge.vllm_releases import judged_note, release_of, schema_for

Problem = tuple[tuple, str]

#: The flags sparkctl writes itself, with the inventory field that decides each.
OWNED_FLAGS = {
    "--model": "serve.model (or serve.preset)",
    "--tensor-parallel-size": "serve.tp_size",
    "--pipeline-parallel-size": "serve.pp_size",
    "--nnodes": "serve.nodes (the serving nodes)",
    "--node-rank": "serve.nodes (the order of the serving nodes)",
    "--master-addr": "the head's fabric address (sparkctl's plan)",
    "--master-port": "serve.vllm.master_port",
    "--headless": "the plan (every serving node but the head)",
    "--distributed-executor-backend": "serve.vllm.executor",
    "--host": "serve.listen (the gateway listens; vLLM answers on the head's loopback)",
    "--port": "serve.port (the gateway) and serve.engine_port (vLLM)",
    "--api-key": "serve.auth (the gateway checks the key)",
    "--served-model-name": "a serve.models entry's name and aliases (the names clients ask for)",
    "--config": "serve.config (sparkctl writes it as the --config file)",
    "--speculative-config.model": "serve.draft (the plan knows where the draft lives on each node)",
}


def vllm_release_problems(serve: ServeSettings, image: str, node_count: int,
                          env: dict[str, str] | None = None) -> list[Problem]:
    """(location, message) for each of serve.args and serve.config that the image's vLLM release would refuse,
    and each VLLM_* variable of container.env it does not read (set, it would change nothing)."""
    version = release_of(image)
    if version is None:
        return []
    schema = schema_for(version)
    note = judged_note(version, schema)
    spec = resolve_serve(serve, node_count)
    written = {flag_key(k) for k in serve.config}
    config = {k: v for k, v in spec.config.items() if k in written}
    out: list[Problem] = []
    for problem in [*schema.check_args(list(serve.args), OWNED_FLAGS), *schema.check_config(config, OWNED_FLAGS)]:
        where = problem.where
        if where[0] == "config":
            where = ("config", _as_written(serve.config, str(where[1])), *where[2:])
        hint = "; ".join(h for h in (problem.hint, note) if h)
        out.append((("serve", *where), problem.message + (f" ({hint})" if hint else "")))
    if serve.vllm.executor == "mp" and not schema.has_nnodes and spec.world_size > 1:
        out.append((("serve", "vllm", "executor"), f"mp: vLLM {version} has no --nnodes (0.11.1 and later), so its "
                                                   "ranks meet across nodes only over Ray (set executor: ray or "
                                                   "auto, or use an image with a later vLLM)"))
    for name in env or {}:
        if name.startswith("VLLM_") and name not in schema.env:
            had = schema.env_read_until(name)
            close = difflib.get_close_matches(name, schema.env, n=1, cutoff=0.9)
            what = f" (vLLM {had} read it)" if had else ""
            hint = "; ".join(h for h in (f"did you mean {close[0]}?" if close and not had else "remove it", note)
                             if h)
            out.append((("container", "env", name), f"vLLM {version} does not read {name}{what}: set, it changes "
                                                     f"nothing ({hint})"))
    return out


def _as_written(config: dict, dashed: str) -> str:
    """The key as the inventory spells it (underscores or dashes), for its file:line."""
    return next((k for k in config if flag_key(k) == dashed), dashed)
