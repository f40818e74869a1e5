"""What a node does with a repo's files against the hashes the Hub recorded (plan/hub_hashes.py): read them, remove
the wrong ones, keep what it verified. Shared by model.verify (a node's own download) and model.copy (the head's
before it is sent, each peer's on arrival)."""

from __future__ import annotations

import posixpath

from sparkctl.plan import hub_hashes
from sparkctl.taskgraph.task import TaskFailed
from sparkctl.tasks.context import NodeContext
from sparkctl.tasks.model.cache import DOWNLOAD_TIMEOUT
from sparkctl.transport.base import q


def hash_files(node: NodeContext, repo_dir: str, paths: list[str] | tuple[str, ...],
                etags: dict[str, str] | None = None) -> tuple[list[str], list[str]]:
    """(record lines of the blobs that match their etag, the paths that do not), each file read once. `etags`: a
    --local-dir's, by file (a hub blob names its own)."""
    result = node.run(hub_hashes.hash_script(repo_dir, list(paths), etags), timeout=DOWNLOAD_TIMEOUT)
    if result.exit_code == 3:
        raise TaskFailed(f"{repo_dir} is not on {node.name}")
    return hub_hashes.judged(hub_hashes.parse_hashes(result.stdout), etags)


def remove_files(node: NodeContext, repo_dir: str, paths: list[str], repo: str) -> None:
    """The wrong files go (through a link: the file it leads to, then the link), as root: a download inside the
    container wrote them as root."""
    script = f"cd {q(repo_dir)} || exit 3\n" + "\n".join(
        f'f={q(p)}; t=$(readlink -f "$f"); rm -f -- "$t" "$f"' for p in paths)
    node.must(script, f"removing the wrong files of {repo}", sudo=True)


def keep_verified(node: NodeContext, record_path: str, recorded: frozenset[str], good: list[str]) -> None:
    """The node's record: what it verified before (for the blobs not read again) and what it verified now."""
    # by etag and inode: two files of a --local-dir with the same bytes share an etag, each keeps its own line
    fresh = {_etag_inode(line) for line in good}
    kept = [line for line in recorded if _etag_inode(line) not in fresh]
    node.must(f"mkdir -p {q(posixpath.dirname(record_path))}", "making the record of verified files")
    node.transport.put(record_path, "\n".join(sorted([*kept, *good])) + "\n", mode=0o644)


def _etag_inode(line: str) -> tuple[str, str]:
    fields = line.split("\t")
    return fields[0], fields[-1] if len(fields) > 1 else ""


def wrong_download(repo: str, node: str, wrong: list[str]) -> TaskFailed:
    return TaskFailed(f"{len(wrong)} file(s) of {repo} on {node} do not match the hash the Hub recorded (e.g. "
                      f"{wrong[0]}): removed", hint="rerun: model.fetch downloads them again")
