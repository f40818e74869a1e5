"""model.copy (serve.distribute: copy): the head's snapshots reach the peers over the fabric, not from the Hub, each
file checked against the hash the Hub recorded for it (plan/hub_hashes.py, docs/models.md).

The head downloads (model.fetch); then, run ON the head, `rsync` (when both ends have it) or `tar | ssh peer
tar -x` sends each peer exactly the files it lacks, over the fabric, with the node's cluster key that ssh.mesh
set up (`ssh <peer fabric ip>` picks it from ~/.ssh/config). The controller never relays the bytes.

"Complete" is judged against the head's own snapshot, file by file: size for every file (hub blobs are named
by their hash), content (md5) for files under 64 KiB (refs/main, configs, download metadata), the target of
every symlink. A peer that already holds the same snapshot is ok; an interrupted copy resumes with what is
missing (rsync --partial also resumes inside a file).

A link that leaves the repo's folder is judged by what it resolves to: huggingface_hub 1.32 and later keep a
Xet-backed file once per cache (`hub/blobs/<hash[:2]>/<hash>`, utils/_shared_blobs.py) and make the repo's
`blobs/<etag>` a relative link to it, so the folder alone holds links to nothing elsewhere. The peer gets such a
file as a real file (`rsync --copy-links`, `tar -h`), and a peer's link that leads nowhere is a file it lacks.
"""

from __future__ import annotations

import posixpath
import time
from dataclasses import dataclass, field, replace

from sparkctl.plan import hub_hashes
from sparkctl.plan.render import render
from sparkctl.plan.serve import wanted_repos
from sparkctl.plan.ssh import FABRIC_SSH_OPTIONS, peer_routes
from sparkctl.rules.serving import copy_mode, serves
from sparkctl.taskgraph.events import Event
from sparkctl.taskgraph.task import Change, Scope, Task, TaskFailed
from sparkctl.tasks.context import ClusterContext, NodeContext
from sparkctl.tasks.model.cache import DOWNLOAD_TIMEOUT, repo_path
from sparkctl.tasks.model.progress import TransferProgress, directory_size_reader, human_bytes, rate_text
from sparkctl.tasks.model.verified import hash_files, keep_verified, remove_files, wrong_download
from sparkctl.transport.base import CommandResult, q

SMALL_FILE_BYTES = 64 * 1024
#: Copy streams per twin the head and a peer share. One ssh stream is held to one core's cipher and one TCP flow,
#: far below a CX-7 link (400-450 MB/s of about 23 GB/s, measured in the field); several, spread over both twins,
#: use more of both.
STREAMS_PER_TWIN = 2
REPO_MARK = "@@repo"


@dataclass(frozen=True)
class RepoDir:
    repo: str
    path: str   # on the node
    hub: bool   # the hub cache layout (refs/main, snapshots/<rev>/ -> blobs/), else a plain --local-dir
    verified: str = ""  # the node's record of what it verified there (hub layout only; plan/hub_hashes.py)


def repo_dirs(node_ctx: NodeContext) -> list[RepoDir]:
    out = []
    for repo, local in wanted_repos(node_ctx.inventory):
        path = repo_path(node_ctx, repo, local)
        out.append(RepoDir(repo, path, hub=local is None,
                           verified=hub_hashes.record_path(node_ctx.hf_cache_dir(), path) if local is None else ""))
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
        if d.hub:
            lines.append(hub_hashes.stat_script(d.path, d.verified))
    return "\n".join(lines)


@dataclass(frozen=True)
class Verified:
    """What a node verified of one repo (plan/hub_hashes.py): its record's lines, and each blob's stat now."""

    record: frozenset[str] = frozenset()
    stats: dict[str, tuple[str, str, str]] = field(default_factory=dict)

    def unverified(self, paths: list[str], reprove: bool) -> list[str]:
        return hub_hashes.unverified(paths, set(self.record), self.stats, reprove)


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


def parse_manifests(stdout: str) -> dict[str, Manifest]:
    out: dict[str, Manifest] = {}
    repo: str | None = None
    ref: str | None = None
    entries: dict[str, tuple] = {}
    resolved: dict[str, int] = {}
    md5s: dict[str, str] = {}

    def close() -> None:
        if repo is None:
            return
        outside = set()
        for path, entry in list(entries.items()):
            if entry[0] == "L" and _leaves(path, entry[1]) and path in resolved:
                entries[path] = ("F", resolved[path], "")  # a link to nothing stays a link: a file lacking
                outside.add(path)
        for path, digest in md5s.items():
            if path in entries and entries[path][0] == "F":
                entries[path] = ("F", entries[path][1], digest)
        out[repo] = Manifest(ref, entries, frozenset(outside))

    for line in stdout.splitlines():
        kind, _, rest = line.partition("\t")
        if kind == REPO_MARK:
            close()
            repo, ref, entries, resolved, md5s = rest, None, {}, {}, {}
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
    close()
    return out


def _leaves(path: str, target: str) -> bool:
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


def copy_script(source: str, dest: str, target: str, extra_options: str = "", *, dereference: bool = False) -> str:
    """Run on the head, the NUL-separated file list on stdin. Prints `via rsync` or `via tar` first.
    `dereference`: the listed paths are links, sent as the files they lead to."""
    ssh = f"ssh {FABRIC_SSH_OPTIONS} {extra_options}".strip()
    remote_tar = f"tar -C {q(dest)} -xf -"
    rsync_links, tar_links = ("--copy-links ", "-h ") if dereference else ("", "")
    return "\n".join([
        "set -o pipefail",
        f'e="{ssh}"',
        f"$e {q(target)} {q('mkdir -p ' + q(dest))} </dev/null || exit 3",
        f"if command -v rsync >/dev/null 2>&1 && $e {q(target)} 'command -v rsync' </dev/null >/dev/null 2>&1; "
        "then echo via rsync; "
        f'rsync -a {rsync_links}--partial --from0 --files-from=- -e "$e" {q(source + "/")} '
        f'{q(target + ":" + dest + "/")}; '
        f"else echo via tar; tar -C {q(source)} {tar_links}--null -T - -cf - | $e {q(target)} {q(remote_tar)}; fi",
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
    outside: frozenset[str] = frozenset()  # of paths: links on the head out of the repo, sent as their files
    #: of paths: the head's links that stay in the repo (the snapshot's), sent as links after the files
    links: frozenset[str] = frozenset()
    #: path -> bytes of the files to send (how the streams share them)
    sizes: tuple[tuple[str, int], ...] = ()
    #: blobs on `peer` (the head itself: its own download) to hash against their etag before anything is sent
    verify: tuple[str, ...] = ()
    #: `peer`'s record of verified blobs as read (kept where still true, with what this step verifies)
    recorded: frozenset[str] = frozenset()
    record_path: str = ""


class ModelCopyTask(Task[ClusterContext, CopyStep]):
    name = "model.copy"
    phase = "model"
    scope = Scope.CLUSTER
    needs = ("model.fetch",)
    description = ("serve.distribute: copy: send the head's model and draft to the peers over the fabric, every file "
                   "checked against the hash the Hub recorded for it")
    checks = ("each peer's model snapshot (hub cache, current revision) and draft dir hold every file of the "
              "head's, same size (same md5 under 64 KiB, same symlink targets; a link out of the repo's folder, "
              "into huggingface_hub 1.32's shared blob store, as the file it leads to, and a peer's link that "
              "leads nowhere as a file it lacks); the head's own snapshot has no link to nothing; every blob of the "
              "snapshot, on the head and on each peer, verified against its etag (sha256, or git blob sha1) since "
              "its size, mtime and inode last changed (<hf_cache>/sparkctl-verified/; --reprove: all); nothing to "
              "do in download mode")
    changes = ("hashes what is not verified (each file read once): a wrong file of the head's is removed and the run "
               "fails (the next downloads it), a peer's is removed and sent again; then, run on the head, `rsync -a "
               "--partial` (both ends have rsync) or `tar | ssh <peer fabric ip> tar -x` with the cluster key, only "
               "the missing files, the shared store's as real files (`--copy-links`, `tar -h`), hashed on arrival; "
               "logs bytes, seconds and MB/s")

    def check(self, ctx: ClusterContext) -> list[Change[CopyStep]]:
        inv = ctx.inventory
        if not copy_mode(inv):
            return []
        head = ctx.head().name
        dirs = {name: repo_dirs(node) for name, node in ctx.nodes.items() if serves(inv, name)}
        results = ctx.run_on_all({name: manifest_script(d) for name, d in dirs.items()}, timeout=300)
        manifests, verified = {}, {}
        for name, result in results.items():
            if not result.ok:
                raise TaskFailed(f"reading the HF cache on {name} failed", details=result.stderr.splitlines()[-3:])
            manifests[name], verified[name] = parse_manifests(result.stdout), parse_verified(result.stdout)
        reprove = ctx.options.reprove
        changes = []
        for index, source in enumerate(dirs[head]):
            held = manifests[head].get(source.repo, Manifest(None, {}))
            wanted = snapshot_entries(source.hub, held.ref, held.entries)
            if not wanted and not ctx.options.check:
                raise TaskFailed(f"{head} has no snapshot of {source.repo} to copy",
                                 hint="model.fetch downloads it on the head: run it (do not --skip it)")
            nowhere = sorted(p for p, e in wanted.items() if e[0] == "L" and _leaves(p, e[1]))
            if nowhere:
                raise TaskFailed(f"{head}'s snapshot of {source.repo} has {len(nowhere)} link(s) to nothing "
                                 f"outside its folder (e.g. {nowhere[0]} -> {wanted[nowhere[0]][1]})",
                                 hint="the cache's shared blob store lost those files: remove the repo's folder "
                                      "on the head and rerun (model.fetch downloads it again)")
            blobs = [p for p in wanted if hub_hashes.etag_of(p)]
            mine = verified[head].get(source.repo, Verified())
            check_head = mine.unverified(blobs, reprove)
            if check_head:
                size = sum(wanted[p][1] for p in check_head)
                changes.append(Change(f"verify {len(check_head)} files of {source.repo} on {head} against the "
                                      f"hashes the Hub recorded ({human_bytes(size)})",
                                      payload=CopyStep(head, source, source.path, [], size, size,
                                                       verify=tuple(check_head), recorded=mine.record,
                                                       record_path=source.verified), node=head))
            for peer in ctx.nodes:
                if peer == head or not serves(inv, peer):
                    continue
                dest = dirs[peer][index]
                peer_entries = manifests[peer].get(dest.repo, Manifest(None, {})).entries
                paths = missing_on_peer(wanted, peer_entries)
                theirs = verified[peer].get(dest.repo, Verified())
                check_peer = theirs.unverified([p for p in blobs if p not in paths], reprove)
                if wanted and not paths and not check_peer:
                    continue
                size = sum(wanted[p][1] for p in paths if wanted[p][0] == "F")
                what = f"{len(paths)} files, {human_bytes(size)}" if wanted else f"once {head} has downloaded it"
                summary = f"copy {source.repo} from {head} to {peer} over the fabric ({what})"
                if wanted and not paths:
                    summary = (f"verify {len(check_peer)} files of {source.repo} on {peer} against the hashes the "
                               f"Hub recorded (a wrong one is sent again from {head})")
                step = CopyStep(peer, source, dest.path, paths, size, _total(wanted),
                                held.outside & frozenset([*paths, *check_peer]),
                                links=frozenset(p for p, e in wanted.items() if e[0] == "L" and p not in held.outside),
                                sizes=tuple((p, e[1]) for p, e in wanted.items() if e[0] == "F"),
                                verify=tuple(check_peer), recorded=theirs.record,
                                record_path=dest.verified)
                changes.append(Change(summary, payload=step, node=peer))
        return changes

    def apply(self, ctx: ClusterContext, changes: list[Change[CopyStep]]) -> None:
        head = ctx.inventory.head.name
        for change in changes:
            step = change.carried()
            node = ctx.nodes[step.peer]
            good: list[str] = []
            if step.verify:
                good, wrong = hash_files(node, step.dest, step.verify)
                if wrong and step.peer == head:
                    remove_files(node, step.dest, wrong, step.source.repo)
                    raise wrong_download(step.source.repo, head, wrong)
                if wrong:
                    ctx.emit(Event("log", task=self.name, node=step.peer, message=(
                        f"{len(wrong)} file(s) of {step.source.repo} on {step.peer} do not match the hash the Hub "
                        f"recorded: sending them again from {head}")))
                    remove_files(node, step.dest, wrong, step.source.repo)
                    sizes = dict(step.sizes)
                    step = replace(step, paths=missing_first([*step.paths, *wrong]),
                                   size=step.size + sum(sizes.get(w, 0) for w in wrong))
            if step.paths:
                self._send(ctx, step)
                sent = [p for p in step.paths if hub_hashes.etag_of(p)]
                if sent:
                    arrived, wrong = hash_files(node, step.dest, sent)
                    if wrong:
                        raise TaskFailed(f"{len(wrong)} file(s) of {step.source.repo} on {step.peer} still do not "
                                         f"match the Hub's hash after the copy from {head} (e.g. {wrong[0]})",
                                         hint=f"check the disk of {step.peer}; a rerun sends them again")
                    good += arrived
            if good:
                keep_verified(node, step.record_path, step.recorded, good)

    def _send(self, ctx: ClusterContext, step: CopyStep) -> None:
        head = ctx.inventory.head.name
        head_ctx = ctx.nodes[head]
        peer, source, dest, paths, size, total = step.peer, step.source, step.dest, step.paths, step.size, step.total
        routes = peer_routes(ctx.inventory, ctx.plan().fabric, head, peer)
        measure = directory_size_reader(ctx.nodes[peer].transport, dest)
        started = time.monotonic()
        # the files first, over several streams (a link out of the repo sent as the file it leads to), then the
        # snapshot's links and refs/main, once every file they lead to is there
        files = [p for p in paths if p in step.outside or (p not in step.links and p != "refs/main")]
        rest = [p for p in paths if p not in files]
        streams = share_out(files, dict(step.sizes), STREAMS_PER_TWIN * len(routes))
        outputs = ""
        with TransferProgress(ctx.emit, task=self.name, node=peer, what=f"{source.repo} from {head}",
                              measure=measure, total=total):
            if streams:
                allow = [str(a.ip) for a in ctx.plan().fabric.addresses.get(head, {}).values()]
                outputs += self._streams(head_ctx, step, routes, streams, allow)
            if rest:
                target, extra = routes[0]
                result = head_ctx.transport.run(copy_script(source.path, dest, target, extra),
                                                timeout=DOWNLOAD_TIMEOUT, input="".join(p + "\0" for p in rest))
                if not result.ok:
                    raise copy_failure(peer, source.repo, result)
                outputs += result.stdout
        seconds = time.monotonic() - started
        via = next((v for mark, v in (("via rsync daemon", "rsync's daemon"), ("via rsync", "rsync"))
                    if mark in outputs), "tar over ssh")
        used = sorted({routes[i % len(routes)][0] for i in range(len(streams))} or {routes[0][0]})
        ctx.emit(Event("log", task=self.name, node=peer, message=(
            f"copied {source.repo} from {head} to {peer} ({', '.join(used)}, {via}, {max(1, len(streams))} "
            f"stream(s)): {len(paths)} files, {human_bytes(size)} in {seconds:.1f}s, {rate_text(size, seconds)}"),
            data={"copy": {"repo": source.repo, "from": head, "bytes": size, "seconds": round(seconds, 3),
                           "via": via, "streams": len(streams), "twins": used}}))


    @staticmethod
    def _streams(head: NodeContext, step: CopyStep, routes: list[tuple[str, str]], streams: list[list[str]],
                 allow: list[str]) -> str:
        lists = head.must('mktemp -d "${TMPDIR:-/tmp}/sparkctl-copy.XXXXXX"', "making the copy's file lists") \
            .stdout.strip().splitlines()[-1]
        try:
            for i, paths in enumerate(streams):
                head.transport.put(f"{lists}/list.{i}", "".join(p + "\0" for p in paths), mode=0o600)
            result = head.transport.run(streams_script(step.source.path, step.dest, routes, streams, lists,
                                                       repo=step.source.repo, peer=step.peer, allow=allow),
                                        timeout=DOWNLOAD_TIMEOUT)
        finally:
            head.run(f"rm -rf {q(lists)}", timeout=30)
        if not result.ok:
            raise copy_failure(step.peer, step.source.repo, result)
        return result.stdout


def share_out(paths: list[str], sizes: dict[str, int], streams: int) -> list[list[str]]:
    """The files shared among at most `streams` streams, about the same bytes each (the largest first, each to the
    stream with the fewest bytes so far); no empty stream."""
    buckets: list[tuple[int, list[str]]] = [(0, []) for _ in range(max(1, min(streams, len(paths))))]
    for path in sorted(paths, key=lambda p: (-sizes.get(p, 0), p)):
        index = min(range(len(buckets)), key=lambda i: (buckets[i][0], i))
        held, members = buckets[index]
        buckets[index] = (held + sizes.get(path, 0), [*members, path])
    return [members for _, members in buckets if members]


def streams_script(source: str, dest: str, routes: list[tuple[str, str]], streams: list[list[str]], lists: str, *,
                   repo: str = "", peer: str = "", allow: list[str] | None = None) -> str:
    """Run on the head (templates/copy-streams.sh.j2): one copy per stream at once, stream i to
    routes[i % len(routes)] (each twin its own address), the files it sends listed NUL-separated in <lists>/list.<i>,
    links followed. With rsync on both ends and every route on the fabric, rsync's daemon on the peer for this copy
    takes them from the head's fabric addresses (`allow`); else tar over ssh. The folders they land in are made
    first, once (two tar -x making the same folder at once: one fails)."""
    folders = sorted({posixpath.dirname(p) for paths in streams for p in paths} - {""})
    made = f"mkdir -p {q(dest)}" + "".join(f" {q(posixpath.join(dest, f))}" for f in folders)
    used = [routes[i % len(routes)] for i in range(len(streams))]
    options = [(FABRIC_SSH_OPTIONS + " " + extra).split() for _target, extra in routes]
    return render("copy-streams.sh.j2", repo=repo, peer=peer, lists=lists, source=source, dest=dest, made=made,
                  control_target=routes[0][0], control_options=options[0],
                  daemon=bool(allow) and all(not extra for _target, extra in routes),
                  addresses=list(dict.fromkeys(target for target, _extra in used)), allow=allow or [],
                  seconds=int(DOWNLOAD_TIMEOUT), stream_addresses=[target for target, _extra in used],
                  stream_routes=[{"target": target, "options": (FABRIC_SSH_OPTIONS + " " + extra).split()}
                                 for target, extra in used])


def _total(entries: dict[str, tuple]) -> int:
    return sum(e[1] for e in entries.values() if e[0] == "F")

