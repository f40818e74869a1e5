"""Where the model and its draft live in a node's HF cache, and how to tell a snapshot is complete.

The model goes to the hub cache (trtllm-serve finds it by repo id), the draft to `sparkctl-models/` in the
same cache (the config names it by path). Both are in the directory the container mounts as its HF_HOME.
"""

from __future__ import annotations

import posixpath

from sparkctl.plan.container import CONTAINER_HF_HOME
from sparkctl.plan.serve import draft_dir
from sparkctl.tasks.container_ssh import hf_cache_dir
from sparkctl.transport.base import q

DOWNLOAD_TIMEOUT = 6 * 3600.0


def serving_enabled(inventory) -> bool:
    """Serving is set up only for an inventory with a `serve:` section (a bare cluster is a valid goal).

    The one rule, for the tasks and for doctor; an inventory-like object without pydantic's field set counts
    as serving."""
    return "serve" in getattr(inventory, "model_fields_set", {"serve"})


def token_path(ctx) -> str:
    return posixpath.join(hf_cache_dir(ctx), "token")


def host_path(ctx, container_path: str) -> str:
    """The node-side path of a path inside the container's HF cache mount."""
    return hf_cache_dir(ctx) + container_path[len(CONTAINER_HF_HOME):]


def hub_repo_dir(ctx, repo: str) -> str:
    """The node-side hub cache directory of a repo (refs/, snapshots/, blobs/)."""
    return posixpath.join(hf_cache_dir(ctx), "hub", "models--" + repo.replace("/", "--"))


def repo_path(ctx, repo: str, local: str | None) -> str:
    """Where a wanted repo lands on the node: its hub cache dir, or the node side of its local dir."""
    return host_path(ctx, local) if local else hub_repo_dir(ctx, repo)


def wanted_repos(inventory) -> list[tuple[str, str | None]]:
    """(repo, local dir in the container or None for the hub cache): the model, then the draft."""
    spec = inventory.serve_spec()
    out: list[tuple[str, str | None]] = [(spec.model, None)]
    if spec.draft and spec.decoding != "none":
        out.append((spec.draft, draft_dir(spec.draft)))
    return out


def snapshot_check_script(ctx, repos: list[tuple[str, str | None]]) -> str:
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
            f'elif ls "$s"/*.safetensors >/dev/null 2>&1; then echo complete {q(repo)}; '
            f'else echo missing {q(repo)} no weights; fi')
    return "\n".join(lines)
