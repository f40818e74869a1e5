"""The facts, one registry entry per section of the gather script: its name, the call of its function in
templates/facts.sh (with what the script is rendered from as arguments; None where it does not run), and what its
output sets in `Facts`. facts/script.py renders the entries in this order and facts/gather.py reads them back in the
same order, so a read may use what an earlier entry set (a carrier joins the interface `ip-addr` read). A new fact
is one entry here, its function there, and its test.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TypeVar
from urllib.parse import quote

from sparkctl.facts import parse
from sparkctl.facts.firewall_files import LISTED_PATH, RULES_PATH, UNIT_NAME, UNIT_PATH, WANTS_PATH
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
    #: `key=value`: list the containers carrying that label too (Facts.labelled_containers), where the Engine API
    #: answers (one more path in its one curl; the CLI would need a `docker ps` of its own)
    label: str | None = None


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
    #: concurrent, and its job may leave its command's raw answer (`#raw` first): the same call (one function call)
    #: judges it once the job is done (_held in templates/facts.sh)
    judged_after: bool = False


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


#: sparkctl's firewall files (plan/firewall.py; 644, no secret in them), each after its marker
FIREWALL_FILES_CALL = (f"fact_firewall_files {q(UNIT_NAME)} {q(WANTS_PATH)} {q(RULES_PATH)} {q(LISTED_PATH)} "
                       f"{q(UNIT_PATH)}")


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
    return None if _inspected(request) else "fact_docker_info"


def _docker_inspect(request: FactsRequest) -> str | None:
    """ONE ask for everything docker knows that sparkctl asks: the Engine API's paths for the labelled list, the
    containers and the images, in one curl; where the API cannot answer, `docker inspect` of the containers and the
    images together (each docker call costs a client start, a daemon round trip and, with podman, its storage
    locks), its stderr kept, each line marked `#err `: "no such object" is an answer, a refused socket or a broken
    storage is not."""
    names = _inspected(request)
    if not names:
        return None
    paths = api_paths(request)
    return f"fact_docker {len(paths)} {' '.join(q(p) for p in paths)} {names}"


def api_paths(request: FactsRequest) -> list[str]:
    """The Engine API's paths (docker's API reference, "ContainerList", "ContainerInspect", "ImageInspect"), in the
    order parse.parse_docker_api reads their answers: the labelled list when asked, each container, each image."""
    listed = ([f"/containers/json?all=1&filters={quote(json.dumps({'label': [request.label]}), safe='')}"]
              if request.label else [])
    return [*listed, *(f"/containers/{quote(n, safe='')}/json" for n in request.container_names),
            *(f"/images/{quote(r, safe='/:@')}/json" for r in request.image_refs)]


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
        if got.text.startswith(parse.API_MARK):
            answer = parse.parse_docker_api(got.text, list(got.request.container_names),
                                            list(got.request.image_refs), listed=bool(got.request.label))
            f.labelled_containers = answer.labelled
        else:
            answer = parse.parse_docker_answer(got.text, list(got.request.container_names),
                                               list(got.request.image_refs))
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


def _home_path(path: str) -> str:
    """A path as a shell word, a leading `~` left for the node's shell to expand (to the login's home)."""
    if path == "~":
        return "~"
    # bash expands a tilde-prefix only when nothing up to the first unquoted slash is quoted
    return "~/" + q(path[2:]) if path.startswith("~/") else q(path)


def _guards_script(request: FactsRequest) -> str | None:
    if not request.guard_dirs:
        return None
    return "fact_netplan_guards_pending " + " ".join(q(d) for d in request.guard_dirs)


def _guards_pending(got: Got) -> list[str] | None:
    none: list[str] | None = []  # an empty section: no guard pending; None: unreadable
    return got.parsed(parse.parse_guards, none)


FACT_SECTIONS: list[FactSection] = [
    FactSection("hostname", _always("fact_hostname"), lambda f, got: replace(f, hostname=got.text.strip())),
    FactSection("os-release", _always("fact_os_release"), _read_os_release),
    FactSection("dgx-release", _always("fact_dgx_release"), _read_dgx_release),
    FactSection("arch", _always("fact_arch"), lambda f, got: replace(f, arch=got.text.strip())),
    FactSection("id", _always("fact_id"), _read_id),
    FactSection("home", _always("fact_home"), _read_home),
    FactSection("ip-addr", _always("fact_ip_addr"),
                lambda f, got: replace(f, interfaces=got.parsed(parse.parse_ip_addr, {}))),
    FactSection("carrier", _always("fact_carrier"), _read_carrier),
    FactSection("roce", _always("fact_roce"), lambda f, got: replace(f, roce=got.parsed(parse.parse_ibdev2netdev, []))),
    FactSection("lldp", _always("fact_lldp"), lambda f, got: replace(f, lldp=got.parsed(parse_lldp, None)),
                privileged=True),
    FactSection("speed", _always("fact_speed"), _read_speed),
    FactSection("ssh-connection", _always("fact_ssh_connection"),
                lambda f, got: replace(f, session_ip=got.parsed(parse.parse_ssh_connection, None))),
    FactSection("routes", _always("fact_routes"), lambda f, got: replace(f, routes=got.parsed(parse.parse_routes, []))),
    FactSection("sparkctl-sysctl", _always("fact_sparkctl_sysctl"),
                lambda f, got: replace(f, sysctl_files=got.parsed(parse.parse_named_files, {}))),
    FactSection("ipv4-conf", _always("fact_ipv4_conf"),
                lambda f, got: replace(f, ipv4_conf=got.parsed(parse.parse_ipv4_conf, {}))),
    FactSection("netplan", _always("fact_netplan"),
                lambda f, got: replace(f, netplan_files=got.parsed(parse.parse_netplan, [])), privileged=True),
    FactSection("nm", _always("fact_nm"), lambda f, got: replace(f, nm=got.parsed(parse_nmcli, None)), concurrent=True),
    FactSection("docker-cli", _always("fact_docker_cli"), _read_docker_cli),
    FactSection("docker-info", _docker_ps, _read_docker_ps, concurrent=True),
    FactSection("docker", _docker_inspect, _read_docker_inspect, concurrent=True, judged_after=True),
    FactSection("hf-cache", lambda request: f"fact_hf_cache {_home_path(request.hf_cache)}", _read_hf_cache),
    FactSection("netplan-guards", _guards_script,
                lambda f, got: replace(f, netplan_guards_pending=_guards_pending(got)),
                privileged=True),
    FactSection("ss", _always("fact_ss"), _read_ss, privileged=True),
    FactSection("sudo", _always("fact_sudo"), lambda f, got: replace(f, sudo_nopasswd=got.ok), privileged=True),
    FactSection("meminfo", _always("fact_meminfo"), _read_meminfo),
    FactSection("time", _always("fact_time"), lambda f, got: replace(f, time=got.parsed(parse.parse_time, 0.0))),
    FactSection("firewall-files", _always(FIREWALL_FILES_CALL), _read_firewall_files),
    FactSection("firewall", _always("fact_firewall"), _read_firewall, privileged=True),
]


def rendered(request: FactsRequest) -> list[tuple[FactSection, str]]:
    """The entries that run for this request, each with its shell, in order."""
    return [(entry, body) for entry in FACT_SECTIONS if (body := entry.script(request)) is not None]
