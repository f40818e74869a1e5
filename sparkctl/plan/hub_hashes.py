"""PURE: a hub snapshot's files checked against the hashes the Hub recorded for them.

The hub cache names each blob by the etag the Hub returned for its file (huggingface_hub file_download.py): the
LFS sha256 of a weight (64 hex; a Xet-backed file keeps its LFS sha256 as its etag, the shared store of 1.32 and
later names the payload by its Xet hash but the repo's `blobs/<etag>` link keeps the etag), the git blob sha1 of a
file kept in git (40 hex). Hashing a 100+ GB model takes minutes, so each node keeps what it verified in
`<hf_cache>/sparkctl-verified/<repo folder>.tsv` (etag, size, mtime, inode): a file is read again only when one
of those changed (a rewrite, a truncation, another copy), or with `--reprove`.
"""

from __future__ import annotations

import posixpath
import re

from sparkctl.transport.base import q

VERIFIED_DIR = "sparkctl-verified"
#: one blob's stat as both scripts print it (GNU stat --printf; %.9Y: the mtime to the nanosecond)
STAT_FIELDS = "%s\\t%.9Y\\t%i\\n"
_LISTED = "S\\t%n\\t" + STAT_FIELDS
#: the same line from find's -printf: %T@ is the mtime with 10 digits after the point (the nanoseconds, then a 0)
_FOUND = "S\\t%P\\t%s\\t%T@\\t%i\\n"
_ETAG = re.compile(r"^blobs/([0-9a-f]{40}|[0-9a-f]{64})$")
_HEX_ETAG = re.compile(r"([0-9a-f]{40}|[0-9a-f]{64})\Z")
#: where huggingface_hub keeps a --local-dir download's metadata, inside that dir
LOCAL_META = ".cache/huggingface/download"


def etag_of(path: str, etags: dict[str, str] | None = None) -> str | None:
    """The etag a snapshot's blob path names (`blobs/<etag>`), else the one `etags` holds for it (a --local-dir's
    file: its download metadata's), None for any other path."""
    m = _ETAG.match(path)
    return m.group(1) if m else (etags or {}).get(path)


#: bash: the second line of the metadata file "$m" into $e (the shell's `read`, not a `sed` per file)
_SECOND_LINE = 'e=; { IFS= read -r e; IFS= read -r e; } 2>/dev/null <"$m"'


def local_etags_script(local_dir: str) -> str:
    """`E <file> <etag>` for each file of a --local-dir download that huggingface_hub kept metadata for: its
    `.cache/huggingface/download/<file>.metadata`, whose second line is the etag (huggingface_hub _local_folder.py,
    LocalDownloadFileMetadata: commit_hash, etag, timestamp)."""
    return (f"if cd {q(local_dir)}/{LOCAL_META} 2>/dev/null; then "
            "while IFS= read -r m; do f=${m%.metadata}; [ -f \"../../../$f\" ] || continue; "
            f"{_SECOND_LINE}; printf 'E\\t%s\\t%s\\n' \"$f\" \"$e\"; "
            "done < <(find . -type f -name '*.metadata' -printf '%P\\n'); cd /; fi")


def parse_etags(stdout: str) -> dict[str, str]:
    out = {}
    for line in stdout.splitlines():
        kind, _, rest = line.partition("\t")
        path, _, etag = rest.partition("\t")
        if kind == "E" and _HEX_ETAG.match(etag.strip()):
            out[path] = etag.strip()
    return out


def record_path(hf_cache_dir: str, repo_dir: str) -> str:
    return posixpath.join(hf_cache_dir, VERIFIED_DIR, posixpath.basename(repo_dir.rstrip("/")) + ".tsv")


def stat_script(repo_dir: str, record: str, hub: bool = True) -> str:
    """What the node verified before (`C` lines) and each blob's stat through its links (`S`: path, size, mtime,
    inode), after the manifest's lines; of a --local-dir (`hub` False): each of its files' but the metadata's."""
    # a --local-dir's files are regular files: find prints their stat itself (an `xargs` and a `stat` fewer), its
    # mtime with one digit more than stat's (parse_stats reads both alike)
    listed = (f"stat -L --printf {q(_LISTED)} blobs/*" if hub else
              f"find . -path ./.cache -prune -o -type f -printf {q(_FOUND)}")
    return (f"[ -r {q(record)} ] && while IFS= read -r l || [ -n \"$l\" ]; do printf 'C\\t%s\\n' \"$l\"; "
            f"done <{q(record)}; "
            f"if cd {q(repo_dir)} 2>/dev/null; then {listed} 2>/dev/null; cd /; fi")


def stat_line(etag: str, stat: tuple[str, str, str]) -> str:
    return "\t".join((etag, *stat))


def parse_stats(stdout: str) -> tuple[set[str], dict[str, tuple[str, str, str]]]:
    """(the record's lines, blob path -> (size, mtime, inode))."""
    record, stats = set(), {}
    for line in stdout.splitlines():
        kind, _, rest = line.partition("\t")
        if kind == "C":
            record.add(rest)
        elif kind == "S":
            path, size, mtime, inode = (rest.split("\t") + ["", "", "", ""])[:4]
            stats[path] = (size, _nanoseconds(mtime), inode)
    return record, stats


def _nanoseconds(mtime: str) -> str:
    """An mtime as `stat`'s %.9Y prints it: find's %T@ prints one digit more, a 0."""
    whole, dot, fraction = mtime.partition(".")
    return f"{whole}.{fraction[:9].ljust(9, '0')}" if dot and len(fraction) > 9 else mtime


def unverified(paths: list[str], record: set[str], stats: dict[str, tuple[str, str, str]],
               reprove: bool = False, etags: dict[str, str] | None = None) -> list[str]:
    """The blob paths among `paths` whose stat the node has not verified as it is now."""
    out = []
    for path in paths:
        etag = etag_of(path, etags)
        if etag is None:
            continue
        if reprove or path not in stats or stat_line(etag, stats[path]) not in record:
            out.append(path)
    return out


def each_snapshot_blob(repo_dir: str, body: str) -> str:
    """Shell running `body` once per blob the current snapshot's links lead to, `$b` its name under blobs/."""
    # one compound command: a caller's `cond && ` before it holds for all of it; the loop reads find's lines from a
    # process substitution, where a pipe would run it in a process of its own
    return (f"{{ r=; read -r r 2>/dev/null <{q(repo_dir)}/refs/main; [ -n \"$r\" ] && "
            f"while IFS= read -r b; do b=${{b##*/}}; {body}; done "
            f"< <(find {q(repo_dir)}/snapshots/\"$r\" -type l -printf '%l\\n' 2>/dev/null); }}")


def changed_since_verified_script(repo_dir: str, record: str) -> str:
    """One `U` line per blob of the current snapshot whose stat is not the one the node verified (nothing when
    it keeps no record there: it never verified that repo)."""
    return f"[ -f {q(record)} ] && " + each_snapshot_blob(repo_dir, (
        "case $b in *[!0-9a-f]*) continue ;; esac; "
        f"x=$(stat -L --printf {q(STAT_FIELDS)} {q(repo_dir)}/blobs/\"$b\" 2>/dev/null) || continue; "
        f"grep -qxF \"$(printf '%s\\t%s' \"$b\" \"$x\")\" {q(record)} || echo U"))


def changed_local_since_verified_script(local_dir: str, record: str) -> str:
    """The same for a --local-dir download: one `U` line per file with download metadata whose stat is not the one
    the node verified (nothing when it keeps no record there)."""
    return (f"[ -f {q(record)} ] && cd {q(local_dir)}/{LOCAL_META} 2>/dev/null && "
            "find . -type f -name '*.metadata' -printf '%P\\n' | while IFS= read -r m; do f=../../../${m%.metadata}; "
            f"{_SECOND_LINE}; case $e in *[!0-9a-f]*|'') continue ;; esac; "
            f"x=$(stat -L --printf {q(STAT_FIELDS)} \"$f\" 2>/dev/null) || continue; "
            f"grep -qxF \"$(printf '%s\\t%s' \"$e\" \"$x\")\" {q(record)} || echo U; done")


def hash_script(repo_dir: str, paths: list[str], etags: dict[str, str] | None = None) -> str:
    """Per blob path: `H <path> <digest> <size> <mtime> <inode>`, the digest of the kind its etag is (sha256 for
    64 hex, the git blob sha1 for 40), each file read once."""
    lines = [f"cd {q(repo_dir)} || exit 3"]
    for path in paths:
        etag = etag_of(path, etags) or ""
        if len(etag) == 64:
            digest = f"sha256sum < {q(path)}"
        else:
            digest = f"{{ printf 'blob %s\\0' \"$(stat -L -c %s {q(path)})\"; cat {q(path)}; }} | sha1sum"
        lines.append(f"d=$({digest} 2>/dev/null | cut -d' ' -f1); "
                     f"printf 'H\\t%s\\t%s\\t' {q(path)} \"$d\"; stat -L --printf {q(STAT_FIELDS)} {q(path)} "
                     "2>/dev/null || echo")
    return "\n".join(lines)


def parse_hashes(stdout: str) -> dict[str, tuple[str, tuple[str, str, str]]]:
    """path -> (digest, its stat when read)."""
    out = {}
    for line in stdout.splitlines():
        parts = line.split("\t")
        if len(parts) == 6 and parts[0] == "H":
            out[parts[1]] = (parts[2], (parts[3], parts[4], parts[5]))
    return out


def judged(hashes: dict[str, tuple[str, tuple[str, str, str]]],
           etags: dict[str, str] | None = None) -> tuple[list[str], list[str]]:
    """(record lines of the blobs that match their etag, the paths that do not)."""
    good, bad = [], []
    for path, (digest, stat) in sorted(hashes.items()):
        etag = etag_of(path, etags)
        if etag is not None and digest == etag:
            good.append(stat_line(etag, stat))
        else:
            bad.append(path)
    return good, bad
