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

import functools
import time
from dataclasses import dataclass, replace

from sparkctl.plan import hub_hashes
from sparkctl.plan.copy_tree import next_round
from sparkctl.plan.ssh import peer_routes
from sparkctl.rules.serving import copy_mode, serves
from sparkctl.taskgraph.events import Event
from sparkctl.taskgraph.task import Change, Scope, Task, TaskFailed
from sparkctl.tasks.context import ClusterContext, NodeContext
from sparkctl.tasks.model.cache import DOWNLOAD_TIMEOUT
from sparkctl.tasks.model.manifest import (
    Manifest,
    RepoDir,
    Verified,
    leaves_repo,
    manifest_script,
    missing_first,
    missing_on_peer,
    parse_manifests,
    parse_verified,
    repo_dirs,
    snapshot_entries,
    total_bytes,
)
from sparkctl.tasks.model.progress import TransferProgress, directory_size_reader, human_bytes, rate_text
from sparkctl.tasks.model.streams import STREAMS_PER_TWIN, copy_failure, copy_script, share_out, streams_script
from sparkctl.tasks.model.verified import hash_files, keep_verified, remove_files, wrong_download
from sparkctl.transport.base import q


@dataclass(frozen=True)
class CopyStep:
    """One repo to send to one peer (from the head, or in a tree from a peer that holds it already)."""

    peer: str
    source: RepoDir  # the head's

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
    #: a --local-dir's files -> their etag, from the head's download metadata (a hub blob names its own)
    etags: tuple[tuple[str, str], ...] = ()
    index: int = 0  # of the repo among the wanted ones (the model, the draft): where it lies on every node
    #: the peers the check found holding the repo whole and verified: they may send it on (a tree)
    holders: frozenset[str] = frozenset()

    def etag_map(self) -> dict[str, str]:
        return dict(self.etags)


class ModelCopyTask(Task[ClusterContext, CopyStep]):
    name = "model.copy"
    phase = "model"
    scope = Scope.CLUSTER
    needs = ("model.fetch",)
    description = ("serve.distribute: copy: send the head's model and draft to the peers over the fabric, every file "
                   "checked against the hash the Hub recorded for it")
    checks = ("each peer's model snapshot (hub cache, the head's refs/main: the pin once model.fetch ran) and "
              "draft dir hold every file of the head's, same size (same md5 under 64 KiB, same symlink targets; a "
              "link out of the repo's folder, into huggingface_hub 1.32's shared blob store, as the file it leads "
              "to, and a peer's link that "
              "leads nowhere as a file it lacks); the head's own snapshot has no link to nothing; every blob of the "
              "snapshot and every file of the draft's --local-dir (its etag from the head's download metadata), on "
              "the head and on each peer, verified against its etag (sha256, or git blob sha1) since its size, "
              "mtime and inode last changed (<hf_cache>/sparkctl-verified/; --reprove: all); nothing to do in "
              "download mode")
    changes = ("hashes what is not verified (each file read once): a wrong file of the head's is removed and the run "
               "fails (the next downloads it), a peer's is removed and sent again; then round by round (a tree at "
               "4+ nodes: every node that holds the repo sends to one that lacks it, over a cable they share where "
               "it can), only the missing files: several streams over every twin through rsync's daemon on the "
               "receiver, started for the copy with a one-time secret (tar over ssh where an end lacks rsync), the "
               "shared store's as real files, hashed on arrival; logs who sent, bytes, seconds and MB/s")

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
        peers = [name for name in ctx.nodes if name != head and serves(inv, name)]
        changes = []
        for index, source in enumerate(dirs[head]):
            whole: set[str] = set()
            steps: list[tuple[str, CopyStep, str]] = []
            held = manifests[head].get(source.repo, Manifest(None, {}))
            wanted = snapshot_entries(source.hub, held.ref, held.entries)
            if not wanted and not ctx.options.check:
                raise TaskFailed(f"{head} has no snapshot of {source.repo} to copy",
                                 hint="model.fetch downloads it on the head: run it (do not --skip it)")
            nowhere = sorted(p for p, e in wanted.items() if e[0] == "L" and leaves_repo(p, e[1]))
            if nowhere:
                raise TaskFailed(f"{head}'s snapshot of {source.repo} has {len(nowhere)} link(s) to nothing "
                                 f"outside its folder (e.g. {nowhere[0]} -> {wanted[nowhere[0]][1]})",
                                 hint="the cache's shared blob store lost those files: remove the repo's folder "
                                      "on the head and rerun (model.fetch downloads it again)")
            etags = held.etags
            blobs = [p for p in wanted if hub_hashes.etag_of(p, etags)]
            mine = verified[head].get(source.repo, Verified())
            check_head = mine.unverified(blobs, reprove, etags)
            if check_head:
                size = sum(wanted[p][1] for p in check_head)
                changes.append(Change(f"verify {len(check_head)} files of {source.repo} on {head} against the "
                                      f"hashes the Hub recorded ({human_bytes(size)})",
                                      payload=CopyStep(head, source, source.path, [], size, size,
                                                       verify=tuple(check_head), recorded=mine.record,
                                                       record_path=source.verified,
                                                       etags=tuple(sorted(etags.items())), index=index), node=head))
            for peer in peers:
                dest = dirs[peer][index]
                peer_entries = manifests[peer].get(dest.repo, Manifest(None, {})).entries
                paths = missing_on_peer(wanted, peer_entries)
                theirs = verified[peer].get(dest.repo, Verified())
                check_peer = theirs.unverified([p for p in blobs if p not in paths], reprove, etags)
                if wanted and not paths and not check_peer:
                    whole.add(peer)
                    continue
                size = sum(wanted[p][1] for p in paths if wanted[p][0] == "F")
                what = f"{len(paths)} files, {human_bytes(size)}" if wanted else f"once {head} has downloaded it"
                sender = head if len(peers) == 1 else f"{head} or a peer that holds it"
                summary = f"copy {source.repo} from {sender} to {peer} over the fabric ({what})"
                if wanted and not paths:
                    summary = (f"verify {len(check_peer)} files of {source.repo} on {peer} against the hashes the "
                               f"Hub recorded (a wrong one is sent again from {sender})")
                step = CopyStep(peer, source, dest.path, paths, size, total_bytes(wanted),
                                held.outside & frozenset([*paths, *check_peer]),
                                links=frozenset(p for p, e in wanted.items() if e[0] == "L" and p not in held.outside),
                                sizes=tuple((p, e[1]) for p, e in wanted.items() if e[0] == "F"),
                                verify=tuple(check_peer), recorded=theirs.record,
                                record_path=dest.verified, etags=tuple(sorted(etags.items())), index=index)
                steps.append((summary, step, peer))
            changes += [Change(summary, payload=replace(step, holders=frozenset(whole)), node=peer)
                        for summary, step, peer in steps]
        return changes

    def apply(self, ctx: ClusterContext, changes: list[Change[CopyStep]]) -> None:
        head = ctx.inventory.head.name
        steps = [change.carried() for change in changes]
        for step in steps:
            if step.peer == head:  # the head's own download, before any of it is sent
                good, wrong = hash_files(ctx.nodes[head], step.dest, step.verify, step.etag_map())
                if wrong:
                    remove_files(ctx.nodes[head], step.dest, wrong, step.source.repo)
                    raise wrong_download(step.source.repo, head, wrong)
                keep_verified(ctx.nodes[head], step.record_path, step.recorded, good)
        for index in sorted({step.index for step in steps if step.peer != head}):
            self._tree(ctx, [step for step in steps if step.peer != head and step.index == index])

    def _tree(self, ctx: ClusterContext, steps: list[CopyStep]) -> None:
        """One repo to the peers that lack it: each peer's own files checked first (in parallel; a wrong one is
        removed and sent again), then round by round from every node that holds it verified (plan/copy_tree.py)."""
        checked: dict[str, tuple[CopyStep, list[str]]] = {}
        ctx.each_node({step.peer: functools.partial(self._check_peer, ctx, step, checked) for step in steps})
        waiting = [peer for peer in ctx.inventory.serving_nodes() if peer in checked and checked[peer][0].paths]
        # the head and the peers the check found whole (never one outside --limit that lacks it too)
        holders = [ctx.inventory.head.name] + [name for name in ctx.inventory.serving_nodes()
                                               if name in steps[0].holders and name not in ctx.lost]
        fabric = ctx.plan().fabric

        def cabled(a: str, b: str) -> bool:
            return any(other == b for link in fabric.links(a) for other, _iface, _address in link.peers)

        while waiting:
            pairs = next_round(holders, waiting, cabled)
            ctx.each_node({receiver: functools.partial(self._receive, ctx, *checked[receiver], sender)
                           for sender, receiver in pairs})
            holders += [receiver for _sender, receiver in pairs]
            waiting = [peer for peer in waiting if peer not in holders]

    def _check_peer(self, ctx: ClusterContext, step: CopyStep, checked: dict[str, tuple[CopyStep, list[str]]]) -> None:
        node = ctx.nodes[step.peer]
        good: list[str] = []
        if step.verify:
            good, wrong = hash_files(node, step.dest, step.verify, step.etag_map())
            if wrong:
                ctx.emit(Event("log", task=self.name, node=step.peer, message=(
                    f"{len(wrong)} file(s) of {step.source.repo} on {step.peer} do not match the hash the Hub "
                    "recorded: sending them again")))
                remove_files(node, step.dest, wrong, step.source.repo)
                sizes = dict(step.sizes)
                step = replace(step, paths=missing_first([*step.paths, *wrong]),
                               size=step.size + sum(sizes.get(w, 0) for w in wrong))
        if not step.paths and good:
            keep_verified(node, step.record_path, step.recorded, good)
        checked[step.peer] = (step, good)

    def _receive(self, ctx: ClusterContext, step: CopyStep, good: list[str], sender: str) -> None:
        """`sender` sends the step's files to its peer; each arrives hashed against the Hub's etag."""
        node = ctx.nodes[step.peer]
        self._send(ctx, step, sender)
        sent = [p for p in step.paths if hub_hashes.etag_of(p, step.etag_map())]
        arrived, wrong = hash_files(node, step.dest, sent, step.etag_map()) if sent else ([], [])
        if wrong:
            raise TaskFailed(f"{len(wrong)} file(s) of {step.source.repo} on {step.peer} still do not match the Hub's "
                             f"hash after the copy from {sender} (e.g. {wrong[0]})",
                             hint=f"check the disks of {step.peer} and {sender}; a rerun sends them again")
        if good or arrived:
            keep_verified(node, step.record_path, step.recorded, [*good, *arrived])

    def _send(self, ctx: ClusterContext, step: CopyStep, sender: str) -> None:
        source = repo_dirs(ctx.nodes[sender])[step.index] if sender != ctx.inventory.head.name else step.source
        peer, dest, paths, size, total = step.peer, step.dest, step.paths, step.size, step.total
        fabric = ctx.plan().fabric
        routes = peer_routes(ctx.inventory, fabric, sender, peer)
        measure = directory_size_reader(ctx.nodes[peer].transport, dest)
        started = time.monotonic()
        # the files first, over several streams (a link out of the head's repo sent as the file it leads to), then
        # the snapshot's links and refs/main, once every file they lead to is there
        files = [p for p in paths if p in step.outside or (p not in step.links and p != "refs/main")]
        rest = [p for p in paths if p not in files]
        streams = share_out(files, dict(step.sizes), STREAMS_PER_TWIN * len(routes))
        outputs = ""
        with TransferProgress(ctx.emit, task=self.name, node=peer, what=f"{source.repo} from {sender}",
                              measure=measure, total=total):
            if streams:
                allow = [str(a.ip) for a in fabric.addresses.get(sender, {}).values()]
                outputs += self._streams(ctx.nodes[sender], source, step, routes, streams, allow)
            if rest:
                target, extra = routes[0]
                result = ctx.nodes[sender].transport.run(copy_script(source.path, dest, target, extra),
                                                         timeout=DOWNLOAD_TIMEOUT,
                                                         input="".join(p + "\0" for p in rest))
                if not result.ok:
                    raise copy_failure(peer, source.repo, result)
                outputs += result.stdout
        seconds = time.monotonic() - started
        via = next((v for mark, v in (("via rsync daemon", "rsync's daemon"), ("via rsync", "rsync"))
                    if mark in outputs), "tar over ssh")
        used = sorted({routes[i % len(routes)][0] for i in range(len(streams))} or {routes[0][0]})
        ctx.emit(Event("log", task=self.name, node=peer, message=(
            f"copied {source.repo} from {sender} to {peer} ({', '.join(used)}, {via}, {max(1, len(streams))} "
            f"stream(s)): {len(paths)} files, {human_bytes(size)} in {seconds:.1f}s, {rate_text(size, seconds)}"),
            data={"copy": {"repo": source.repo, "from": sender, "bytes": size, "seconds": round(seconds, 3),
                           "via": via, "streams": len(streams), "twins": used}}))

    @staticmethod
    def _streams(sender: NodeContext, source: RepoDir, step: CopyStep, routes: list[tuple[str, str]],
                 streams: list[list[str]], allow: list[str]) -> str:
        lists = sender.must('mktemp -d "${TMPDIR:-/tmp}/sparkctl-copy.XXXXXX"', "making the copy's file lists") \
            .stdout.strip().splitlines()[-1]
        try:
            for i, paths in enumerate(streams):
                sender.transport.put(f"{lists}/list.{i}", "".join(p + "\0" for p in paths), mode=0o600)
            result = sender.transport.run(streams_script(source.path, step.dest, routes, streams, lists,
                                                         repo=source.repo, peer=step.peer, allow=allow),
                                          timeout=DOWNLOAD_TIMEOUT)
        finally:
            sender.run(f"rm -rf {q(lists)}", timeout=30)
        if not result.ok:
            raise copy_failure(step.peer, source.repo, result)
        return result.stdout
