"""Where the model and its draft live in a node's HF cache, and how to tell a snapshot is complete.

The model goes to the hub cache (trtllm-serve finds it by repo id), the draft to `sparkctl-models/` in the
same cache (the config names it by path). Both are in the directory the container mounts as its HF_HOME.
"""

from __future__ import annotations

import posixpath

from sparkctl.plan.paths import CONTAINER_HF_HOME
from sparkctl.plan.revisions import LOCAL_METADATA, pin_path, repo_folder
from sparkctl.rules.serving import copy_mode
from sparkctl.tasks.context import NodeContext
from sparkctl.transport.base import q

DOWNLOAD_TIMEOUT = 6 * 3600.0


def in_copy_mode_peer(ctx: NodeContext) -> bool:
    """This node gets the model from the head (serve.distribute: copy), never from the Hub."""
    return copy_mode(ctx.inventory) and ctx.name != ctx.inventory.head.name


def token_path(ctx: NodeContext) -> str:
    return posixpath.join(ctx.hf_cache_dir(), "token")


def host_path(ctx: NodeContext, container_path: str) -> str:
    """The node-side path of a path inside the container's HF cache mount."""
    return ctx.hf_cache_dir() + container_path[len(CONTAINER_HF_HOME):]


def hub_repo_dir(ctx: NodeContext, repo: str) -> str:
    """The node-side hub cache directory of a repo (refs/, snapshots/, blobs/)."""
    return posixpath.join(ctx.hf_cache_dir(), "hub", repo_folder(repo))


def repo_path(ctx: NodeContext, repo: str, local: str | None) -> str:
    """Where a wanted repo lands on the node: its hub cache dir, or the node side of its local dir."""
    return host_path(ctx, local) if local else hub_repo_dir(ctx, repo)


def snapshot_check_script(ctx: NodeContext, repos: list[tuple[str, str | None]]) -> str:
    """Per repo one tab-separated line: `complete <repo> <pin>`, `missing <repo> <pin> <why>`, or for a complete hub
    snapshot whose refs/main is not the pin `repoint <repo> <pin>`. The pin is the node's (model.pin; `-` when it
    has none: then the hub snapshot checked is refs/main's). Complete = config.json + every weight. The shell's own
    globs walk the trees (`**`, dot files too) and its `read` takes the first lines: this read runs on every rerun,
    and each process it started was most of its cost. Its glob options are its shell's own (read_output runs it
    alone, or in a subshell beside the facts)."""
    lines = ["shopt -s globstar dotglob nullglob"]
    for repo, local in repos:
        lines.append(f"p=; IFS= read -r p 2>/dev/null <{q(pin_path(ctx.hf_cache_dir(), repo))}; p=${{p%%$'\\t'*}}; "
                     f"case $p in *[!0-9a-f]*|'') p=- ;; esac; o=; w={q(repo)}")
        if local is None:
            base = hub_repo_dir(ctx, repo)
            lines.append(f'b={q(base)}; m=; read -r m 2>/dev/null <"$b"/refs/main; r=$m; [ "$p" = - ] || r=$p; '
                         f's="$b/snapshots/$r"; [ -n "$r" ] || s=/nonexistent; '
                         '[ "$p" = - ] || [ "$m" = "$p" ] || o=repoint')
        else:
            path = host_path(ctx, local)
            lines.append(f"s={q(path)}; c=; IFS= read -r c 2>/dev/null <{q(path + '/' + LOCAL_METADATA)}")
        weights = (
            'partial=("$s"/**/*.incomplete); w8=("$s"/*.safetensors); '
            'if [ ! -f "$s"/config.json ]; then v="missing no config.json"; '
            'elif [ "${#partial[@]}" -gt 0 ]; then v="missing partial"; '
            'elif [ -f "$s"/model.safetensors.index.json ]; then ok=1; '
            'for x in $(grep -o "[^\\"]*\\.safetensors" "$s"/model.safetensors.index.json | sort -u); do '
            '[ -e "$s/$x" ] || ok=; done; '
            'if [ -n "$ok" ]; then v=complete; else v="missing shards"; fi; '
            'elif [ "${#w8[@]}" -gt 0 ]; then ok=1; '
            # a link that leads nowhere (a repo folder copied without the cache's shared blob store) is no weight
            'for x in "${w8[@]}"; do [ -e "$x" ] || ok=; done; '
            'if [ -n "$ok" ]; then v=complete; else v="missing links to nothing"; fi; '
            'else v="missing no weights"; fi')
        lines.append(weights)
        # a file removed because it did not verify is missing too, weight or not: a link to nothing in the snapshot,
        # a --local-dir file whose download metadata is there without it
        lines.append('if [ "$v" = complete ]; then for x in "$s"/**; do '
                     '[ -L "$x" ] && [ ! -e "$x" ] && { v="missing links to nothing"; break; }; done; fi'
                     if local is None else
                     'if [ "$v" = complete ]; then d="$s/.cache/huggingface/download"; '
                     'for x in "$d"/**/*.metadata; do x=${x#"$d"/}; '
                     '[ -e "$s/${x%.metadata}" ] || { v="missing files"; break; }; done; fi')
        if local is not None:
            # a --local-dir download from another commit than the pin is not the pinned one
            lines.append('[ "$v" != complete ] || [ "$p" = - ] || [ "$c" = "$p" ] || v="missing another revision"')
        lines.append('[ "$v" = complete ] && [ -n "$o" ] && v=$o; '
                     'k=${v%% *}; printf \'%s\\t%s\\t%s\\t%s\\n\' "$k" "$w" "$p" "${v#"$k"}"')
    return "\n".join(lines)


def parse_snapshot_check(stdout: str) -> list[tuple[str, str, str | None, str]]:
    """(verdict, repo, pin or None, why) per line of snapshot_check_script."""
    out = []
    for line in stdout.splitlines():
        parts = line.split("\t")
        if len(parts) == 4:
            verdict, repo, pin, why = parts
            out.append((verdict, repo, None if pin == "-" else pin, why.strip()))
    return out
