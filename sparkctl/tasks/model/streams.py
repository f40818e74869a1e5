"""How model.copy's bytes travel from a node that holds a repo to one that lacks it, over the fabric: one stream
(`rsync` or `tar | ssh`, for the snapshot's links and refs), or several at once over every twin the two share
(templates/copy-streams.sh.j2: rsync's daemon on the receiver for the copy, else tar over ssh)."""

from __future__ import annotations

import posixpath

from sparkctl.plan.render import render
from sparkctl.plan.ssh import FABRIC_SSH_OPTIONS
from sparkctl.taskgraph.task import TaskFailed
from sparkctl.tasks.model.cache import DOWNLOAD_TIMEOUT
from sparkctl.transport.base import CommandResult, q

#: Copy streams per twin the head and a peer share. One ssh stream is held to one core's cipher and one TCP flow,
#: far below a CX-7 link (400-450 MB/s of about 23 GB/s, measured in the field); several, spread over both twins,
#: use more of both.
STREAMS_PER_TWIN = 2


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
