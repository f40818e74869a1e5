"""PURE: the commit each repo a cluster serves is pinned at, and where a node keeps it.

A run resolves the model's revision (serve.revision, else main) and the draft's main to a commit once, on the
head (tasks/model/pin.py), and writes the pin on every serving node: `<hf_cache>/sparkctl-pins/<repo folder>` holds
`<commit>\t<revision asked>`. Every later run downloads, copies, verifies and serves that commit, whatever the
branch has become on the Hub, until the inventory names another revision or a run is given --refresh (a model's
`main` can be restructured upstream under a running cluster: sparkrun issue 239).

The engines run with HF_HUB_OFFLINE=1 (plan/container.py) and find the model by its repo id: huggingface_hub then
resolves `main` through the cache's refs/main (file_download.py, `_get_pointer_path`/`try_to_load_from_cache`), so
model.fetch keeps each node's refs/main at the pinned commit.
"""

from __future__ import annotations

import posixpath
import re
from dataclasses import dataclass

from sparkctl.inventory import Inventory
from sparkctl.plan.serve import wanted_repos

PINS_DIR = "sparkctl-pins"
DEFAULT_REVISION = "main"
#: huggingface_hub's download metadata of a --local-dir file: its first line is the commit it came from
#: (huggingface_hub/_local_folder.py, LocalDownloadFileMetadata: commit_hash, etag, timestamp)
LOCAL_METADATA = ".cache/huggingface/download/config.json.metadata"
_COMMIT = re.compile(r"[0-9a-f]{40}\Z")
#: huggingface_hub's hub-cache path of a file of a snapshot: .../snapshots/<commit>/<file>
_SNAPSHOT = re.compile(r"/snapshots/([0-9a-f]{40})(?:/|$)")


def is_commit(revision: str) -> bool:
    return bool(_COMMIT.match(revision))


def repo_folder(repo: str) -> str:
    """The repo's folder name in the hub cache (huggingface_hub: repo_folder_name)."""
    return "models--" + repo.replace("/", "--")


def pin_path(hf_cache_dir: str, repo: str) -> str:
    return posixpath.join(hf_cache_dir, PINS_DIR, repo_folder(repo))


@dataclass(frozen=True)
class Pin:
    commit: str
    asked: str  # the revision the commit was resolved from (a branch, a tag, or the commit itself)

    def text(self) -> str:
        return f"{self.commit}\t{self.asked}\n"

    def short(self) -> str:
        return self.commit[:12] + ("" if self.asked == self.commit else f" ({self.asked})")

    @classmethod
    def parse(cls, text: str) -> Pin | None:
        commit, _, asked = text.strip().partition("\t")
        return cls(commit, asked or commit) if is_commit(commit) else None


def asked_revisions(inventory: Inventory) -> list[tuple[str, str | None, str]]:
    """(repo, local dir in the container or None for the hub cache, revision asked): the model (serve.revision,
    else main), then the draft (main)."""
    revision = inventory.serve.revision or DEFAULT_REVISION
    return [(repo, local, revision if index == 0 else DEFAULT_REVISION)
            for index, (repo, local) in enumerate(wanted_repos(inventory))]


@dataclass(frozen=True)
class PinnedRepo:
    """A repo some world loads, the revision asked of it, and the nodes that load it."""
    repo: str
    local: str | None
    asked: str
    nodes: tuple[str, ...]
    #: the first world's model: moving its pin on the head switches the deployment (runs/rollback.py)
    model: bool


def pinned_repos(inventory: Inventory) -> list[PinnedRepo]:
    """asked_revisions of every world, each repo and revision once, with every node that loads it."""
    out: dict[tuple[str, str | None, str], PinnedRepo] = {}
    for world in inventory.worlds():
        for i, (repo, local, asked) in enumerate(asked_revisions(inventory.for_world(world))):
            key = (repo, local, asked)
            held = out.get(key)
            nodes = tuple(dict.fromkeys([*(held.nodes if held else ()), *world.nodes]))
            out[key] = PinnedRepo(repo, local, asked, nodes, (held is not None and held.model)
                                  or (world.key == "" and i == 0))
    return list(out.values())


def commit_in_path(printed: str) -> str | None:
    """The commit of the snapshot path `hf download` printed last (its stdout), None when it printed none."""
    for line in reversed(printed.strip().splitlines()):
        match = _SNAPSHOT.search(line)
        if match:
            return match.group(1)
    return None


def wanted_pin(asked: str, head_pin: Pin | None, head_commit: str | None, refresh: bool) -> Pin | None:
    """The pin a repo should have; None: it must be resolved on the Hub.

    The head's pin holds while it was resolved from the revision still asked (and no --refresh); a commit asked
    is its own pin; a cluster without a pin yet that asks for main keeps the snapshot its head already holds
    (`head_commit`: what an earlier run downloaded), so pinning never downloads a model again by itself."""
    if is_commit(asked):
        return Pin(asked, asked)
    if refresh:
        return None
    if head_pin is not None and head_pin.asked == asked:
        return head_pin
    if head_pin is None and asked == DEFAULT_REVISION and head_commit and is_commit(head_commit):
        return Pin(head_commit, asked)
    return None
