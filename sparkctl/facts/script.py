"""The POSIX sh script that reads every fact in one round trip, one framed section per entry of
facts/sections.py (sparkctl/transport/framing.py). A missing command only makes its section empty.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from sparkctl.facts.sections import DEFAULT_HF_CACHE, FactSection, FactsRequest, rendered
from sparkctl.transport.base import q
from sparkctl.transport.framing import Framing, held_output

# Run a command under `timeout` when the node has it, so a hung daemon (docker) cannot eat the round trip.
_HELPERS = r"""_t() { if command -v timeout >/dev/null 2>&1; then timeout "$@"; else shift; "$@"; fi; }
_has() { command -v "$1" >/dev/null 2>&1; }"""
# Root or not, and whether `sudo -n` works: with a temp dir, the privileged shell finds out by trying it once
# (_privileged_job); without one, asked here for the privileged sections run inline.
_PRELUDE = _HELPERS + r"""
_T0=$SECONDS
_D=$(mktemp -d 2>/dev/null) || _D=""
if [ "${EUID:-$(id -u 2>/dev/null)}" = 0 ]; then _S=""; _SUDO_OK=1
elif [ -n "$_D" ]; then _S="sudo -n"; _SUDO_OK=""
elif sudo -n true >/dev/null 2>&1; then _S="sudo -n"; _SUDO_OK=1
else _S=""; _SUDO_OK=0; fi"""

#: How much longer than the facts the side reads may take before they are left out, at least (whole seconds: bash's
#: $SECONDS measures the facts); as long again as the facts took when that is longer.
SIDE_GRACE_S = 3


def render_script(nonce: str, *, container_names: Iterable[str] = (), image_refs: Iterable[str] = (),
                  hf_cache: str = DEFAULT_HF_CACHE, guard_dirs: Iterable[str] = (),
                  side_reads: Mapping[str, tuple[str, float]] | None = None) -> str:
    return render_request(nonce, FactsRequest(tuple(container_names), tuple(image_refs), hf_cache, tuple(guard_dirs)),
                          side_reads)


def render_request(nonce: str, request: FactsRequest,
                   side_reads: Mapping[str, tuple[str, float]] | None = None) -> str:
    """`side_reads`: name -> (bash script, seconds): read-only scripts of later tasks, run in the background
    beside the facts (each bounded by its seconds, and by SIDE_GRACE_S past the facts or as long again as they
    took) and printed as section `side:<i>` (the i-th given; rc 1 and no output when it did not finish); without a
    private temp dir they are not run at all (a side read only saves time, it is never needed)."""
    side = list((side_reads or {}).items())
    sections = rendered(request)
    # Without a private temp dir (no mktemp, full /tmp) every section simply runs in order.
    hold, send = held_output("${_D:+$_D/.out}", 'rm -rf "$_D"')
    parts = [_PRELUDE.strip(), hold]
    for entry, body in sections:
        if entry.concurrent and not entry.privileged:
            name = entry.name
            parts.append(f'if [ -n "$_D" ]; then {{ {{\n{body}\n}} >"$_D/{name}" 2>/dev/null; '
                         f'echo $? >"$_D/{name}.rc"; }} 3>&- & _FP="$_FP $!"; fi')
    privileged = [(entry, body) for entry, body in sections if entry.privileged]
    if privileged:
        parts.append(_privileged_job(privileged))
    if side:
        # `timeout` run as the job itself (not through _t), so that its PID is known: stopped, it stops the
        # whole side read (it leads its own process group and passes the signal on)
        parts.append('_TO=""; _has timeout && _TO=timeout')
    for i, (_name, (body, seconds)) in enumerate(side):
        # nothing of the round trip's own stdin/stdout (nor fd 3, its held stdout) stays open in it: one left out
        # must not hold the channel.
        # side-i.job: the job's shell, side-i.pid: the read (its timeout), side-i.rc: its exit status, once done
        parts.append(f'if [ -n "$_D" ]; then {{ $_TO ${{_TO:+{max(1.0, float(seconds)):g}}} bash -c {q(body)} '
                     f'>"$_D/side-{i}" 2>/dev/null & echo $! >"$_D/side-{i}.pid"; wait $!; '
                     f'echo $? >"$_D/side-{i}.rc"; }} </dev/null >/dev/null 2>&1 3>&- & '
                     f'echo $! >"$_D/side-{i}.job"; _SP="$_SP $!"; fi')
    framing = Framing(nonce)
    for entry, body in sections:
        name = entry.name
        if entry.concurrent or entry.privileged:
            # wait for the facts' own background jobs (not the side reads): they run in parallel anyway
            parts.append(f"{framing.begin(name)}\n"
                         f'if [ -n "$_D" ]; then wait $_FP; cat "$_D/{name}"; _rc=1; read -r _rc <"$_D/{name}.rc"\n'
                         f"else {{\n{body}\n}}; _rc=$?; fi\n"
                         f"{framing.end(name, '$_rc')}")
        else:
            parts.append(framing.section(name, body))
    if side:
        # the side reads get SIDE_GRACE_S more once the facts are read, or as long again as the facts took (a node
        # under load is as slow for both); one still running then is stopped (its
        # job's shell first, so that it leaves no exit status, then the read) and left out: its task reads for
        # itself, so a slow or broken peer never holds the facts up for long. The wait ends the moment the last
        # one does (a poll would add its tick to every no-op); the stopper holds nothing of the round trip's
        # output open, so one left behind never holds the channel.
        parts.append(f'if [ -n "$_SP" ]; then _G=$((SECONDS - _T0)); '
                     f'[ "$_G" -lt {SIDE_GRACE_S} ] && _G={SIDE_GRACE_S}; {{ sleep $_G; for _j in "$_D"/side-*.job; do '
                     '_s=${_j%.job}; [ -e "$_s.rc" ] || kill $(cat "$_j") $(cat "$_s.pid" 2>/dev/null) 2>/dev/null; '
                     'done; } </dev/null >/dev/null 2>&1 3>&- & _W=$!; wait $_SP 2>/dev/null; kill $_W 2>/dev/null; fi')
    for i in range(len(side)):
        parts.append(f"{framing.begin(f'side:{i}')}\n"
                     f'_rc=1; if [ -n "$_D" ] && [ -e "$_D/side-{i}.rc" ]; then cat "$_D/side-{i}"; '
                     f'read -r _rc <"$_D/side-{i}.rc"; fi\n'
                     f"{framing.end(f'side:{i}', '$_rc')}")
    return "\n".join(parts) + f"\n{send}\nexit 0\n"


def _privileged_job(sections: list[tuple[FactSection, str]]) -> str:
    """The privileged sections, each in the background of ONE root shell writing into the script's temp dir
    (its files stay readable and removable by the user: the dir is theirs). As root already, no sudo; else one
    `sudo -n`, and when that is refused (a password, or no rule for a shell) the same shell as the user with
    `$_SUDO_OK` 0."""
    jobs = [f'{{ {{\n{body}\n}} >{entry.name} 2>/dev/null; echo $? >{entry.name}.rc; }} &' for entry, body in sections]
    # umask 022: the user reads what root wrote (sudo keeps a stricter umask of theirs: 027 would leave every
    # section unreadable); set -C: root never writes through a file or link already there (the dir is the user's);
    # a dir root may not enter (root-squashed NFS) fails the shell before its mark, and the user's runs instead
    inner = "\n".join([_HELPERS, '_S=""; _SUDO_OK=$2; export LC_ALL=C; umask 022; cd "$1" || exit 1; set -C',
                       ": >.privileged", *jobs, "wait"])
    return (f'if [ -n "$_D" ]; then {{ if [ -n "$_S" ]; then $_S bash -c {q(inner)} _ "$_D" 1 2>/dev/null || '
            f'[ -e "$_D/.privileged" ] || bash -c {q(inner)} _ "$_D" 0; '
            f'else bash -c {q(inner)} _ "$_D" "$_SUDO_OK"; fi; }} </dev/null >/dev/null 2>&1 3>&- & _FP="$_FP $!"; fi')
