"""The facts, one registry entry per section of the gather script: its name, its shell (from what the script is
rendered from; None where it does not run), and what its output sets in `Facts`. facts/script.py renders the
entries in this order and facts/gather.py reads them back in the same order, so a read may use what an earlier
entry set (a carrier joins the interface `ip-addr` read). A new fact is one entry here plus its test.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TypeVar

from sparkctl.facts import parse
from sparkctl.facts.firewall_files import LISTED_PATH, RULES_PATH, UNIT_NAME, UNIT_PATH
from sparkctl.facts.lldp import parse_lldp
from sparkctl.facts.model import ContainerInfo, Facts
from sparkctl.facts.networkmanager import parse_nmcli
from sparkctl.transport.base import q
from sparkctl.transport.framing import Section

DEFAULT_HF_CACHE = "~/.cache/huggingface"
#: What a docker command that `timeout` stopped tells: the daemon is slow or stuck, not absent.
DOCKER_SLOW = "docker did not answer within 15 s (the daemon is overloaded or stuck)"

T = TypeVar("T")


@dataclass(frozen=True)
class FactsRequest:
    """What a node's facts script is rendered from: the containers and images to inspect, the Hugging Face cache
    whose free space counts, and the netplan guard dirs to look in."""

    container_names: tuple[str, ...] = ()
    image_refs: tuple[str, ...] = ()
    hf_cache: str = DEFAULT_HF_CACHE
    guard_dirs: tuple[str, ...] = ()


class Got:
    """One section as it came back (or did not), for its entry's read: a failed parse lands in the facts'
    raw_errors under the section's name, never as an exception (one bad section must not cost the others)."""

    def __init__(self, facts: Facts, name: str, section: Section | None, request: FactsRequest):
        self.facts, self.name, self.section, self.request = facts, name, section, request

    @property
    def text(self) -> str:
        return self.section.output if self.section else ""

    @property
    def ok(self) -> bool:
        return bool(self.section and self.section.ok)

    @property
    def timed_out(self) -> bool:
        """The section's command was stopped by `timeout` (exit 124; 137 when it had to be killed)."""
        return bool(self.section and self.section.rc in (124, 137))

    def parsed(self, parser: Callable[[str], T], default: T) -> T:
        if not self.text.strip():
            return default
        try:
            return parser(self.text)
        except Exception as exc:  # noqa: BLE001 - see the class
            self.facts.raw_errors.append(f"{self.name}: {type(exc).__name__}: {exc}")
            return default


@dataclass(frozen=True)
class FactSection:
    name: str
    script: Callable[[FactsRequest], str | None]
    #: what the section's output sets: the facts with those fields replaced (`replace(f, hostname=...)`: mypy checks
    #: every name and type), or None when the read set them on `f` itself
    read: Callable[[Facts, Got], Facts | None]
    #: waits on a daemon or walks a big table: run in the background from the top and printed in its place, so
    #: the round trip costs the slowest of them, not their sum
    concurrent: bool = False
    #: reads what only root may (0600 files, other users' sockets, the firewall): every such entry runs in ONE
    #: background shell as root (`sudo -n` once, not once per command: each sudo costs ~10 ms of the node's CPU
    #: and a line in its auth log), with `$_S` empty and `$_SUDO_OK` 1; without passwordless sudo, as the user
    #: with `$_SUDO_OK` 0, so its shell must work both ways
    privileged: bool = False


def _always(body: str) -> Callable[[FactsRequest], str]:
    return lambda _request: body


def _read_os_release(f: Facts, got: Got) -> None:
    values: dict[str, str] = got.parsed(parse.parse_key_values, {})
    f.os_id, f.os_version = values.get("ID", ""), values.get("VERSION_ID", "")


def _read_dgx_release(f: Facts, got: Got) -> None:
    values: dict[str, str] = got.parsed(parse.parse_key_values, {})
    f.dgx_name = values.get("DGX_NAME") or None
    f.is_dgx_spark = bool(f.dgx_name and "spark" in f.dgx_name.lower())


def _read_id(f: Facts, got: Got) -> None:
    no_id: tuple[str, int, list[str]] = ("", -1, [])
    f.user, f.uid, f.groups = got.parsed(parse.parse_id, no_id)


def _read_home(f: Facts, got: Got) -> None:
    home = got.text.strip()
    f.home = home if home.startswith("/") else None


def _read_carrier(f: Facts, got: Got) -> None:
    carriers: dict[str, bool | None] = got.parsed(parse.parse_carriers, {})
    for name, carrier in carriers.items():
        if name in f.interfaces and carrier is not None:
            f.interfaces[name].carrier = carrier


def _read_speed(f: Facts, got: Got) -> None:
    speeds: dict[str, int] = got.parsed(parse.parse_speeds, {})
    for name, iface in f.interfaces.items():
        iface.speed_mbps = speeds.get(name)


def _read_ss(f: Facts, got: Got) -> None:
    f.listening_tcp = got.parsed(parse.parse_ss_listening, {})
    f.listening_addresses = got.parsed(parse.parse_ss_addresses, {})


def _read_meminfo(f: Facts, got: Got) -> None:
    f.meminfo = got.parsed(parse.parse_meminfo, {})
    f.mem_total_kb, f.mem_available_kb = f.meminfo.get("MemTotal", 0), f.meminfo.get("MemAvailable", 0)
    f.page_cache_kb = f.meminfo.get("Cached", 0)


def _read_hf_cache(f: Facts, got: Got) -> None:
    unread: tuple[str, int | None, dict[str, str]] = (got.request.hf_cache, None, {})
    expanded, f.hf_cache_free_bytes, f.model_pins = got.parsed(parse.parse_hf_cache, unread)
    f.hf_cache = expanded or got.request.hf_cache


def _read_firewall(f: Facts, got: Got) -> None:
    f.firewall = got.parsed(parse.parse_firewall, None)
    f.own_firewall = got.parsed(parse.parse_own_firewall, None)
    # any rule change, also one the summary does not tell (a proof on record depends on it: tasks/proof.py)
    f.firewall_digest = hashlib.sha256(got.text.encode()).hexdigest()[:16]


#: sparkctl's firewall files (plan/firewall.py; 644, no secret in them): each after its marker, absent ones left out
FIREWALL_FILES_SCRIPT = (f"for _f in {RULES_PATH} {LISTED_PATH} {UNIT_PATH}; do [ -f \"$_f\" ] && "
                         "{ echo \"#file $_f\"; cat \"$_f\"; }; done; "
                         f"echo '#enabled'; systemctl is-enabled {UNIT_NAME} 2>/dev/null; true")


def _read_firewall_files(f: Facts, got: Got) -> None:
    files, enabled = parse.parse_marked_files(got.text)
    f.firewall_rules, f.firewall_unit = files.get(RULES_PATH), files.get(UNIT_PATH)
    listed = files.get(LISTED_PATH)
    f.firewall_listed = listed.strip() if listed else None
    f.firewall_unit_enabled = enabled.strip()


def _inspected(request: FactsRequest) -> str:
    return " ".join([*(q(n) for n in request.container_names), *(q(r) for r in request.image_refs)])


def _docker_ps(request: FactsRequest) -> str | None:
    """With nothing to inspect, `docker ps` tells whether this user can talk to the daemon (Docker and Podman)."""
    return None if _inspected(request) else "_has docker && _t 15 docker ps -q 2>&1 >/dev/null"


def _docker_inspect(request: FactsRequest) -> str | None:
    """ONE docker command for everything docker knows that sparkctl asks: `docker inspect` of the containers and
    the images together (each docker call costs a client start, a daemon round trip and, with podman, its
    storage locks). Its stderr is kept, each line marked `#err `: "no such object" is an answer, a refused
    socket or a broken storage is not."""
    names = _inspected(request)
    if not names:
        return None
    return f"""_has docker && {{ _e=$(mktemp 2>/dev/null || echo /tmp/.sfi.$$)
_t 15 docker inspect {names} 2>"$_e"; _r=$?
sed 's/^/#err /' "$_e"; rm -f "$_e"; (exit $_r); }}"""


def _unknown_docker(f: Facts, request: FactsRequest, status: str, error: str | None = None) -> None:
    f.containers = {n: ContainerInfo(n, exists=False, status=status, error=error) for n in request.container_names}
    f.images = dict.fromkeys(request.image_refs)
    f.image_digests = dict.fromkeys(request.image_refs)


def _read_docker_cli(f: Facts, got: Got) -> None:
    f.docker_cli = bool(got.text.strip())
    if not f.docker_cli:
        _unknown_docker(f, got.request, "absent")


def _read_docker_ps(f: Facts, got: Got) -> None:
    if not f.docker_cli:
        return
    f.docker_access = got.ok
    if not f.docker_access:
        f.docker_error = DOCKER_SLOW if got.timed_out else parse.parse_docker_error(got.text)


def _read_docker_inspect(f: Facts, got: Got) -> None:
    if not f.docker_cli:
        return
    if got.timed_out:
        f.docker_access, f.docker_error = False, DOCKER_SLOW
        _unknown_docker(f, got.request, "unknown", DOCKER_SLOW)
        f.raw_errors.append(f"docker: {DOCKER_SLOW}")
        return
    try:
        answer = parse.parse_docker_answer(got.text, list(got.request.container_names), list(got.request.image_refs))
    except Exception as exc:  # noqa: BLE001 - see Got
        f.raw_errors.append(f"docker: {type(exc).__name__}: {exc}")
        f.docker_access, f.docker_error = False, f"unreadable docker inspect output ({type(exc).__name__})"
        _unknown_docker(f, got.request, "unknown")
        return
    f.docker_access = answer.reached
    if not answer.reached:
        f.docker_error = answer.error
    elif answer.error:
        f.raw_errors.append(f"docker: {answer.error}")
    f.containers, f.images, f.image_digests = answer.containers, answer.images, answer.digests


def _hf_cache_script(request: FactsRequest) -> str:
    # `~` is expanded on the node; df needs an existing path, so walk up to the nearest existing parent.
    return f"""p={q(request.hf_cache)}
case $p in "~") p=$HOME ;; "~/"*) p=$HOME/${{p#"~/"}} ;; esac
printf '%s\\n' "$p"
d=$p; while [ ! -e "$d" ] && [ "$d" != / ] && [ "$d" != . ]; do d=$(dirname "$d"); done
df -B1 --output=avail "$d" 2>/dev/null | tail -n 1
for f in "$p"/sparkctl-pins/models--*; do
  [ -f "$f" ] && printf 'pin\t%s\t%s\n' "${{f##*/}}" "$(head -n1 "$f")"
done; true"""


#: Netplan revert guards armed by a run and neither confirmed nor reverted, whose process still waits: a run cut
#: (Ctrl-C, SIGKILL, a lost link) between `netplan apply` and its confirmation leaves one, and it reverts the
#: files later unless confirmed. Run as root (the state dirs are 0700 root); prints one guard id per line.
GUARDS_SCRIPT = r"""for d in "$@"; do for p in "$d"/guard-*.pid; do
  [ -e "$p" ] || continue; id=${p##*/guard-}; id=${id%.pid}
  if [ -e "$d/confirmed-$id" ] || [ -e "$d/reverted-$id" ]; then continue; fi
  pid=; read -r pid < "$p" 2>/dev/null
  [ -n "$pid" ] && grep -q "revert-$id.sh" /proc/"$pid"/cmdline 2>/dev/null && printf '%s\n' "$id"
done; done; true"""


def _guards_script(request: FactsRequest) -> str | None:
    if not request.guard_dirs:
        return None
    dirs = " ".join(q(d) for d in request.guard_dirs)
    return f"if [ \"$_SUDO_OK\" = 1 ]; then $_S sh -c {q(GUARDS_SCRIPT)} sh {dirs}; else echo '#unreadable'; fi"


def _guards_pending(got: Got) -> list[str] | None:
    none: list[str] | None = []  # an empty section: no guard pending; None: unreadable
    return got.parsed(parse.parse_guards, none)


FACT_SECTIONS: list[FactSection] = [
    FactSection("hostname", _always("hostname 2>/dev/null || cat /proc/sys/kernel/hostname"),
                lambda f, got: replace(f, hostname=got.text.strip())),
    FactSection("os-release", _always("cat /etc/os-release 2>/dev/null || cat /usr/lib/os-release"),
                _read_os_release),
    FactSection("dgx-release", _always("cat /etc/dgx-release 2>/dev/null"), _read_dgx_release),
    FactSection("arch", _always("uname -m"), lambda f, got: replace(f, arch=got.text.strip())),
    FactSection("id", _always("id -un; id -u; id -Gn"), _read_id),
    FactSection("home", _always('printf "%s\\n" "$HOME"'), _read_home),
    FactSection("ip-addr", _always("ip -j -d addr show"),
                lambda f, got: replace(f, interfaces=got.parsed(parse.parse_ip_addr, {}))),
    # `read` instead of `$(cat ...)`: no fork per interface (forks are most of this script's cost).
    FactSection("carrier", _always(r"""for f in /sys/class/net/*/carrier; do
  [ -e "$f" ] || continue; n=${f%/carrier}; n=${n##*/}; c=
  read -r c < "$f" 2>/dev/null
  printf '%s %s\n' "$n" "$c"
done"""), _read_carrier),
    # ibdev2netdev prints the netdev's operstate; the sysfs fallback prints the same line shape.
    FactSection("roce", _always(r"""if _has ibdev2netdev; then ibdev2netdev
else for d in /sys/class/infiniband/*; do
  [ -d "$d" ] || continue; dev=${d##*/}
  port=1; for p in "$d"/ports/*; do [ -e "$p" ] && { port=${p##*/}; break; }; done
  for n in "$d"/device/net/*; do
    [ -e "$n" ] || continue; nd=${n##*/}
    st=Down; o=; read -r o < /sys/class/net/"$nd"/operstate 2>/dev/null; [ "$o" = up ] && st=Up
    printf '%s port %s ==> %s (%s)\n' "$dev" "$port" "$nd" "$st"
  done
done; fi"""), lambda f, got: replace(f, roce=got.parsed(parse.parse_ibdev2netdev, []))),
    # lldpcli is setuid _lldpd, mode 4750 _lldpd:adm on Debian/Ubuntu (and /usr/sbin is not in a user's PATH over
    # ssh): found by path, asked with sudo -n when that works. Only read: sparkctl never starts lldpd itself.
    FactSection("lldp", _always(r"""_L=$(command -v lldpcli 2>/dev/null)
for p in /usr/sbin/lldpcli /usr/local/sbin/lldpcli; do [ -z "$_L" ] && [ -e "$p" ] && _L=$p; done
if [ -z "$_L" ]; then echo '#absent'; else _t 10 $_S "$_L" show neighbors -f json 2>&1; fi"""),
                lambda f, got: replace(f, lldp=got.parsed(parse_lldp, None)), privileged=True),
    FactSection("speed", _always(r"""for f in /sys/class/net/*/speed; do
  [ -e "$f" ] || continue; n=${f%/speed}; n=${n##*/}; v=
  read -r v < "$f" 2>/dev/null
  printf 'sysfs %s %s\n' "$n" "$v"
done
if _has ethtool; then for n in /sys/class/infiniband/*/device/net/*; do
  [ -e "$n" ] || continue; nd=${n##*/}
  sp=$(ethtool "$nd" 2>/dev/null | sed -n 's/^[[:space:]]*Speed:[[:space:]]*//p')
  printf 'ethtool %s %s\n' "$nd" "$sp"
done; fi"""), _read_speed, concurrent=True),
    FactSection("ssh-connection", _always(r"""printf '%s\n' "${SSH_CONNECTION:-}" """),
                lambda f, got: replace(f, session_ip=got.parsed(parse.parse_ssh_connection, None))),
    FactSection("routes", _always("ip -4 -o route show table main 2>/dev/null"),
                lambda f, got: replace(f, routes=got.parsed(parse.parse_routes, []))),
    # sparkctl's own sysctl.d files (a relaying ring node's forwarding): name and base64 content
    FactSection("sparkctl-sysctl", _always(r"""for f in /etc/sysctl.d/*-sparkctl-*.conf; do
  [ -f "$f" ] || continue; printf '%s ' "$f"; base64 < "$f" | tr -d '\n'; echo
done"""), lambda f, got: replace(f, sysctl_files=got.parsed(parse.parse_named_files, {}))),
    # forwarding and reverse-path filtering: a ring relays between neighbours (`read`: no fork per file)
    FactSection("ipv4-conf", _always(r"""for f in /proc/sys/net/ipv4/ip_forward /proc/sys/net/ipv4/conf/*/forwarding \
         /proc/sys/net/ipv4/conf/*/rp_filter; do
  [ -e "$f" ] || continue; v=; read -r v < "$f" 2>/dev/null; printf '%s %s\n' "${f#/proc/sys/net/ipv4/}" "$v"
done"""), lambda f, got: replace(f, ipv4_conf=got.parsed(parse.parse_ipv4_conf, {}))),
    # Netplan files are 0600 root: read with sudo -n when needed; base64 keeps any content intact.
    FactSection("netplan", _always(r"""for f in /etc/netplan/*.yaml; do
  [ -e "$f" ] || continue
  mode=$(stat -c %a "$f" 2>/dev/null || echo -)
  if [ -r "$f" ]; then c=$(base64 < "$f" | tr -d '\n') && c="b64:$c" || c=-
  elif [ "$_SUDO_OK" = 1 ]; then c=$($_S cat "$f" 2>/dev/null | base64 | tr -d '\n') && c="b64:$c" || c=-
  else c=-; fi
  printf '%s %s %s\n' "$mode" "$c" "$f"
done"""), lambda f, got: replace(f, netplan_files=got.parsed(parse.parse_netplan, [])), privileged=True),
    # NetworkManager's view, when nmcli exists (DGX OS renders netplan through it): C locale for the words it
    # prints; readable by any user over D-Bus; nothing more is asked once it says it is not running. Three calls:
    # each costs ~50 ms of the round trip. Parsed in sparkctl/facts/networkmanager.py.
    FactSection("nm", _always(r"""if _has nmcli; then ( export LC_ALL=C
  echo '#devices'; _t 5 nmcli -t -f DEVICE,TYPE,STATE,CONNECTION device status 2>&1 || exit 0
  echo '#connections'
  _c=$(_t 5 nmcli -t -f UUID,NAME,TYPE,DEVICE,ACTIVE,AUTOCONNECT,AUTOCONNECT-PRIORITY,FILENAME connection show 2>&1)
  printf '%s\n' "$_c"
  echo '#settings'; _u=$(printf '%s\n' "$_c" | cut -d: -f1 | grep -E '^[0-9a-fA-F-]{36}$')
  if [ -n "$_u" ]; then _t 5 nmcli -t -f connection.uuid,connection.interface-name,802-3-ethernet.mac-address \
    connection show $_u 2>&1; fi )
else echo '#absent'; fi"""), lambda f, got: replace(f, nm=got.parsed(parse_nmcli, None)), concurrent=True),
    FactSection("docker-cli", _always("command -v docker"), _read_docker_cli),
    FactSection("docker-info", _docker_ps, _read_docker_ps, concurrent=True),
    FactSection("docker", _docker_inspect, _read_docker_inspect, concurrent=True),
    FactSection("hf-cache", _hf_cache_script, _read_hf_cache),
    FactSection("netplan-guards", _guards_script,
                lambda f, got: replace(f, netplan_guards_pending=_guards_pending(got)),
                privileged=True),
    FactSection("ss", _always("if [ \"$_SUDO_OK\" = 1 ]; then $_S ss -ltnpH 2>/dev/null || ss -ltnH; "
                              "else ss -ltnpH; fi"), _read_ss, privileged=True),
    # root already, or `sudo -n` ran the privileged shell (facts/script.py): sudo asked once, by that shell
    FactSection("sudo", _always('[ "$_SUDO_OK" = 1 ]'), lambda f, got: replace(f, sudo_nopasswd=got.ok),
                privileged=True),
    FactSection("meminfo", _always("cat /proc/meminfo"), _read_meminfo),
    FactSection("time", _always("date +%s.%N"), lambda f, got: replace(f, time=got.parsed(parse.parse_time, 0.0))),
    FactSection("firewall-files", _always(FIREWALL_FILES_SCRIPT), _read_firewall_files),
    FactSection("firewall", _always(r"""if _has ufw; then echo '#ufw'; $_S ufw status 2>&1; fi
if _has nft; then echo '#nft'; $_S nft list ruleset 2>&1; fi
if _has iptables; then echo '#iptables'; $_S iptables -S INPUT 2>&1; fi"""), _read_firewall, privileged=True),
]


def rendered(request: FactsRequest) -> list[tuple[FactSection, str]]:
    """The entries that run for this request, each with its shell, in order."""
    return [(entry, body) for entry in FACT_SECTIONS if (body := entry.script(request)) is not None]
