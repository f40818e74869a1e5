"""What a node holds of the model and its draft, as model.copy judges it (docs/models.md): every file with its size,
every link with its target, the md5 of the small files, the current snapshot of a hub repo, a --local-dir's etags,
and what the node verified against the Hub's hashes (plan/hub_hashes.py)."""

from __future__ import annotations

import posixpath
from dataclasses import dataclass, field

from sparkctl.plan import hub_hashes
from sparkctl.plan.serve import wanted_repos
from sparkctl.tasks.context import NodeContext
from sparkctl.tasks.model.cache import repo_path
from sparkctl.transport.base import q

SMALL_FILE_BYTES = 64 * 1024
REPO_MARK = "@@repo"



@dataclass(frozen=True)
class RepoDir:
    repo: str
    path: str   # on the node
    hub: bool   # the hub cache layout (refs/main, snapshots/<rev>/ -> blobs/), else a plain --local-dir
    verified: str = ""  # the node's record of what it verified there (plan/hub_hashes.py)


def repo_dirs(node_ctx: NodeContext) -> list[RepoDir]:
    out = []
    for repo, local in wanted_repos(node_ctx.inventory):
        path = repo_path(node_ctx, repo, local)
        out.append(RepoDir(repo, path, hub=local is None,
                           verified=hub_hashes.record_path(node_ctx.hf_cache_dir(), path)))
    return out


def manifest_script(dirs: list[RepoDir]) -> str:
    """Per repo: a mark line, the ref (hub layout), every file with its size, every symlink with its target,
    and the md5 of the small files. Half-downloaded files and locks are never part of a snapshot."""
    skip = "! -name '*.incomplete' ! -name '*.lock' ! -path './.no_exist/*'"
    lines = []
    for d in dirs:
        lines.append(f"printf '%s\\t%s\\n' {q(REPO_MARK)} {q(d.repo)}")
        lines.append(
            f"if cd {q(d.path)} 2>/dev/null; then "
            + ("printf 'V\\t%s\\n' \"$(cat refs/main 2>/dev/null)\"; " if d.hub else "")
            + f"find . ! -type d {skip} \\( -type l -printf 'L\\t%P\\t%l\\n' -o -type f -printf 'F\\t%P\\t%s\\n' \\); "
            # what every link resolves to (a file: its size; a link to nothing stays a link), and the md5 of
            # every small file, reached through a link or not
            f"find -L . -type l -prune -o ! -type d {skip} -type f -printf 'R\\t%P\\t%s\\n' 2>/dev/null; "
            f"find -L . -type l -prune -o -type f -size -{SMALL_FILE_BYTES // 1024 + 1}k {skip} -exec md5sum {{}} + "
            "2>/dev/null | sed 's/^/M\\t/'; cd /; fi")
        if not d.hub:
            lines.append(hub_hashes.local_etags_script(d.path))
        lines.append(hub_hashes.stat_script(d.path, d.verified, d.hub))
    return "\n".join(lines)


@dataclass(frozen=True)
class Verified:
    """What a node verified of one repo (plan/hub_hashes.py): its record's lines, and each blob's stat now."""

    record: frozenset[str] = frozenset()
    stats: dict[str, tuple[str, str, str]] = field(default_factory=dict)

    def unverified(self, paths: list[str], reprove: bool, etags: dict[str, str] | None = None) -> list[str]:
        return hub_hashes.unverified(paths, set(self.record), self.stats, reprove, etags)


def parse_verified(stdout: str) -> dict[str, Verified]:
    """The `C` and `S` lines of each repo's block of the manifest script's output."""
    out: dict[str, Verified] = {}
    repo: str | None = None
    block: list[str] = []
    for line in [*stdout.splitlines(), f"{REPO_MARK}\t"]:
        kind, _, rest = line.partition("\t")
        if kind == REPO_MARK:
            if repo is not None:
                record, stats = hub_hashes.parse_stats("\n".join(block))
                out[repo] = Verified(frozenset(record), stats)
            repo, block = rest, []
        elif kind in ("C", "S"):
            block.append(line)
    return out


@dataclass(frozen=True)
class Manifest:
    """One repo as a node holds it: the ref (hub layout), path -> ("F", size, md5 or "") | ("L", target), and the
    paths that are links leaving the repo's folder, entered as the file they resolve to."""

    ref: str | None
    entries: dict[str, tuple]
    outside: frozenset[str] = frozenset()
    #: a --local-dir's files -> the etag its download metadata holds (a hub blob names its own)
    etags: dict[str, str] = field(default_factory=dict)


def parse_manifests(stdout: str) -> dict[str, Manifest]:
    out: dict[str, Manifest] = {}
    repo: str | None = None
    ref: str | None = None
    entries: dict[str, tuple] = {}
    resolved: dict[str, int] = {}
    md5s: dict[str, str] = {}
    etags: dict[str, str] = {}

    def close() -> None:
        if repo is None:
            return
        outside = set()
        for path, entry in list(entries.items()):
            if entry[0] == "L" and leaves_repo(path, entry[1]) and path in resolved:
                entries[path] = ("F", resolved[path], "")  # a link to nothing stays a link: a file lacking
                outside.add(path)
        for path, digest in md5s.items():
            if path in entries and entries[path][0] == "F":
                entries[path] = ("F", entries[path][1], digest)
        out[repo] = Manifest(ref, entries, frozenset(outside), dict(etags))

    for line in stdout.splitlines():
        kind, _, rest = line.partition("\t")
        if kind == REPO_MARK:
            close()
            repo, ref, entries, resolved, md5s, etags = rest, None, {}, {}, {}, {}
        elif kind == "V":
            ref = rest.strip() or None
        elif kind in ("F", "R"):
            path, _, size = rest.rpartition("\t")
            if kind == "F":
                entries[path] = ("F", int(size) if size.isdigit() else -1, "")
            elif size.isdigit():
                resolved[path] = int(size)
        elif kind == "L":
            path, _, target = rest.partition("\t")
            entries[path] = ("L", target)
        elif kind == "M":
            digest, _, path = rest.partition("  ")
            md5s[path.removeprefix("./")] = digest
        elif kind == "E":
            etags.update(hub_hashes.parse_etags(line))
    close()
    return out


def leaves_repo(path: str, target: str) -> bool:
    """Does a link at `path` (relative to the repo's folder) point out of that folder?"""
    return posixpath.isabs(target) or posixpath.normpath(posixpath.join(posixpath.dirname(path), target)) \
        .startswith("../")


def snapshot_entries(hub: bool, ref: str | None, entries: dict[str, tuple]) -> dict[str, tuple]:
    """What makes up the snapshot in use: the hub layout's current revision and the blobs it links to."""
    if not hub:
        return dict(entries)
    if not ref or "refs/main" not in entries:
        return {}
    prefix = f"snapshots/{ref}/"
    wanted = {"refs/main": entries["refs/main"]}
    for path, entry in entries.items():
        if path.startswith(prefix):
            wanted[path] = entry
            if entry[0] == "L":
                blob = posixpath.normpath(posixpath.join(posixpath.dirname(path), entry[1]))
                if blob in entries:
                    wanted[blob] = entries[blob]
    return wanted


def missing_on_peer(head: dict[str, tuple], peer: dict[str, tuple]) -> list[str]:
    """Paths to send: not on the peer or different there. Blobs first, links next, refs/main last."""
    return missing_first([p for p, entry in head.items() if peer.get(p) != entry], head)


def missing_first(paths: list[str], head: dict[str, tuple] | None = None) -> list[str]:
    """Blobs first, links next (those `head` knows as links), refs/main last; each once."""
    links = {p for p, e in (head or {}).items() if e[0] == "L"}
    return sorted(dict.fromkeys(paths), key=lambda p: (p == "refs/main", p in links, p))


def total_bytes(entries: dict[str, tuple]) -> int:
    return sum(e[1] for e in entries.values() if e[0] == "F")
