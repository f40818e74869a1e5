"""gather_facts: send the script once, split its sections, read each back with its entry in facts/sections.py."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterable, Mapping

from sparkctl.facts.model import Facts
from sparkctl.facts.script import SideRead, render_request
from sparkctl.facts.sections import DEFAULT_HF_CACHE, FactsRequest, Got, rendered
from sparkctl.transport.base import Transport
from sparkctl.transport.framing import Framing, Section

DEFAULT_TIMEOUT = 60.0


def gather_facts(transport: Transport, node: str, *, container_names: Iterable[str] = (),
                 image_refs: Iterable[str] = (), hf_cache: str = DEFAULT_HF_CACHE,
                 reach_addrs: Iterable[str] = (), guard_dirs: Iterable[str] = (),
                 side_reads: Mapping[str, tuple[str, float] | SideRead] | None = None, label: str | None = None,
                 timeout: float = DEFAULT_TIMEOUT) -> Facts:
    """Read every fact of one node in ONE round trip. Never raises for what the node lacks.

    `reach_addrs`: the names or addresses sparkctl reaches this node by (its inventory host); the
    interfaces holding them, and the one carrying the SSH session, are the node's management interfaces.
    `label` (`key=value`): list the containers carrying it too, where docker's Engine API answers.
    """
    request = FactsRequest(tuple(container_names), tuple(image_refs), hf_cache, tuple(guard_dirs), label)
    nonce = Framing().nonce
    script = render_request(nonce, request, side_reads)
    before = time.time()
    result = transport.run(script, timeout=timeout)
    after = time.time()
    sections = Framing(nonce).split(result.stdout)
    facts = read_facts(sections, node, request, _resolved(reach_addrs, transport))
    facts.controller_time = (before, after)
    facts.side_reads = {name: sections[f"side:{i}"] for i, name in enumerate(side_reads or {})
                        if f"side:{i}" in sections}
    if result.timed_out:
        facts.raw_errors.append(f"gather: timed out after {timeout:g}s; later sections are missing")
    return facts


def facts_from_output(stdout: str, nonce: str, node: str, *, container_names: Iterable[str] = (),
                      image_refs: Iterable[str] = (), hf_cache: str = DEFAULT_HF_CACHE,
                      guard_dirs: Iterable[str] = (), reach_addrs: Iterable[str] = (),
                      label: str | None = None) -> Facts:
    """Parse the gather script's stdout (split by the nonce it was rendered with) into Facts."""
    request = FactsRequest(tuple(container_names), tuple(image_refs), hf_cache, tuple(guard_dirs), label)
    return read_facts(Framing(nonce).split(stdout), node, request, reach_addrs)


def read_facts(sections: Mapping[str, Section], node: str, request: FactsRequest,
               reach_addrs: Iterable[str] = ()) -> Facts:
    """Every entry the request ran reads its own section, in order (an entry may use what an earlier one set)."""
    facts = Facts(node=node, hf_cache=request.hf_cache)
    for entry, _script in rendered(request):
        facts = entry.read(facts, Got(facts, entry.name, sections.get(entry.name), request)) or facts
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
