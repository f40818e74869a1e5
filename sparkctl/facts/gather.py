"""gather_facts: send the script once, split its sections, parse each one tolerantly into Facts."""

from __future__ import annotations

import hashlib
import socket
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from sparkctl.facts import parse
from sparkctl.facts.lldp import parse_lldp
from sparkctl.facts.model import ContainerInfo, Facts
from sparkctl.facts.networkmanager import parse_nmcli
from sparkctl.facts.script import render_script
from sparkctl.transport.base import Transport
from sparkctl.transport.framing import Framing, Section

DEFAULT_TIMEOUT = 60.0
#: What a docker command that `timeout` stopped tells: the daemon is slow or stuck, not absent.
DOCKER_SLOW = "docker did not answer within 15 s (the daemon is overloaded or stuck)"


def gather_facts(transport: Transport, node: str, *, container_names: Iterable[str] = (),
                 image_refs: Iterable[str] = (), hf_cache: str = "~/.cache/huggingface",
                 reach_addrs: Iterable[str] = (), guard_dirs: Iterable[str] = (),
                 side_reads: Mapping[str, tuple[str, float]] | None = None,
                 timeout: float = DEFAULT_TIMEOUT) -> Facts:
    """Read every fact of one node in ONE round trip. Never raises for what the node lacks.

    `reach_addrs`: the names or addresses sparkctl reaches this node by (its inventory host); the
    interfaces holding them, and the one carrying the SSH session, are the node's management interfaces.
    """
    names, refs = list(container_names), list(image_refs)
    nonce = Framing().nonce
    script = render_script(nonce, container_names=names, image_refs=refs, hf_cache=hf_cache,
                           guard_dirs=guard_dirs, side_reads=side_reads)
    before = time.time()
    result = transport.run(script, timeout=timeout)
    after = time.time()
    facts = facts_from_output(result.stdout, nonce, node, container_names=names, image_refs=refs,
                              hf_cache=hf_cache, reach_addrs=_resolved(reach_addrs, transport))
    facts.controller_time = (before, after)
    sections = Framing(nonce).split(result.stdout)
    facts.side_reads = {name: sections[f"side:{i}"] for i, name in enumerate(side_reads or {})
                        if f"side:{i}" in sections}
    if result.timed_out:
        facts.raw_errors.append(f"gather: timed out after {timeout:g}s; later sections are missing")
    return facts


def facts_from_output(stdout: str, nonce: str, node: str, *, container_names: Iterable[str] = (),
                      image_refs: Iterable[str] = (), hf_cache: str = "~/.cache/huggingface",
                      reach_addrs: Iterable[str] = ()) -> Facts:
    """Parse the gather script's stdout (split by the nonce it was rendered with) into Facts."""
    sections = Framing(nonce).split(stdout)
    facts = Facts(node=node, hf_cache=hf_cache)
    builder = _FactsBuilder(facts, sections)
    builder.fill(list(container_names), list(image_refs))
    facts.management_interfaces = _management_interfaces(facts, reach_addrs)
    return facts


def _resolved(names: Iterable[str], transport: Transport) -> list[str]:
    """IPv4 addresses of the given names and of the host the transport really connected to (an ssh_config
    alias resolves to its HostName there); a name that does not resolve is skipped."""
    out: list[str] = []
    for name in [*names, getattr(transport, "host", None)]:
        if not name:
            continue
        try:
            infos = socket.getaddrinfo(str(name), None, socket.AF_INET)
        except (OSError, UnicodeError):
            continue
        for info in infos:
            address = str(info[4][0])
            if address not in out:
                out.append(address)
    return out


def _management_interfaces(facts: Facts, reach_addrs: Iterable[str]) -> list[str]:
    # Never the controller's own addresses: when sparkctl runs on a Spark, its fabric twins hold some.
    held: list[str] = []
    for ip in ([facts.session_ip] if facts.session_ip else []) + list(reach_addrs):
        for name in facts.interfaces_holding(ip):
            if name not in held:
                held.append(name)
    return held


class _FactsBuilder:
    def __init__(self, facts: Facts, sections: dict[str, Section]):
        self.facts = facts
        self.sections = sections

    def text(self, name: str) -> str:
        section = self.sections.get(name)
        return section.output if section else ""

    def ok(self, name: str) -> bool:
        section = self.sections.get(name)
        return bool(section and section.ok)

    def parsed(self, name: str, parser: Callable[..., Any], *args: Any, default: Any = None) -> Any:
        """Run one parser; a failure is recorded in raw_errors, never raised."""
        text = self.text(name)
        if not text.strip():
            return default
        try:
            return parser(text, *args)
        except Exception as exc:  # noqa: BLE001 - one bad section must not cost the others
            self.facts.raw_errors.append(f"{name}: {type(exc).__name__}: {exc}")
            return default

    def fill(self, container_names: list[str], image_refs: list[str]) -> None:
        f = self.facts
        f.hostname = self.text("hostname").strip()
        home = self.text("home").strip()
        f.home = home if home.startswith("/") else None
        os_release = self.parsed("os-release", parse.parse_key_values, default={})
        f.os_id, f.os_version = os_release.get("ID", ""), os_release.get("VERSION_ID", "")
        f.dgx_name = self.parsed("dgx-release", parse.parse_key_values, default={}).get("DGX_NAME") or None
        f.is_dgx_spark = bool(f.dgx_name and "spark" in f.dgx_name.lower())
        f.arch = self.text("arch").strip()
        f.user, f.uid, f.groups = self.parsed("id", parse.parse_id, default=("", -1, []))
        f.sudo_nopasswd = self.ok("sudo")
        self._fill_network()
        f.netplan_files = self.parsed("netplan", parse.parse_netplan, default=[])
        self._fill_docker(container_names, image_refs)
        f.listening_tcp = self.parsed("ss", parse.parse_ss_listening, default={})
        f.listening_addresses = self.parsed("ss", parse.parse_ss_addresses, default={})
        mem = self.parsed("meminfo", parse.parse_meminfo, default={})
        f.mem_total_kb, f.mem_available_kb = mem.get("MemTotal", 0), mem.get("MemAvailable", 0)
        f.page_cache_kb = mem.get("Cached", 0)
        f.meminfo = mem
        expanded, f.hf_cache_free_bytes = self.parsed("hf-cache", parse.parse_hf_cache,
                                                      default=(f.hf_cache, None))
        f.hf_cache = expanded or f.hf_cache
        f.time = self.parsed("time", parse.parse_time, default=0.0)
        if "netplan-guards" in self.sections:
            f.netplan_guards_pending = self.parsed("netplan-guards", parse.parse_guards, default=[])
        f.firewall = self.parsed("firewall", parse.parse_firewall)
        # any rule change, also one the summary does not tell (a proof on record depends on it: tasks/proof.py)
        f.firewall_digest = hashlib.sha256(self.text("firewall").encode()).hexdigest()[:16]

    def _fill_network(self) -> None:
        f = self.facts
        f.interfaces = self.parsed("ip-addr", parse.parse_ip_addr, default={})
        carriers = self.parsed("carrier", parse.parse_carriers, default={})
        speeds = self.parsed("speed", parse.parse_speeds, default={})
        for name, iface in f.interfaces.items():
            if carriers.get(name) is not None:
                iface.carrier = carriers[name]
            iface.speed_mbps = speeds.get(name)
        f.roce = self.parsed("roce", parse.parse_ibdev2netdev, default=[])
        f.lldp = self.parsed("lldp", parse_lldp)
        f.nm = self.parsed("nm", parse_nmcli)
        f.session_ip = self.parsed("ssh-connection", parse.parse_ssh_connection)
        f.routes = self.parsed("routes", parse.parse_routes, default=[])
        f.ipv4_conf = self.parsed("ipv4-conf", parse.parse_ipv4_conf, default={})
        f.sysctl_files = self.parsed("sparkctl-sysctl", parse.parse_named_files, default={})

    def timed_out(self, name: str) -> bool:
        """The section's command was stopped by `timeout` (exit 124; 137 when it had to be killed)."""
        section = self.sections.get(name)
        return bool(section and section.rc in (124, 137))

    def _fill_docker(self, container_names: list[str], image_refs: list[str]) -> None:
        f = self.facts
        f.docker_cli = bool(self.text("docker-cli").strip())
        if not f.docker_cli:
            f.containers = {n: ContainerInfo(n, exists=False, status="absent") for n in container_names}
            f.images = dict.fromkeys(image_refs)
            return
        if "docker" not in self.sections:  # nothing to inspect: `docker ps` alone
            f.docker_access = self.ok("docker-info")
            if not f.docker_access:
                f.docker_error = (DOCKER_SLOW if self.timed_out("docker-info")
                                  else parse.parse_docker_error(self.text("docker-info")))
            f.containers, f.images = {}, {}
            return
        if self.timed_out("docker"):
            f.docker_access, f.docker_error = False, DOCKER_SLOW
            f.containers = {n: ContainerInfo(n, exists=False, status="unknown", error=DOCKER_SLOW)
                            for n in container_names}
            f.images = dict.fromkeys(image_refs)
            f.raw_errors.append(f"docker: {DOCKER_SLOW}")
            return
        try:
            answer = parse.parse_docker_answer(self.text("docker"), container_names, image_refs)
        except Exception as exc:  # noqa: BLE001 - one bad section must not cost the others
            f.raw_errors.append(f"docker: {type(exc).__name__}: {exc}")
            f.docker_access, f.docker_error = False, f"unreadable docker inspect output ({type(exc).__name__})"
            f.containers = {n: ContainerInfo(n, exists=False, status="unknown") for n in container_names}
            f.images = dict.fromkeys(image_refs)
            return
        f.docker_access = answer.reached
        if not answer.reached:
            f.docker_error = answer.error
        elif answer.error:
            f.raw_errors.append(f"docker: {answer.error}")
        f.containers, f.images = answer.containers, answer.images
