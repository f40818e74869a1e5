"""The bash script that reads every fact in one round trip: the sections' functions (templates/facts.sh), then one
framed section per entry of facts/sections.py that runs (sparkctl/transport/framing.py). A missing command only
makes its section empty.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import NamedTuple

from sparkctl.facts.sections import DEFAULT_HF_CACHE, FactSection, FactsRequest, rendered
from sparkctl.shipped import shipped_text, without_comments
from sparkctl.transport.base import q, text_of
from sparkctl.transport.framing import Framing, held_output

#: How much longer than the facts the side reads may take before they are left out, at least (whole seconds: bash's
#: $SECONDS measures the facts); as long again as the facts took when that is longer.
SIDE_GRACE_S = 3
#: what the privileged sections' functions may call in the root shell (templates/facts.sh)
_ROOT_HELPERS = {"_t", "_tx", "_has", "_print", "_as_root", "_privileged", "_privileged_begin", "_lines_of",
                 "fact_netplan_guards"}


class SideRead(NamedTuple):
    """A later task's read-only script, run beside the facts (tasks/read_ahead.py)."""

    script: str
    seconds: float
    #: run in the root shell, after the privileged sections, where the node gives passwordless sudo (else not at
    #: all); bounded by `seconds` there too, not by the side reads' grace after the facts
    root: bool = False


def render_script(nonce: str, *, container_names: Iterable[str] = (), image_refs: Iterable[str] = (),
                  hf_cache: str = DEFAULT_HF_CACHE, guard_dirs: Iterable[str] = (),
                  side_reads: Mapping[str, tuple[str, float] | SideRead] | None = None,
                  label: str | None = None) -> str:
    return render_request(nonce, FactsRequest(tuple(container_names), tuple(image_refs), hf_cache, tuple(guard_dirs),
                                              label), side_reads)


def render_request(nonce: str, request: FactsRequest,
                   side_reads: Mapping[str, tuple[str, float] | SideRead] | None = None) -> str:
    """The facts' functions (templates/facts.sh), then the calls of the sections this request runs, each framed.
    `side_reads`: name -> (bash script, seconds): read-only scripts of later tasks, run in the background
    beside the facts (each bounded by its seconds, and by SIDE_GRACE_S past the facts or as long again as they
    took) and printed as section `side:<i>` (the i-th given; rc 1 and no output when it did not finish); without a
    private temp dir they are not run at all (a side read only saves time, it is never needed). A root read runs
    in the root shell instead, one after the other once its sections are done (SideRead)."""
    side = [(name, SideRead(*read)) for name, read in (side_reads or {}).items()]
    root_side = [i for i, (_name, read) in enumerate(side) if read.root]
    sections = rendered(request)
    # Without a private temp dir (no mktemp, full /tmp) every section simply runs in order.
    hold, send = held_output("${_D:+$_D/.out}", 'rm -rf "$_D"')
    parts = [shipped_text("facts.sh").rstrip(), _guards_function(), _print_function(), "_facts_begin", hold]
    # a section that waits on a daemon or walks a big table runs in the background from the top, into the temp dir,
    # and is printed in its place (_held): the round trip costs the slowest of them, not their sum
    # (_JOB: a section's last command may take the job's place, `exec`: its exit status is the job's, for `wait`)
    parts += [f'if [ -n "$_D" ]; then {{ _JOB=1\n{call}\n}} >"$_D/{entry.name}" 2>/dev/null 3>&- & '
              f'_FP+=("$!"); _FN[{entry.name}]=$!; fi'
              for entry, call in sections if entry.concurrent and not entry.privileged]
    privileged = [(entry, call) for entry, call in sections if entry.privileged]
    if privileged or root_side:
        # one after the other: the root shell is itself in the background of the facts, and a job per section
        # would be a process per section
        jobs = [f"  {{\n{call}\n}} >{entry.name} 2>/dev/null; echo $? >{entry.name}.rc"
                for entry, call in privileged]
        reads = _root_side_reads([(i, side[i][1]) for i in root_side])
        parts.append("\n".join(["_privileged() {", '  _privileged_begin "$@"', *jobs, *reads, "}"]))
        # the functions the root shell is given: what runs there and what that calls, nothing else of this shell
        called = sorted({call.split()[0] for _entry, call in privileged} | _ROOT_HELPERS)
        parts.append(f"_PF=({' '.join(called)})")
        parts.append('[ -n "$_D" ] && { _privileged_job </dev/null >/dev/null 2>&1 3>&- & _FP+=("$!"); '
                     '[ "${#_S[@]}" -gt 0 ] && _PJ=1; }')
    if len(root_side) < len(side):
        # one group per bound (in practice one: every read ahead has the same), one bash for each
        groups: dict[float, list[int]] = {}
        for i, (_name, read) in enumerate(side):
            if not read.root:
                groups.setdefault(max(1.0, float(read.seconds)), []).append(i)
        parts.append('if [ -n "$_D" ]; then')
        for seconds, members in groups.items():
            parts.append("_a=()")
            for i in members:
                parts.append(f"{_read_text(side[i][1].script)}\n"
                             f'[ -n "$_b" ] && _a+=({i} "$_b")')
            parts.append(f'[ "${{#_a[@]}}" -gt 0 ] && _sides {seconds:g} "${{_a[@]}}"')
        parts.append("fi")
    framing = Framing(nonce)
    # the sections of this shell first, then the jobs' in their place: the first of those waits for every job, and
    # this shell's own work is done by then (the reads take each section by its name, in any order)
    parts += [framing.section(entry.name, call) for entry, call in sections
              if not (entry.concurrent or entry.privileged)]
    parts += [f"{framing.begin(entry.name)}\n"
              f'if [ -n "$_D" ]; then _held {entry.name}{held_call(entry, call)}; '
              f'else {{\n{call}\n}}; _rc=$?; fi\n'
              f"{framing.end(entry.name, '$_rc')}"
              for entry, call in sections if entry.concurrent or entry.privileged]
    if len(root_side) < len(side):
        parts.append(f"_sides_wait {SIDE_GRACE_S}")
    for i in range(len(side)):
        out = "_root_side_out" if i in root_side else "_side_out"
        parts.append(f"{framing.begin(f'side:{i}')}\n{out} {i}\n{framing.end(f'side:{i}', '$_rc')}")
    return "\n".join(parts) + f"\n{send}\nexit 0\n"


def held_call(entry: FactSection, call: str) -> str:
    """The call that judges what a section's job left raw, for _held (templates/facts.sh), where it may leave any."""
    return f" {call}" if entry.judged_after and not entry.privileged else ""


def _read_text(body: str) -> str:
    """A side read's text into $_b, single-quoted: nothing of it expanded here. (A here-document was a pipe that
    `read -d ''` read a byte per system call, some 20,000 per facts read.)"""
    return f"# shellcheck disable=SC2016 # a read's own text, for eval\n_b={q(body)}"


#: the root reads' bash (_root_side_reads): each read in a subshell but the last, which this bash runs itself
#: (nothing runs after it). That one's exit status (an `exit` of its own's too) is written on the way out, into the
#: file named before it ran (it may change the working directory, or a variable); cut (`timeout` stops the whole
#: group), it writes none.
_ROOT_READS = ('while [ "$#" -gt 3 ]; do ( eval "$2" ) >"side-$1" 2>/dev/null; echo $? >"side-$1.rc"; shift 2; done; '
               'readonly _sr_rc="$PWD/side-$1.rc"; exec >"side-$1" 2>/dev/null; '
               """trap 'echo $? >"$_sr_rc"' EXIT; trap 'trap - EXIT; exit 143' TERM; eval "$2\"""")


def _root_side_reads(reads: list[tuple[int, SideRead]]) -> list[str]:
    """The root reads, the last thing the root shell does (in its temp dir, its sections written): only where it is
    root; one after the other in ONE bash under `timeout`, which the root shell becomes (`exec`: no process more for
    the bound; the user's stopper cannot signal root's processes, and the facts wait for the root shell), each in a
    subshell of its own (an `exit` or a syntax error of the read ends that read alone) but the last, which that bash
    runs itself, its exit status written once it ended (side-I.rc: none when it was cut)."""
    if not reads:
        return []
    seconds = max(1.0, min(float(read.seconds) for _i, read in reads))
    lines = ['  if [ "$_SUDO_OK" = 1 ]; then', "  _r=()"]
    for i, read in reads:
        lines += [_read_text(read.script), f'  [ -n "$_b" ] && _r+=({i} "$_b")']
    lines += [f'  [ "${{#_r[@]}}" -gt 0 ] && _tx {seconds:g} bash -c {q(_ROOT_READS)} _ "${{_r[@]}}" '
              "</dev/null >/dev/null 2>&1", "  fi"]
    return lines


def _print_function() -> str:
    """_print FILE (templates/facts.sh): the file's text as the tasks' reads print one (transport/base.py)."""
    return "_print() {\n  local _c\n  " + text_of('"$1"') + "\n}"


def _guards_function() -> str:
    """The netplan guards' reader (a file of its own: network.netplan runs it too) as the facts' function."""
    return f"fact_netplan_guards() {{\n{without_comments(shipped_text('netplan-guards.sh'))}\n}}"
