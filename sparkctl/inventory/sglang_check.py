"""The inventory's SGLang flags (serve.args and serve.config, both on the server's command line) against the image's
release.

`inventory validate`, `cluster plan` and `bootstrap` all load the inventory, so a flag the release lacks, a value
its argparse would refuse (SGLang's parser is plain argparse: `--tp_size` is no flag of it), a speculative setting
that stops it at start, or a world its nodes cannot divide, is reported by all three at `file:line:
serve.args[i]` / `serve.config.<key>`, exit 2, before anything runs.
"""

from __future__ import annotations

import difflib
import json
from typing import Any

from sparkctl.inventory.sections import ServeSettings
from sparkctl.inventory.serve import SGLANG_SPECULATIVE, flag_key, resolve_serve
from sparkctl.knowledge.sglang_releases import judged_note, release_of, schema_for

Problem = tuple[tuple, str]

#: The flags sparkctl writes itself, with the inventory field that decides each (canonical option strings).
OWNED_FLAGS = {
    "--model-path": "serve.model (or serve.preset)",
    "--served-model-name": "a serve.models entry's name and aliases (the names clients ask for)",
    "--tensor-parallel-size": "serve.tp_size",
    "--pipeline-parallel-size": "serve.pp_size",
    "--nnodes": "serve.nodes (the serving nodes)",
    "--node-rank": "serve.nodes (the order of the serving nodes)",
    "--dist-init-addr": "the head's fabric address (sparkctl's plan) and serve.sglang.dist_port",
    "--host": "serve.listen (the gateway listens; SGLang answers on the head's loopback)",
    "--port": "serve.port (the gateway) and serve.engine_port (SGLang)",
    "--api-key": "serve.auth (the gateway checks the key)",
    "--enable-metrics": "sparkctl (top, serve status and serve bench read /metrics)",
    "--speculative-draft-model-path": "serve.draft (the plan knows where the draft lives on each node)",
}


def flag_argv(flags: dict[str, Any]) -> list[str]:
    """A flag mapping as argparse reads it: `--name value`; true alone for an on/off flag, false left out; a list
    as several values; a mapping as JSON (the flags that take one parse it)."""
    argv: list[str] = []
    for name, value in flags.items():
        if value is True:
            argv.append(f"--{name}")
        elif value is False or value is None:
            continue
        elif isinstance(value, (list, tuple)):
            argv += [f"--{name}", *(str(v) for v in value)]
        elif isinstance(value, dict):
            argv += [f"--{name}", json.dumps(value, separators=(",", ":"))]
        else:
            argv += [f"--{name}", str(value)]
    return argv


def sglang_release_problems(serve: ServeSettings, image: str, node_count: int,
                            env: dict[str, str] | None = None) -> list[Problem]:
    """(location, message) for each of serve.args and serve.config that the image's SGLang release would refuse,
    and each SGLANG_* variable of container.env it does not read (set, it would change nothing)."""
    version = release_of(image)
    if version is None:
        return []
    schema = schema_for(version)
    note = judged_note(version, schema)

    def said(where: tuple, message: str, hint: str = "") -> Problem:
        hint = "; ".join(h for h in (hint, note) if h)
        return ("serve", *where), message + (f" ({hint})" if hint else "")

    out = [said(("args", p.where[1]), p.message, p.hint) for p in schema.check_flags(list(serve.args), OWNED_FLAGS)]
    for key, value in serve.config.items():
        out += [said(("config", key), p.message, p.hint)
                for p in schema.check_flags(flag_argv({flag_key(key): value}), OWNED_FLAGS)]
    if out:
        return out  # the server would stop at its parser: what it checks after that cannot be said yet
    spec = resolve_serve(serve, node_count)
    written = [key for key in serve.config if flag_key(key) in SGLANG_SPECULATIVE]
    if spec.decoding != "none" or written:
        # the checks read other settings too (page size, attention backend): every flag of the launch
        flags = {f"--{k}": v for k, v in spec.config.items()}
        if spec.draft:
            flags["--speculative-draft-model-path"] = spec.draft
        where = ("config", written[0]) if written else ("decoding",)
        out += [said(where, p.message, p.hint) for p in schema.speculative_problems(flags)]
    world = {"--tensor-parallel-size": spec.tp_size, "--pipeline-parallel-size": spec.pp_size,
             "--nnodes": len(serve.nodes or []) or min(spec.world_size, node_count)}
    out += [said(("tp_size",), p.message, p.hint) for p in schema.multi_node_problems(world)]
    for name in env or {}:
        if name.startswith("SGLANG_") and name not in schema.env_names():
            close = difflib.get_close_matches(name, schema.env_names(), n=1, cutoff=0.9)
            hint = "; ".join(h for h in (f"did you mean {close[0]}?" if close else "remove it", note) if h)
            out.append((("container", "env", name), f"SGLang {version} does not read {name}: set, it changes "
                                                     f"nothing ({hint})"))
    return out
