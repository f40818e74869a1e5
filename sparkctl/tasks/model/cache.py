"""Where the model and its draft live in a node's HF cache, and how to tell a snapshot is complete.

The model goes to the hub cache (trtllm-serve finds it by repo id), the draft to `sparkctl-models/` in the
same cache (the config names it by path). Both are in the directory the container mounts as its HF_HOME.
"""

from __future__ import annotations

import posixpath

from sparkctl.plan.paths import CONTAINER_HF_HOME
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
    return posixpath.join(ctx.hf_cache_dir(), "hub", "models--" + repo.replace("/", "--"))


def repo_path(ctx: NodeContext, repo: str, local: str | None) -> str:
    """Where a wanted repo lands on the node: its hub cache dir, or the node side of its local dir."""
    return host_path(ctx, local) if local else hub_repo_dir(ctx, repo)


def snapshot_check_script(ctx: NodeContext, repos: list[tuple[str, str | None]]) -> str:
    """Per repo one line: `complete <repo>` or `missing <repo> <why>`; complete = config.json + every weight."""
    lines = []
    for repo, local in repos:
        if local is None:
            base = hub_repo_dir(ctx, repo)
            lines.append(f'b={q(base)}; r=$(cat "$b"/refs/main 2>/dev/null); s="$b/snapshots/$r"; '
                         f'[ -n "$r" ] || s=/nonexistent')
        else:
            lines.append(f"s={q(host_path(ctx, local))}")
        lines.append(
            f'if [ ! -f "$s"/config.json ]; then echo missing {q(repo)} no config.json; '
            f'elif find "$s" -name "*.incomplete" 2>/dev/null | grep -q .; then echo missing {q(repo)} partial; '
            f'elif [ -f "$s"/model.safetensors.index.json ]; then ok=1; '
            f'for w in $(grep -o "[^\\"]*\\.safetensors" "$s"/model.safetensors.index.json | sort -u); do '
            f'[ -e "$s/$w" ] || ok=; done; '
            f'if [ -n "$ok" ]; then echo complete {q(repo)}; else echo missing {q(repo)} shards; fi; '
            f'elif ls "$s"/*.safetensors >/dev/null 2>&1; then ok=1; '
            # a link that leads nowhere (a repo folder copied without the cache's shared blob store) is no weight
            f'for w in "$s"/*.safetensors; do [ -e "$w" ] || ok=; done; '
            f'if [ -n "$ok" ]; then echo complete {q(repo)}; else echo missing {q(repo)} links to nothing; fi; '
            f'else echo missing {q(repo)} no weights; fi')
    return "\n".join(lines)
