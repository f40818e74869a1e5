"""PURE serve planning every engine shares: the endpoint, the repos each serving node needs, a launch's
fingerprint. Each engine's own launch: plan/launch.py."""

from __future__ import annotations

import hashlib

from sparkctl.inventory import Inventory
from sparkctl.inventory.tls_check import tls_name
from sparkctl.inventory.tls_files import tls_files
from sparkctl.knowledge.serve_client import HttpFetch, Tls, endpoint_url
from sparkctl.plan.paths import draft_dir


def endpoint(inventory: Inventory) -> str:
    """The endpoint as clients see it: http://<head's inventory host>:<port> (shown, and tried from here); with
    serve.tls, https:// and the name the certificate holds (serve.tls.name, by default the same host)."""
    tls = inventory.serve.tls
    host = str(inventory.head.host)
    return endpoint_url(tls_name(tls, host) if tls else host, inventory.endpoint_port(), secure=tls is not None)


#: What to do when this machine refuses the endpoint's certificate (the clients stop there, the smoke test says it).
CERTIFICATE_HINT = ("serve.tls.ca names the CA that signed the certificate, serve.tls.name the name it holds "
                    "(`sparkctl inventory validate` checks both); then `sparkctl cluster bootstrap`")


def endpoint_tls(inventory: Inventory) -> Tls | None:
    """How sparkctl's clients check the endpoint's certificate (serve.tls), or None for plain HTTP; TlsUnreadable
    when serve.tls's files cannot be used now."""
    tls = inventory.serve.tls
    if tls is None:
        return None
    return Tls(tls_name(tls, str(inventory.head.host)), tls_files(tls).ca)


def endpoint_fetch(inventory: Inventory, api_key: str | None) -> HttpFetch:
    """Requests from this machine to the endpoint: to the head's inventory host, its certificate (with serve.tls)
    checked against the name clients use."""
    return HttpFetch(endpoint(inventory), api_key, tls=endpoint_tls(inventory), address=str(inventory.head.host))


def wanted_repos(inventory: Inventory) -> list[tuple[str, str | None]]:
    """(repo, local dir in the container or None for the hub cache): the model, then the draft."""
    spec = inventory.serve_spec()
    out: list[tuple[str, str | None]] = [(spec.model, None)]
    if spec.draft and spec.decoding != "none":
        out.append((spec.draft, draft_dir(spec.draft)))
    return out


def node_repos(inventory: Inventory, node: str) -> list[tuple[str, str | None]]:
    """What the worlds on `node` load (wanted_repos of each), each repo once."""
    out: list[tuple[str, str | None]] = []
    for world in inventory.worlds():
        if node in world.nodes:
            out += [repo for repo in wanted_repos(inventory.for_world(world)) if repo not in out]
    return out


def collector_port(inventory: Inventory) -> int | None:
    """Where the figures collector answers on the head's loopback, or None when the engine needs none (its own
    /metrics keeps its counters, and every reader can ask it)."""
    if not inventory.engine().metrics_drained:
        return None
    return inventory.serve_spec().collector_port


def figures_port(inventory: Inventory) -> int:
    """The head's loopback port whose /metrics every reader of the engine's figures shares."""
    return collector_port(inventory) or inventory.serve_spec().engine_port


def launch_fingerprint(config_text: str, command: str, revision: str | None = None) -> str:
    """What identifies a running server's setup: the config it read, the line that started it, and the model's
    commit it loads (plan/revisions.py: a pin moved is a new world)."""
    pinned = f"\0{revision}" if revision else ""
    return hashlib.sha256(f"{config_text}\0{command}{pinned}".encode()).hexdigest()[:16]
