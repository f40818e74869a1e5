"""Open one transport per node, all nodes in parallel; one unreachable node does not stop the others."""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypedDict

from sparkctl.errors import Unreachable
from sparkctl.transport.local import LocalTransport
from sparkctl.transport.shell import ShellTransport
from sparkctl.transport.ssh import SSHTransport

if TYPE_CHECKING:
    from typing_extensions import Unpack  # typing.Unpack for **kwargs needs Python 3.12

log = logging.getLogger(__name__)

DEFAULT_KNOWN_HOSTS = "~/.ssh/known_hosts"


@dataclass(frozen=True)
class NodeAddress:
    """How to reach one node. Inventory nodes with the same attributes (or `name` for `node`) work too."""

    node: str
    host: str = ""
    user: str | None = None
    port: int | None = None
    identity_file: str | None = None
    local: bool = False


class ConnectOptions(TypedDict, total=False):
    """open_transport's keyword options, as connect_all and the session pass them on."""
    known_hosts_path: str | None
    use_ssh_config: bool
    connect_timeout: float
    become_password: str | None
    ssh_config_path: str | None


def open_transport(spec: object, *, known_hosts_path: str | None = DEFAULT_KNOWN_HOSTS, use_ssh_config: bool = True,
                   connect_timeout: float = 10, become_password: str | None = None,
                   ssh_config_path: str | None = None) -> ShellTransport:
    """A connected transport for one node; raises Unreachable."""
    node = _node_name(spec)
    if getattr(spec, "local", False):
        return LocalTransport(node, become_password=become_password)
    transport = SSHTransport(
        node, spec.host or node,  # type: ignore[attr-defined]
        user=getattr(spec, "user", None), port=getattr(spec, "port", None),
        identity_file=getattr(spec, "identity_file", None),
        known_hosts_path=os.path.expanduser(known_hosts_path or DEFAULT_KNOWN_HOSTS), use_ssh_config=use_ssh_config,
        connect_timeout=connect_timeout, become_password=become_password, ssh_config_path=ssh_config_path,
    )
    try:
        transport.connect()
    except Unreachable:
        transport.close()
        raise
    return transport


def connect_all(specs: Iterable[object], forks: int = 10, **options: Unpack[ConnectOptions]
                ) -> tuple[dict[str, ShellTransport], dict[str, Unreachable]]:
    """Connect to every node in parallel: (transports by node, Unreachable by node).

    `options` are those of open_transport (known_hosts_path, use_ssh_config, connect_timeout, ...).
    """
    specs = list(specs)
    connected: dict[str, ShellTransport] = {}
    unreachable: dict[str, Unreachable] = {}
    if not specs:
        return connected, unreachable
    with ThreadPoolExecutor(max_workers=max(1, min(forks, len(specs))), thread_name_prefix="connect") as pool:
        futures = {_node_name(spec): pool.submit(open_transport, spec, **options) for spec in specs}
        for node, future in futures.items():
            try:
                connected[node] = future.result()
            except Unreachable as exc:
                log.debug("%s: unreachable: %s", node, exc)
                unreachable[node] = exc
            except Exception as exc:  # noqa: BLE001 (a bug in one node's spec must not hide the others)
                unreachable[node] = Unreachable(f"{node}: cannot connect: {exc}")
    return connected, unreachable


def _node_name(spec: object) -> str:
    return getattr(spec, "node", None) or spec.name  # type: ignore[attr-defined]
