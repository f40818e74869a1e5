"""What answers on the lab's nodes from this machine, which sits on the management bridge and is no node."""

from __future__ import annotations

import asyncio
import resource
from concurrent.futures import ThreadPoolExecutor

from tests.lab.lab_kit import sh
from tests.lab.network_kit import port_open

SCAN_TIMEOUT = 0.5
SCAN_AT_ONCE = 8000


def scan(hosts: list[str]) -> dict[str, set[int]]:
    """Every TCP port of each host that accepts a connection from this machine."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(hard, 2 * SCAN_AT_ONCE + 512)), hard))

    async def one(host: str, port: int, gate: asyncio.Semaphore) -> int | None:
        async with gate:
            try:
                _, writer = await asyncio.wait_for(asyncio.open_connection(host, port), SCAN_TIMEOUT)
            except (OSError, asyncio.TimeoutError):
                return None
            writer.close()
            return port

    async def every() -> dict[str, set[int]]:
        gate = asyncio.Semaphore(SCAN_AT_ONCE)
        found = await asyncio.gather(*(asyncio.gather(*(one(h, p, gate) for p in range(1, 65536))) for h in hosts))
        return {h: {p for p in ports if p is not None} for h, ports in zip(hosts, found, strict=True)}

    return asyncio.run(every())


def listeners(lab, node: str, wildcard_only: bool = False) -> set[int]:
    """The TCP ports something on the node listens on (`wildcard_only`: at every address)."""
    ports = set()
    for line in sh(lab, node, "ss -ltnH").splitlines():
        address, _, port = line.split()[3].rpartition(":")
        if not wildcard_only or address in ("0.0.0.0", "*", "[::]"):
            ports.add(int(port))
    return ports


def wildcard_listeners(lab, node: str) -> set[int]:
    return listeners(lab, node, wildcard_only=True)


def answering(lab, full_scan: bool = False) -> dict[str, set[int]]:
    """What answers on each node's management address: each port a listener of the node holds, asked on its own
    with a wait a lost SYN's retry fits in (a port no listener holds cannot answer); with `full_scan`, every port
    too (a scan's first SYNs may be lost while this machine resolves the node's address: the listeners' ports are
    asked again either way)."""
    found = scan([n.mgmt_ip for n in lab.nodes]) if full_scan else {n.mgmt_ip: set() for n in lab.nodes}
    asked = [(n.mgmt_ip, port) for n in lab.nodes for port in listeners(lab, n.name)]
    with ThreadPoolExecutor(max_workers=64) as pool:
        for (host, port), ok in zip(asked, pool.map(lambda target: port_open(*target, timeout=3), asked), strict=True):
            if ok:
                found[host].add(port)
    return found


