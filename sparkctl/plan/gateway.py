"""PURE: the gateway on the head, in front of the engine: NGINX (docs/gateway.md) in its own container, host
network, `--restart unless-stopped`. It answers on the addresses serve.listen names (default: the head's
management address, the one sparkctl's session reaches) and on the head's loopback, at the serve port, checks the
key on every path but /health, and passes each request, streams included, to the world of the model it names, whose
engine answers at its own port (serve.engine_port) on the head's loopback alone, or, off the head, on that node's
fabric address. Its config holds the key: a 0600 file in the
head's state dir, mounted read-only (the folder, so a new file replacing the old is what NGINX reads on reload).
"""

from __future__ import annotations

import hashlib
import ipaddress
import json
import posixpath
from dataclasses import dataclass

from sparkctl.facts import Facts
from sparkctl.inventory import Inventory
from sparkctl.plan.container import RESTART_POLICY, SPEC_LABEL, cluster_label
from sparkctl.plan.render import render
from sparkctl.plan.serve import collector_port, figures_port

GATEWAY_CONTAINER = "sparkctl-gateway"
CONFIG_DIR_IN_CONTAINER = "/etc/sparkctl-gateway"
CONFIG_NAME = "nginx.conf"
ROUTER_NAME = "router.js"
#: serve.tls's files beside the config (mode 600; the folder is the container's, read-only)
CERTIFICATE_NAME = "tls-certificate.pem"
KEY_NAME = "tls-key.pem"
#: Where the engine answers: only the gateway (on the same host network) reaches it there.
ENGINE_HOST = "127.0.0.1"


def gateway_dir(state_dir: str) -> str:
    """The gateway's folder on the head: its config, router and serve.tls's files (the container's, read-only)."""
    return posixpath.join(state_dir, "gateway")


class ListenUnknown(ValueError):
    """The head's address to answer on cannot be told (no facts of the head, no session address)."""


def listen_addresses(inventory: Inventory, facts: Facts | None) -> list[str]:
    """The addresses the endpoint answers on: serve.listen's; with `all`, every address of the head but loopback
    and link-local ones (never the wildcard: the engine holds the port on loopback); by default the one
    sparkctl's session reached the head on (its management address)."""
    listen = inventory.serve.listen
    if isinstance(listen, list):
        return list(listen)
    if facts is None:
        raise ListenUnknown("the head's addresses are not known (its facts were not read)")
    if listen == "all":
        found: list[str] = []
        for iface in facts.interfaces.values():
            for address in iface.addresses:
                ip = ipaddress.ip_address(address.ip)
                if not (ip.is_loopback or ip.is_link_local) and str(ip) not in found:
                    found.append(str(ip))
        return sorted(found, key=lambda a: (ipaddress.ip_address(a).version, ipaddress.ip_address(a)))
    if facts.session_ip and not ipaddress.ip_address(facts.session_ip).is_loopback:
        return [facts.session_ip]
    # sparkctl runs on the head itself and reached it on loopback (where the engine answers): the management
    # interface's own address is the one its users reach
    for name in facts.management_interfaces:
        management = facts.interfaces.get(name)
        for address in management.addresses if management else []:
            if address.family == "inet" and address.scope == "global":
                return [address.ip]
    raise ListenUnknown("the head's management address is not known (sparkctl reached it on "
                        f"{facts.session_ip or 'an address it could not tell'})")


@dataclass(frozen=True)
class GatewayModel:
    """One model behind the endpoint: the names it answers to (its own first) and its worlds' engines."""

    names: tuple[str, ...]
    servers: tuple[tuple[str, int], ...]
    #: where its figures are read: its first world's /metrics, its collector's for an engine whose own a read
    #: empties (None: its first world's engine's own)
    figures: tuple[str, int] | None = None

    @property
    def figures_at(self) -> tuple[str, int]:
        return self.figures or self.servers[0]

    @property
    def name(self) -> str:
        return self.names[0]


@dataclass(frozen=True)
class GatewaySpec:
    cluster: str
    image: str
    listen: tuple[str, ...]
    port: int
    engine_port: int
    config_dir: str          # on the head
    authenticated: bool
    #: where /metrics goes instead of the engine: the first world's figures collector (plan/collector.py), or None
    metrics_port: int | None = None
    metrics_host: str = ENGINE_HOST
    #: the models a request's `model` field chooses among (the first answers a request that names none)
    models: tuple[GatewayModel, ...] = ()
    #: HTTPS on the listen addresses with serve.tls's certificate and key (the head's loopback stays plain)
    tls: bool = False
    #: the engine that serves them (`owned_by` of a model whose world did not list it)
    engine: str = ""

    @property
    def bound(self) -> tuple[str, ...]:
        """Every address NGINX listens on: serve.listen's, and the head's loopback (its own clients)."""
        return (*self.listen, ENGINE_HOST)

    @property
    def config_path(self) -> str:
        return posixpath.join(self.config_dir, CONFIG_NAME)

    @property
    def router_path(self) -> str:
        return posixpath.join(self.config_dir, ROUTER_NAME)

    @property
    def tls_paths(self) -> tuple[str, str]:
        """Where serve.tls's certificate and key are written on the head."""
        return posixpath.join(self.config_dir, CERTIFICATE_NAME), posixpath.join(self.config_dir, KEY_NAME)

    def config(self, key: str | None) -> str:
        """The NGINX config; `key` None renders an open endpoint (serve.auth: none)."""
        return render("gateway-nginx.conf.j2", cluster=self.cluster, key=key if self.authenticated else None,
                      listen=self.listen, loopback=ENGINE_HOST, port=self.port, metrics_port=self.metrics_port,
                      metrics_host=self.metrics_host,
                      models=self.models, router=posixpath.join(CONFIG_DIR_IN_CONTAINER, ROUTER_NAME),
                      figures=[model.figures_at for model in self.models],
                      lists=[self.list_location(i) for i in range(len(self.models))] if len(self.models) > 1 else [],
                      tls=self.tls, certificate=posixpath.join(CONFIG_DIR_IN_CONTAINER, CERTIFICATE_NAME),
                      certificate_key=posixpath.join(CONFIG_DIR_IN_CONTAINER, KEY_NAME))

    def router(self) -> str:
        """njs's router: a request's `model` field -> the named location of that model's world."""
        routes = {name: f"@model_{i}" for i, model in enumerate(self.models) for name in model.names}
        lists = [self.list_location(i) for i in range(len(self.models))] if len(self.models) > 1 else []
        figures = {name: f"@figures_{i}" for i, model in enumerate(self.models) for name in model.names}
        return render("gateway-router.js.j2", cluster=self.cluster, routes=routes,
                      served=[name for model in self.models for name in model.names], first="@model_0",
                      lists=lists, owner=self.engine or "sparkctl", figures=figures)

    @staticmethod
    def list_location(index: int) -> str:
        """The internal location that asks model `index`'s worlds for their /v1/models (the router merges them)."""
        return f"/sparkctl-models/{index}"

    def spec_hash(self) -> str:
        """What a running gateway must have been made from (its config, which holds the key, is judged apart)."""
        body = json.dumps({"image": self.image, "dir": self.config_dir, "argv": self.command(),
                           "restart": RESTART_POLICY}, sort_keys=True)
        return hashlib.sha256(body.encode()).hexdigest()[:16]

    def command(self) -> list[str]:
        return ["nginx", "-c", f"{CONFIG_DIR_IN_CONTAINER}/{CONFIG_NAME}", "-g", "daemon off;"]

    def test_argv(self) -> list[str]:
        """NGINX's own test of the (new) config and the files it names, inside the container (`nginx -t`)."""
        return ["docker", "exec", GATEWAY_CONTAINER, "nginx", "-t", "-c", f"{CONFIG_DIR_IN_CONTAINER}/{CONFIG_NAME}"]

    def reload_argv(self) -> list[str]:
        """NGINX's graceful reload of the (new) config, asked inside the container (`nginx -s reload`)."""
        return ["docker", "exec", GATEWAY_CONTAINER, "nginx", "-c", f"{CONFIG_DIR_IN_CONTAINER}/{CONFIG_NAME}",
                "-s", "reload"]

    def run_argv(self) -> list[str]:
        return ["docker", "run", "-d", "--name", GATEWAY_CONTAINER, "--restart", RESTART_POLICY,
                "--network", "host", "-v", f"{self.config_dir}:{CONFIG_DIR_IN_CONTAINER}:ro",
                "--label", cluster_label(self.cluster), "--label", f"{SPEC_LABEL}={self.spec_hash()}",
                self.image, *self.command()]


def offline_listen(inventory: Inventory) -> list[str] | None:
    """What `cluster plan` can tell without the head's facts: serve.listen's addresses, or the inventory's host of
    the head when it is an address (the management address sparkctl's session reaches); None otherwise."""
    if isinstance(inventory.serve.listen, list):
        return list(inventory.serve.listen)
    if inventory.serve.listen == "all":
        return None
    try:
        address = ipaddress.ip_address(str(inventory.head.host))
    except ValueError:
        return None
    return None if address.is_loopback else [str(address)]


def gateway_spec(inventory: Inventory, facts: Facts | None, state_dir: str,
                 listen: list[str] | None = None, hosts: dict[str, str] | None = None) -> GatewaySpec:
    """`listen`: the addresses when they are known without facts (`cluster plan`); `hosts`: where each world's API
    server answers, by its key (Launch.host; the head's loopback where not given)."""
    hosts = hosts or {}
    served = inventory.served_models()
    models = tuple(GatewayModel(names=(m.spec.served_name, *m.spec.aliases),
                                servers=tuple((hosts.get(w.key, ENGINE_HOST), m.spec.engine_port) for w in m.worlds),
                                figures=(hosts.get(m.worlds[0].key, ENGINE_HOST),
                                         figures_port(inventory.for_world(m.worlds[0]))))
                   for m in served)
    return GatewaySpec(cluster=inventory.cluster.name, image=inventory.serve.gateway_image,
                       listen=tuple(listen if listen is not None else listen_addresses(inventory, facts)),
                       port=inventory.endpoint_port(), engine_port=served[0].spec.engine_port,
                       config_dir=gateway_dir(state_dir),
                       authenticated=inventory.serve.auth == "key",
                       metrics_port=collector_port(inventory.for_world(served[0].worlds[0])),
                       metrics_host=hosts.get("", ENGINE_HOST), models=models,
                       tls=inventory.serve.tls is not None, engine=inventory.engine().name)
