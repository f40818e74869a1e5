"""The POSIX sh script that reads every fact in one round trip, one framed section per fact
(sparkctl/transport/framing.py). A missing command only makes its section empty.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from sparkctl.transport.base import q
from sparkctl.transport.framing import Framing

# Run a command under `timeout` when the node has it, so a hung daemon (docker) cannot eat the round trip.
_PRELUDE = r"""
_t() { if command -v timeout >/dev/null 2>&1; then timeout "$@"; else shift; "$@"; fi; }
_has() { command -v "$1" >/dev/null 2>&1; }
if [ "$(id -u 2>/dev/null)" = 0 ]; then _S=""; _SUDO_OK=1
elif sudo -n true >/dev/null 2>&1; then _S="sudo -n"; _SUDO_OK=1
else _S=""; _SUDO_OK=0; fi
"""

_STATIC_SECTIONS: list[tuple[str, str]] = [
    ("hostname", "hostname 2>/dev/null || cat /proc/sys/kernel/hostname"),
    ("os-release", "cat /etc/os-release 2>/dev/null || cat /usr/lib/os-release"),
    ("dgx-release", "cat /etc/dgx-release 2>/dev/null"),
    ("arch", "uname -m"),
    ("id", "id -un; id -u; id -Gn"),
    ("home", 'printf "%s\\n" "$HOME"'),
    ("sudo", "sudo -n true >/dev/null 2>&1"),
    ("ip-addr", "ip -j -d addr show"),
    # `read` instead of `$(cat ...)`: no fork per interface (forks are most of this script's cost).
    ("carrier", r"""for f in /sys/class/net/*/carrier; do
  [ -e "$f" ] || continue; n=${f%/carrier}; n=${n##*/}; c=
  read -r c < "$f" 2>/dev/null
  printf '%s %s\n' "$n" "$c"
done"""),
    # ibdev2netdev prints the netdev's operstate; the sysfs fallback prints the same line shape.
    ("roce", r"""if _has ibdev2netdev; then ibdev2netdev
else for d in /sys/class/infiniband/*; do
  [ -d "$d" ] || continue; dev=${d##*/}
  port=1; for p in "$d"/ports/*; do [ -e "$p" ] && { port=${p##*/}; break; }; done
  for n in "$d"/device/net/*; do
    [ -e "$n" ] || continue; nd=${n##*/}
    st=Down; o=; read -r o < /sys/class/net/"$nd"/operstate 2>/dev/null; [ "$o" = up ] && st=Up
    printf '%s port %s ==> %s (%s)\n' "$dev" "$port" "$nd" "$st"
  done
done; fi"""),
    # lldpcli is setuid _lldpd, mode 4750 _lldpd:adm on Debian/Ubuntu (and /usr/sbin is not in a user's PATH over
    # ssh): found by path, asked with sudo -n when that works. Only read: sparkctl never starts lldpd itself.
    ("lldp", r"""_L=$(command -v lldpcli 2>/dev/null)
for p in /usr/sbin/lldpcli /usr/local/sbin/lldpcli; do [ -z "$_L" ] && [ -e "$p" ] && _L=$p; done
if [ -z "$_L" ]; then echo '#absent'; else _t 10 $_S "$_L" show neighbors -f json 2>&1; fi"""),
    ("speed", r"""for f in /sys/class/net/*/speed; do
  [ -e "$f" ] || continue; n=${f%/speed}; n=${n##*/}; v=
  read -r v < "$f" 2>/dev/null
  printf 'sysfs %s %s\n' "$n" "$v"
done
if _has ethtool; then for n in /sys/class/infiniband/*/device/net/*; do
  [ -e "$n" ] || continue; nd=${n##*/}
  sp=$(ethtool "$nd" 2>/dev/null | sed -n 's/^[[:space:]]*Speed:[[:space:]]*//p')
  printf 'ethtool %s %s\n' "$nd" "$sp"
done; fi"""),
    ("ssh-connection", r"""printf '%s\n' "${SSH_CONNECTION:-}" """),
    ("routes", "ip -4 -o route show table main 2>/dev/null"),
    # sparkctl's own sysctl.d files (a relaying ring node's forwarding): name and base64 content
    ("sparkctl-sysctl", r"""for f in /etc/sysctl.d/*-sparkctl-*.conf; do
  [ -f "$f" ] || continue; printf '%s ' "$f"; base64 < "$f" | tr -d '\n'; echo
done"""),
    # forwarding and reverse-path filtering: a ring relays between neighbours (`read`: no fork per file)
    ("ipv4-conf", r"""for f in /proc/sys/net/ipv4/ip_forward /proc/sys/net/ipv4/conf/*/forwarding \
         /proc/sys/net/ipv4/conf/*/rp_filter; do
  [ -e "$f" ] || continue; v=; read -r v < "$f" 2>/dev/null; printf '%s %s\n' "${f#/proc/sys/net/ipv4/}" "$v"
done"""),
    # Netplan files are 0600 root: read with sudo -n when needed; base64 keeps any content intact.
    ("netplan", r"""for f in /etc/netplan/*.yaml; do
  [ -e "$f" ] || continue
  mode=$(stat -c %a "$f" 2>/dev/null || echo -)
  if [ -r "$f" ]; then c=$(base64 < "$f" | tr -d '\n') && c="b64:$c" || c=-
  elif [ "$_SUDO_OK" = 1 ]; then c=$($_S cat "$f" 2>/dev/null | base64 | tr -d '\n') && c="b64:$c" || c=-
  else c=-; fi
  printf '%s %s %s\n' "$mode" "$c" "$f"
done"""),
    # NetworkManager's view, when nmcli exists (DGX OS renders netplan through it): C locale for the words it
    # prints; readable by any user over D-Bus; nothing more is asked once it says it is not running. Three calls:
    # each costs ~50 ms of the round trip. Parsed in sparkctl/facts/networkmanager.py.
    ("nm", r"""if _has nmcli; then ( export LC_ALL=C
  echo '#devices'; _t 5 nmcli -t -f DEVICE,TYPE,STATE,CONNECTION device status 2>&1 || exit 0
  echo '#connections'
  _c=$(_t 5 nmcli -t -f UUID,NAME,TYPE,DEVICE,ACTIVE,AUTOCONNECT,AUTOCONNECT-PRIORITY,FILENAME connection show 2>&1)
  printf '%s\n' "$_c"
  echo '#settings'; _u=$(printf '%s\n' "$_c" | cut -d: -f1 | grep -E '^[0-9a-fA-F-]{36}$')
  if [ -n "$_u" ]; then _t 5 nmcli -t -f connection.uuid,connection.interface-name,802-3-ethernet.mac-address \
    connection show $_u 2>&1; fi )
else echo '#absent'; fi"""),
    ("docker-cli", "command -v docker"),
]

_TAIL_SECTIONS: list[tuple[str, str]] = [
    ("ss", "if [ \"$_SUDO_OK\" = 1 ]; then $_S ss -ltnpH 2>/dev/null || ss -ltnH; else ss -ltnpH; fi"),
    ("meminfo", "cat /proc/meminfo"),
    ("time", "date +%s.%N"),
    ("firewall", r"""if _has ufw; then echo '#ufw'; $_S ufw status 2>&1; fi
if _has nft; then echo '#nft'; $_S nft list ruleset 2>&1; fi
if _has iptables; then echo '#iptables'; $_S iptables -S INPUT 2>&1; fi"""),
]


def _docker_sections(container_names: Iterable[str], image_refs: Iterable[str]) -> list[tuple[str, str]]:
    """ONE docker command for everything docker knows that sparkctl asks: `docker inspect` of the containers and
    the images together (each docker call costs a client start, a daemon round trip and, with podman, its
    storage locks). Its stderr is kept, each line marked `#err `: "no such object" is an answer, a refused
    socket or a broken storage is not. With nothing to inspect, `docker ps` tells whether this user can talk to
    the daemon (on Docker and Podman alike)."""
    names = " ".join([*(q(n) for n in container_names), *(q(r) for r in image_refs)])
    if not names:
        return [("docker-info", "_has docker && _t 15 docker ps -q 2>&1 >/dev/null")]
    return [("docker", f"""_has docker && {{ _e=$(mktemp 2>/dev/null || echo /tmp/.sfi.$$)
_t 15 docker inspect {names} 2>"$_e"; _r=$?
sed 's/^/#err /' "$_e"; rm -f "$_e"; (exit $_r); }}""")]


#: Netplan revert guards armed by a run and neither confirmed nor reverted, whose process still waits: a run cut
#: (Ctrl-C, SIGKILL, a lost link) between `netplan apply` and its confirmation leaves one, and it reverts the
#: files later unless confirmed. Run as root (the state dirs are 0700 root); prints one guard id per line.
GUARDS_SCRIPT = r"""for d in "$@"; do for p in "$d"/guard-*.pid; do
  [ -e "$p" ] || continue; id=${p##*/guard-}; id=${id%.pid}
  if [ -e "$d/confirmed-$id" ] || [ -e "$d/reverted-$id" ]; then continue; fi
  pid=; read -r pid < "$p" 2>/dev/null
  [ -n "$pid" ] && grep -q "revert-$id.sh" /proc/"$pid"/cmdline 2>/dev/null && printf '%s\n' "$id"
done; done; true"""


def _guards_section(guard_dirs: Iterable[str]) -> tuple[str, str]:
    dirs = " ".join(q(d) for d in guard_dirs)
    return ("netplan-guards", f'if [ "$_SUDO_OK" = 1 ]; then $_S sh -c {q(GUARDS_SCRIPT)} sh {dirs}; '
                              "else echo '#unreadable'; fi")


def _hf_cache_section(hf_cache: str) -> tuple[str, str]:
    # `~` is expanded on the node; df needs an existing path, so walk up to the nearest existing parent.
    return ("hf-cache", f"""p={q(hf_cache)}
case $p in "~") p=$HOME ;; "~/"*) p=$HOME/${{p#"~/"}} ;; esac
printf '%s\\n' "$p"
d=$p; while [ ! -e "$d" ] && [ "$d" != / ] && [ "$d" != . ]; do d=$(dirname "$d"); done
df -B1 --output=avail "$d" 2>/dev/null | tail -n 1""")


#: Sections that wait on a daemon or walk a big table (docker/podman, nft, ss -p, ethtool): started together
#: in the background at the top and printed in their place, so the round trip costs the slowest, not the sum.
CONCURRENT = frozenset({"speed", "nm", "docker-info", "docker", "ss", "firewall"})
#: How much longer than the facts the side reads may take before they are left out.
SIDE_GRACE_S = 3.0


def render_script(nonce: str, *, container_names: Iterable[str] = (), image_refs: Iterable[str] = (),
                  hf_cache: str = "~/.cache/huggingface", guard_dirs: Iterable[str] = (),
                  side_reads: Mapping[str, tuple[str, float]] | None = None) -> str:
    """`side_reads`: name -> (bash script, seconds): read-only scripts of later tasks, run in the background
    beside the facts (each bounded by its seconds, and by SIDE_GRACE_S past the facts) and printed as section
    `side:<i>` (the i-th given; rc 1 and no output when it did not finish); without a private temp dir they are
    not run at all (a side read only saves time, it is never needed)."""
    guard_dirs = list(guard_dirs)
    side = list((side_reads or {}).items())
    sections = (_STATIC_SECTIONS + _docker_sections(container_names, image_refs)
                + [_hf_cache_section(hf_cache)] + ([_guards_section(guard_dirs)] if guard_dirs else [])
                + _TAIL_SECTIONS)
    # Without a private temp dir (no mktemp, full /tmp) every section simply runs in order.
    parts = [_PRELUDE.strip(), '_D=$(mktemp -d 2>/dev/null) || _D=""']
    for name, body in sections:
        if name in CONCURRENT:
            parts.append(f'if [ -n "$_D" ]; then {{ {{\n{body}\n}} >"$_D/{name}" 2>/dev/null; '
                         f'echo $? >"$_D/{name}.rc"; }} & _FP="$_FP $!"; fi')
    if side:
        # `timeout` run as the job itself (not through _t), so that its PID is known: stopped, it stops the
        # whole side read (it leads its own process group and passes the signal on)
        parts.append('_TO=""; _has timeout && _TO=timeout')
    for i, (_name, (body, seconds)) in enumerate(side):
        # nothing of the round trip's own stdin/stdout stays open in it: one left out must not hold the channel.
        # side-i.job: the job's shell, side-i.pid: the read (its timeout), side-i.rc: its exit status, once done
        parts.append(f'if [ -n "$_D" ]; then {{ $_TO ${{_TO:+{max(1.0, float(seconds)):g}}} bash -c {q(body)} '
                     f'>"$_D/side-{i}" 2>/dev/null & echo $! >"$_D/side-{i}.pid"; wait $!; '
                     f'echo $? >"$_D/side-{i}.rc"; }} </dev/null >/dev/null 2>&1 & '
                     f'echo $! >"$_D/side-{i}.job"; _SP="$_SP $!"; fi')
    framing = Framing(nonce)
    for name, body in sections:
        if name in CONCURRENT:
            # wait for the facts' own background jobs (not the side reads): they run in parallel anyway
            parts.append(f"{framing.begin(name)}\n"
                         f'if [ -n "$_D" ]; then wait $_FP; cat "$_D/{name}"; _rc=1; read -r _rc <"$_D/{name}.rc"\n'
                         f"else {{\n{body}\n}}; _rc=$?; fi\n"
                         f"{framing.end(name, '$_rc')}")
        else:
            parts.append(framing.section(name, body))
    if side:
        # the side reads get SIDE_GRACE_S more once the facts are read; one still running then is stopped (its
        # job's shell first, so that it leaves no exit status, then the read) and left out: its task reads for
        # itself, so a slow or broken peer never holds the facts up for long. The wait ends the moment the last
        # one does (a poll would add its tick to every no-op); the stopper holds nothing of the round trip's
        # output open, so one left behind never holds the channel.
        parts.append(f'if [ -n "$_SP" ]; then {{ sleep {SIDE_GRACE_S:g}; for _j in "$_D"/side-*.job; do '
                     '_s=${_j%.job}; [ -e "$_s.rc" ] || kill $(cat "$_j") $(cat "$_s.pid" 2>/dev/null) 2>/dev/null; '
                     'done; } </dev/null >/dev/null 2>&1 & _W=$!; wait $_SP 2>/dev/null; kill $_W 2>/dev/null; fi')
    for i in range(len(side)):
        parts.append(f"{framing.begin(f'side:{i}')}\n"
                     f'_rc=1; if [ -n "$_D" ] && [ -e "$_D/side-{i}.rc" ]; then cat "$_D/side-{i}"; '
                     f'read -r _rc <"$_D/side-{i}.rc"; fi\n'
                     f"{framing.end(f'side:{i}', '$_rc')}")
    return "\n".join(parts) + '\n[ -n "$_D" ] && rm -rf "$_D"\nexit 0\n'
