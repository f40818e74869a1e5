"""model.copy (serve.distribute: copy): the head's snapshots reach the peers over the fabric, not from the Hub.

The head downloads (model.fetch); then, run ON the head, `rsync` (when both ends have it) or `tar | ssh peer
tar -x` sends each peer exactly the files it lacks, over the fabric, with the node's cluster key that ssh.mesh
set up (`ssh <peer fabric ip>` picks it from ~/.ssh/config). The controller never relays the bytes.

"Complete" is judged against the head's own snapshot, file by file: size for every file (hub blobs are named
by their hash), content (md5) for files under 64 KiB (refs/main, configs, download metadata), the target of
every symlink. A peer that already holds the same snapshot is ok; an interrupted copy resumes with what is
missing (rsync --partial also resumes inside a file).
"""

from __future__ import annotations

import posixpath
import time
from dataclasses import dataclass

from sparkctl.plan.serve import wanted_repos
from sparkctl.plan.ssh import peer_route
from sparkctl.rules.serving import copy_mode, serves
from sparkctl.taskgraph.events import Event
from sparkctl.taskgraph.task import Change, Scope, Task, TaskFailed
from sparkctl.tasks.context import ClusterContext, NodeContext
from sparkctl.tasks.model.cache import DOWNLOAD_TIMEOUT, repo_path
from sparkctl.tasks.model.progress import TransferProgress, directory_size_reader, human_bytes, rate_text
from sparkctl.transport.base import CommandResult, q

SMALL_FILE_BYTES = 64 * 1024
REPO_MARK = "@@repo"
SSH_OPTIONS = "-o BatchMode=yes -o ConnectTimeout=10 -o ServerAliveInterval=15"


@dataclass(frozen=True)
class RepoDir:
    repo: str
    path: str   # on the node
    hub: bool   # the hub cache layout (refs/main, snapshots/<rev>/ -> blobs/), else a plain --local-dir


def repo_dirs(node_ctx: NodeContext) -> list[RepoDir]:
    return [RepoDir(repo, repo_path(node_ctx, repo, local), hub=local is None)
            for repo, local in wanted_repos(node_ctx.inventory)]


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
            f"find . -type f -size -{SMALL_FILE_BYTES // 1024 + 1}k {skip} -exec md5sum {{}} + | "
            "sed 's/^/M\\t/'; cd /; fi")
    return "\n".join(lines)


def parse_manifests(stdout: str) -> dict[str, tuple[str | None, dict[str, tuple]]]:
    """repo -> (ref, {path: ("F", size, md5 or "") | ("L", target)})."""
    out: dict[str, tuple[str | None, dict[str, tuple]]] = {}
    repo: str | None = None
    ref: str | None = None
    entries: dict[str, tuple] = {}
    md5s: dict[str, str] = {}

    def close() -> None:
        if repo is not None:
            for path, digest in md5s.items():
                if path in entries and entries[path][0] == "F":
                    entries[path] = ("F", entries[path][1], digest)
            out[repo] = (ref, entries)

    for line in stdout.splitlines():
        kind, _, rest = line.partition("\t")
        if kind == REPO_MARK:
            close()
            repo, ref, entries, md5s = rest, None, {}, {}
        elif kind == "V":
            ref = rest.strip() or None
        elif kind == "F":
            path, _, size = rest.rpartition("\t")
            entries[path] = ("F", int(size) if size.isdigit() else -1, "")
        elif kind == "L":
            path, _, target = rest.partition("\t")
            entries[path] = ("L", target)
        elif kind == "M":
            digest, _, path = rest.partition("  ")
            md5s[path.removeprefix("./")] = digest
    close()
    return out


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
    paths = [p for p, entry in head.items() if peer.get(p) != entry]
    return sorted(paths, key=lambda p: (p == "refs/main", head[p][0] == "L", p))


def copy_script(source: str, dest: str, target: str, extra_options: str = "") -> str:
    """Run on the head, the NUL-separated file list on stdin. Prints `via rsync` or `via tar` first."""
    ssh = f"ssh {SSH_OPTIONS} {extra_options}".strip()
    remote_tar = f"tar -C {q(dest)} -xf -"
    return "\n".join([
        "set -o pipefail",
        f'e="{ssh}"',
        f"$e {q(target)} {q('mkdir -p ' + q(dest))} </dev/null || exit 3",
        f"if command -v rsync >/dev/null 2>&1 && $e {q(target)} 'command -v rsync' </dev/null >/dev/null 2>&1; "
        "then echo via rsync; "
        f'rsync -a --partial --from0 --files-from=- -e "$e" {q(source + "/")} {q(target + ":" + dest + "/")}; '
        f"else echo via tar; tar -C {q(source)} --null -T - -cf - | $e {q(target)} {q(remote_tar)}; fi",
    ])


def copy_failure(peer: str, repo: str, result: CommandResult) -> TaskFailed:
    output = (result.stderr or result.stdout).strip()
    tail = output.splitlines()[-3:]
    if "Host key verification failed" in output or "Permission denied (publickey" in output:
        return TaskFailed(f"the head cannot ssh to {peer} over the fabric with the cluster key",
                          hint="rerun bootstrap so ssh.mesh repairs the keys (ssh.verify shows which pair fails)",
                          details=tail)
    if "Permission denied" in output:
        return TaskFailed(f"copying {repo} to {peer}: permission denied in its HF cache",
                          hint=f"files there are owned by another user (an earlier download inside the "
                               f"container runs as root): on {peer}, `sudo chown -R $USER: <hf_cache>` and rerun",
                          details=tail)
    reason = "timed out" if result.timed_out else f"exit {result.exit_code}"
    return TaskFailed(f"copying {repo} to {peer} failed ({reason})",
                      hint="a rerun sends only what is still missing", details=tail)


@dataclass(frozen=True)
class CopyStep:
    """One repo to send from the head to one peer."""

    peer: str
    source: RepoDir
    dest: str
    paths: list[str]
    size: int
    total: int


class ModelCopyTask(Task[ClusterContext, CopyStep]):
    name = "model.copy"
    phase = "model"
    scope = Scope.CLUSTER
    needs = ("model.fetch",)
    description = "serve.distribute: copy: send the head's model and draft to the peers over the fabric"
    checks = ("each peer's model snapshot (hub cache, current revision) and draft dir hold every file of the "
              "head's, same size (same md5 under 64 KiB, same symlink targets); nothing to do in download mode")
    changes = ("run on the head: `rsync -a --partial` (both ends have rsync) or `tar | ssh <peer fabric ip> "
               "tar -x` with the cluster key, only the missing files; logs bytes, seconds and MB/s")

    def check(self, ctx: ClusterContext) -> list[Change[CopyStep]]:
        inv = ctx.inventory
        if not copy_mode(inv):
            return []
        head = ctx.head().name
        dirs = {name: repo_dirs(node) for name, node in ctx.nodes.items() if serves(inv, name)}
        results = ctx.run_on_all({name: manifest_script(d) for name, d in dirs.items()}, timeout=300)
        manifests = {}
        for name, result in results.items():
            if not result.ok:
                raise TaskFailed(f"reading the HF cache on {name} failed", details=result.stderr.splitlines()[-3:])
            manifests[name] = parse_manifests(result.stdout)
        changes = []
        for index, source in enumerate(dirs[head]):
            ref, entries = manifests[head].get(source.repo, (None, {}))
            wanted = snapshot_entries(source.hub, ref, entries)
            if not wanted and not ctx.options.check:
                raise TaskFailed(f"{head} has no snapshot of {source.repo} to copy",
                                 hint="model.fetch downloads it on the head: run it (do not --skip it)")
            for peer in ctx.nodes:
                if peer == head or not serves(inv, peer):
                    continue
                dest = dirs[peer][index]
                peer_entries = manifests[peer].get(dest.repo, (None, {}))[1]
                paths = missing_on_peer(wanted, peer_entries)
                if wanted and not paths:
                    continue
                size = sum(wanted[p][1] for p in paths if wanted[p][0] == "F")
                what = f"{len(paths)} files, {human_bytes(size)}" if wanted else f"once {head} has downloaded it"
                changes.append(Change(f"copy {source.repo} from {head} to {peer} over the fabric ({what})",
                                      payload=CopyStep(peer, source, dest.path, paths, size, _total(wanted)),
                                      node=peer))
        return changes

    def apply(self, ctx: ClusterContext, changes: list[Change[CopyStep]]) -> None:
        head = ctx.inventory.head.name
        head_ctx = ctx.nodes[head]
        for change in changes:
            step = change.carried()
            peer, source, dest, paths, size, total = (step.peer, step.source, step.dest, step.paths, step.size,
                                                       step.total)
            target, extra = peer_route(ctx.inventory, ctx.plan().fabric, head, peer)
            script = copy_script(source.path, dest, target, extra)
            measure = directory_size_reader(ctx.nodes[peer].transport, dest)
            started = time.monotonic()
            with TransferProgress(ctx.emit, task=self.name, node=peer, what=f"{source.repo} from {head}",
                                  measure=measure, total=total):
                result = head_ctx.transport.run(script, timeout=DOWNLOAD_TIMEOUT,
                                                input="".join(p + "\0" for p in paths))
            seconds = time.monotonic() - started
            if not result.ok:
                raise copy_failure(peer, source.repo, result)
            via = "rsync" if "via rsync" in result.stdout else "tar over ssh"
            ctx.emit(Event("log", task=self.name, node=peer, message=(
                f"copied {source.repo} from {head} to {peer} ({target}, {via}): {len(paths)} files, "
                f"{human_bytes(size)} in {seconds:.1f}s, {rate_text(size, seconds)}"),
                data={"copy": {"repo": source.repo, "from": head, "bytes": size, "seconds": round(seconds, 3),
                               "via": via}}))


def _total(entries: dict[str, tuple]) -> int:
    return sum(e[1] for e in entries.values() if e[0] == "F")

