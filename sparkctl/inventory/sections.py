"""The inventory's sections as strict pydantic models (unknown keys are errors; input values are never
repeated in their errors, so a token pasted in the wrong place is never echoed), and the topology defaults.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PlainValidator,
    StrictBool,
    StrictFloat,
    StrictInt,
    field_validator,
)

from sparkctl.engines import DEFAULT_ENGINE, ENGINES, EngineName
from sparkctl.inventory import grammar
from sparkctl.inventory.presets import get_preset, preset_names
from sparkctl.knowledge.spark import MANAGEMENT_INTERFACES
from sparkctl.secrets import looks_like_credential, mask_credentials

DEFAULT_SERVE_PORT = 8355
DEFAULT_API_KEY_ENV = "SPARKCTL_API_KEY"
#: NGINX's official image, its stable line (docker-library/repo-info, repos/nginx: `stable-alpine` is 1.30.6 as
#: of 2026-10-21; linux/arm64 v8 among its platforms)
DEFAULT_GATEWAY_IMAGE = "docker.io/library/nginx:1.30.6-alpine"
MAX_NODES = 64
MAX_MODELS = 16
NODE_NAME_RE = re.compile(r"[a-z0-9][a-z0-9-]{0,62}\Z")
CLUSTER_NAME_RE = re.compile(r"[a-z0-9][a-z0-9-]{0,62}\Z")
ENV_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}\Z")
CONTAINER_NAME_RE = re.compile(r"[a-zA-Z0-9][a-zA-Z0-9_.-]{0,62}\Z")
IFNAME_RE = re.compile(r"[A-Za-z0-9_.:-]{1,15}\Z")
# Private unicast ranges a fabric subnet may come from: RFC 1918 and RFC 6598 (shared address space).
PRIVATE_RANGES = tuple(ipaddress.IPv4Network(n) for n in ("10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16",
                                                           "100.64.0.0/10"))
# Pair and switch hosts get .10, .11, ... by position, as NVIDIA's current two-Spark playbook.
FIRST_HOST_NUMBER = 10

Topology = Literal["single", "pair", "ring", "switch"]
Decoding = Literal["eagle3", "draft-target", "none"]


def _check_subnet(value: str) -> str:
    try:
        network = ipaddress.IPv4Network(value)
    except ValueError:
        try:
            fixed = ipaddress.IPv4Network(value, strict=False)
        except ValueError:
            raise ValueError("not an IPv4 subnet (write it like 192.168.100.0/24)") from None
        raise ValueError(f"has host bits set (did you mean {fixed}?)") from None
    if not any(network.subnet_of(r) for r in PRIVATE_RANGES):
        kind = ("multicast" if network.is_multicast else "loopback" if network.is_loopback else
                "link-local" if network.is_link_local else "reserved" if network.is_reserved else
                "unspecified" if network.is_unspecified else "public" if network.is_global else "special-purpose")
        raise ValueError(f"{network} is a {kind} range (a fabric subnet comes from a private range: "
                         "10.0.0.0/8, 172.16.0.0/12, 192.168.0.0/16 or 100.64.0.0/10)")
    if network.prefixlen > 30:
        raise ValueError(f"{network} holds no two hosts (use a /24)")
    return str(network)


def _not_bool(value: Any) -> Any:
    if isinstance(value, bool):
        raise ValueError("must be a number, not true/false (e.g. 10)")
    return value


Subnet = Annotated[str, AfterValidator(_check_subnet)]
def _listen_address(value: str) -> str:
    """One address of the head the endpoint answers on: a unicast IP address, never a wildcard or loopback."""
    try:
        address = ipaddress.ip_address(value)
    except ValueError:
        raise ValueError("not an IP address (write the head's address, like 10.0.0.11, or `all`)") from None
    if address.is_unspecified:
        raise ValueError("is every address: write `listen: all` to answer on all of the head's addresses")
    if address.is_loopback or address.is_multicast:
        raise ValueError("is not an address clients reach the head on (the engine itself answers on loopback)")
    return str(address)


def _listen(value: object) -> list[str] | str | None:
    """serve.listen: `all`, or a list of the head's addresses (each checked, repeats dropped)."""
    if value is None or value == "all":
        return value
    if not isinstance(value, list) or not value:
        raise ValueError("write `all` or a list of the head's addresses, like [10.0.0.11]")
    out: list[str] = []
    for index, item in enumerate(value):
        if not isinstance(item, str):
            raise ValueError(f"item {index}: not an address (write it as text, like 10.0.0.11)")
        try:
            address = _listen_address(item)
        except ValueError as exc:
            raise ValueError(f"item {index}: {exc}") from None
        if address not in out:
            out.append(address)
    return out


Port = Annotated[StrictInt, Field(ge=1, le=65535)]
def _not_bool_port(value: Any) -> Any:
    if isinstance(value, bool):
        raise ValueError("must be auto, 0 or 1, not true/false (0: the CX-7's first port, 1: its second)")
    return value


# a timeout shorter than a second fails on any real network; "10" in quotes is a string, not a number
Seconds = Annotated[StrictFloat, BeforeValidator(_not_bool), Field(ge=1, le=3600, allow_inf_nan=False)]
ImageRef = Annotated[str, AfterValidator(grammar.image_reference)]
RepoId = Annotated[str, AfterValidator(grammar.repo_id)]
Revision = Annotated[str, AfterValidator(grammar.revision)]
HostName = Annotated[str, AfterValidator(grammar.host)]
UserName = Annotated[str, AfterValidator(grammar.user_name)]
LocalPath = Annotated[str, AfterValidator(grammar.local_path)]
NodeDir = Annotated[str, AfterValidator(grammar.node_dir)]
NetplanPath = Annotated[str, AfterValidator(grammar.netplan_path)]
EnvValue = Annotated[str, AfterValidator(grammar.env_value)]
Argument = Annotated[str, AfterValidator(grammar.argument)]
ServedName = Annotated[str, AfterValidator(grammar.served_name)]


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", hide_input_in_errors=True)


class ClusterSettings(_Section):
    name: str = "sparks"

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        if not CLUSTER_NAME_RE.match(value):
            raise ValueError("lowercase letters, digits and '-', starting with a letter or digit, at most 63 "
                             "(e.g. spark-pair)")
        return value


class SshSettings(_Section):
    identity_file: LocalPath | None = None
    port: Port = 22
    known_hosts: LocalPath = "~/.ssh/known_hosts"
    use_ssh_config: StrictBool = True
    connect_timeout: Seconds = 10


class NodeFabric(_Section):
    interfaces: list[str] | None = Field(None, description="the twin netdevs of the cabled port, e.g. "
                                         "[enp1s0f1np1, enP2p1s0f1np1]")

    @field_validator("interfaces")
    @classmethod
    def _interfaces(cls, value: list[str] | None) -> list[str] | None:
        if value is None:
            return None
        for name in value:
            if name in MANAGEMENT_INTERFACES:
                raise ValueError(f"{name} is {MANAGEMENT_INTERFACES[name]}, never a fabric interface "
                                 "(name the two CX-7 twins, see `ibdev2netdev`)")
            if not IFNAME_RE.match(name):
                raise ValueError(f"{mask_credentials(repr(name))} is not an interface name (see `ip -br link`)")
        if len(value) != 2 or value[0] == value[1]:
            raise ValueError(f"needs exactly 2 different names, {len(value)} given (the two twins of the "
                             "cabled port, e.g. [enp1s0f1np1, enP2p1s0f1np1])")
        return value


class Node(_Section):
    name: str = Field(description="a short name like spark1")
    host: HostName = Field(description="the management address or an ~/.ssh/config alias")
    user: UserName | None = None
    port: Port | None = None
    identity_file: LocalPath | None = None
    local: StrictBool = False
    fabric: NodeFabric = Field(default_factory=NodeFabric)

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        if not NODE_NAME_RE.match(value):
            raise ValueError(f"{mask_credentials(repr(value))} is not a node name (lowercase letters, digits and '-', "
                             "at most 63, starting with a letter or digit)")
        return value


class FabricSettings(_Section):
    topology: Topology | None = None
    port: Annotated[Literal["auto", 0, 1], BeforeValidator(_not_bool_port)] = "auto"
    subnets: list[Subnet] | None = Field(None, max_length=2 * MAX_NODES)
    mtu: StrictInt = Field(9000, ge=1280, le=9216)
    netplan_file: NetplanPath = "/etc/netplan/40-cx7.yaml"


class ContainerSettings(_Section):
    # env values are strings in the end; `NCCL_IB_GID_INDEX: 3` should not need quotes
    model_config = ConfigDict(extra="forbid", hide_input_in_errors=True, coerce_numbers_to_str=True)

    # The defaults are the default engine's; with another serve.engine, that engine's (Inventory resolves them)
    name: str = ENGINES[DEFAULT_ENGINE].container_name
    image: ImageRef = ENGINES[DEFAULT_ENGINE].container_image
    ssh_port: Port = 2233
    hf_cache: NodeDir = "~/.cache/huggingface"
    env: dict[str, EnvValue] = Field(default_factory=dict, max_length=256)
    docker_args: list[Argument] = Field(default_factory=list, max_length=256)
    distribute: Literal["pull", "relay"] = Field("pull", description=(
        "how the image reaches the nodes: pull (every node from the registry) or relay (the head pulls once and "
        "sends it to each peer over the fabric: `docker save | ssh <peer> docker load`; no peer contacts a "
        "registry)"))

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        if not CONTAINER_NAME_RE.match(value):
            raise ValueError("not a container name (letters, digits, '_', '.', '-', at most 63, starting with a "
                             "letter or digit)")
        return value


class VllmSettings(_Section):
    executor: Literal["auto", "mp", "ray"] = Field("auto", description=(
        "how the ranks meet: mp (one `vllm serve` per node with --nnodes/--node-rank, the workers --headless; "
        "vLLM 0.17 and later), ray (a Ray cluster sparkctl starts on the serving nodes, one rank per node; the "
        "image must have Ray); auto: mp where the image's release has it, else ray"))
    master_port: Port = Field(29501, description="the head's port the ranks meet on over the fabric (mp)")
    ray_port: Port = Field(6379, description="the Ray head's port on the fabric (ray)")


class SglangSettings(_Section):
    dist_port: Port = Field(25000, description=(
        "the head's port the ranks meet on over the fabric (--dist-init-addr <head's fabric address>:<port>)"))


class WatchdogSettings(_Section):
    """A wedged world (alive, answering /health, generating nothing) restarted by the unit (docs/serving.md)."""

    stall_s: StrictInt = Field(120, ge=10, le=86_400, description=(
        "requests running and the engine's generated-token counter still for this long: the world is stuck"))
    canary_s: StrictInt = Field(60, ge=5, le=86_400, description=(
        "while no request runs, a one-token completion is sent to the engine's own port this often"))
    canary_deadline_s: StrictInt = Field(30, ge=1, le=3600, description=(
        "the canary's token must come within this long, else the world is stuck"))


def off_word(value: object) -> object:
    """`watchdog: off` (`firewall: off`) reads as the boolean false in YAML 1.1 (PyYAML): both mean off."""
    return "off" if value is False else value


class ModelFields(_Section):
    """What one model is and how it runs: a plain `serve:` holds these for its one model, each entry of
    serve.models for its own."""

    engine: EngineName | None = Field(None, description=(
        "trtllm (TensorRT-LLM, trtllm-serve under mpirun), vllm (vllm serve on every serving node) or sglang "
        "(sglang.launch_server on every serving node); default: the preset's engine, else trtllm"))
    preset: str | None = None
    model: RepoId | None = None
    draft: RepoId | None = None
    revision: Revision | None = Field(None, description=(
        "the model's revision on the Hub: a branch, a tag or a commit (40 hex). The commit a run resolves it to is "
        "pinned on every serving node and served by every later run until this changes or a run is given "
        "--refresh (default: main, resolved once; the draft's main is pinned the same way)"))
    decoding: Decoding | None = None
    max_draft_len: StrictInt | None = Field(None, gt=0, le=64)
    tp_size: StrictInt | None = Field(None, ge=1, le=MAX_NODES)
    pp_size: StrictInt | None = Field(None, ge=1, le=MAX_NODES, description="pipeline parallelism (trtllm-serve "
                                      "--pp_size); the launch has tp_size x pp_size ranks, one per node")
    nodes: list[str] | None = Field(None, max_length=MAX_NODES, description=(
        "the nodes the model runs on, in rank order, the head first (default: the first tp_size x pp_size nodes "
        "of the inventory); the others are left out of the launch"))
    max_num_tokens: StrictInt = Field(1024, gt=0, le=1 << 20)
    max_batch_size: StrictInt = Field(1, gt=0, le=1 << 16)
    config: dict[str, Any] = Field(default_factory=dict)
    #: "warn" goes on when the fit check says the model cannot fit (for memory sparkctl misjudges)
    fit_check: Literal["refuse", "warn"] = "refuse"
    #: seconds to wait for /health 200 after launch (a 235B model takes minutes to load)
    ready_timeout: StrictInt = Field(1800, ge=10, le=86_400)
    engine_port: Port | None = Field(None, description=(
        "where the engine answers on the head's loopback, behind the gateway (default: serve.port + 10000, or "
        "- 10000 above 55535)"))
    args: list[Argument] = Field(default_factory=list, max_length=256, description=(
        "vLLM and SGLang: extra flags of the server, checked against the image's release (TensorRT-LLM's settings "
        "go in serve.config)"))
    vllm: VllmSettings = Field(default_factory=VllmSettings)
    sglang: SglangSettings = Field(default_factory=SglangSettings)

    @field_validator("preset")
    @classmethod
    def _preset(cls, value: str | None) -> str | None:
        if value is None:
            return None
        try:
            get_preset(value)
        except KeyError as err:
            import difflib

            close = difflib.get_close_matches(value, preset_names(), n=1)
            hint = f"did you mean {close[0]!r}?" if close else "known: " + ", ".join(preset_names())
            raise ValueError(mask_credentials(f"{err.args[0]} ({hint})")) from None
        return value


#: The fields of serve: that are about one model (each entry of serve.models has its own)
MODEL_FIELD_NAMES = frozenset(ModelFields.model_fields)


class ModelEntry(ModelFields):
    """One model of serve.models: what a plain `serve:` says of its model, plus its name and placement."""

    name: ServedName | None = Field(None, description=(
        "the name clients ask for in a request's `model` field (default: the model's repo id)"))
    aliases: list[ServedName] = Field(default_factory=list, max_length=16, description=(
        "other names the same model answers to"))
    replicas: StrictInt | None = Field(None, ge=1, le=MAX_NODES, description=(
        "copies of a one-node model, each on its own node, placed by sparkctl where the most memory is left "
        "(instead of naming nodes); requests to the name go to the least busy"))


class TlsSettings(_Section):
    """HTTPS at the endpoint with a certificate the user provides (docs/gateway.md, "TLS"): files on this machine,
    sent to the head like the other secrets (content on stdin, mode 600)."""

    certificate: LocalPath = Field(description=(
        "the server's certificate in PEM, its chain after it (NGINX's ssl_certificate); it must name the address or "
        "name clients use (serve.tls.name)"))
    key: LocalPath = Field(description="its private key in PEM, unencrypted (NGINX reads it at every start)")
    ca: LocalPath | None = Field(None, description=(
        "the CA certificate(s) sparkctl's own clients trust for it, on this machine and in the smoke test on the "
        "head (default: the system roots: this machine's, and on the head the container image's)"))
    name: HostName | None = Field(None, description=(
        "the name clients reach the endpoint by, checked against the certificate (default: the head's host in "
        "the inventory); sparkctl still connects to the head's address"))


class ServeSettings(ModelFields):
    # Written as 8355 for code that reads it directly; when left out, ServeSpec.port is the preset's.
    port: Port = DEFAULT_SERVE_PORT
    hf_token_env: str = "HF_TOKEN"
    auth: Literal["key", "none"] = Field("key", description=(
        "key: every request to the endpoint but /health needs `Authorization: Bearer <key>` (the gateway checks "
        "it); none: the endpoint is open to anyone who reaches it (every run warns)"))
    api_key_env: str = Field(DEFAULT_API_KEY_ENV, description=(
        "the environment variable that holds the endpoint's API key (or <NAME>_FILE a file with it); without "
        "one, sparkctl makes a key at the first serving run and keeps it 0600 on this machine"))
    listen: Annotated[list[str] | Literal["all"] | None, PlainValidator(_listen)] = Field(None, description=(
        "the head's addresses the endpoint answers on (default: its management address, the one sparkctl's "
        "session reaches); all: every address the head has (warned about); the engine itself answers on the "
        "head's loopback only"))
    gateway_image: ImageRef = Field(DEFAULT_GATEWAY_IMAGE, description=(
        "the gateway's image: NGINX, which checks the key and listens where serve.listen says "
        "(docs/gateway.md)"))
    watchdog: Annotated[WatchdogSettings | Literal["off"], BeforeValidator(off_word)] = Field(
        default_factory=WatchdogSettings, description=(
            "the head's check of a serving world: stuck (requests running and no token, or an idle canary "
            "unanswered), the whole world is ended and started again, and the end recorded as `stuck`; off: none"))
    tls: TlsSettings | None = Field(None, description=(
        "HTTPS on the endpoint's addresses with your certificate and key (plain HTTP there is refused); the head's "
        "own loopback stays plain HTTP for what runs on the head"))
    distribute: Literal["download", "copy"] = Field(
        "download", description="how the model and draft reach the nodes: download (every node from the Hub, "
        "in parallel) or copy (the head downloads once, then sends them to the peers over the fabric)")
    models: list[ModelEntry] | None = Field(None, min_length=1, max_length=MAX_MODELS, description=(
        "several models on one cluster behind the one endpoint, each with its own world (a request goes to the "
        "model its `model` field names); each entry holds what a plain serve: says of its model, plus name, "
        "aliases and nodes or replicas. What is not about one model (port, listen, auth, watchdog, ...) stays "
        "in serve:"))

    @field_validator("hf_token_env", "api_key_env")
    @classmethod
    def _hf_token_env(cls, value: str) -> str:
        # The value is not repeated: it may be the token itself.
        if looks_like_credential(value) or not ENV_NAME_RE.match(value):
            raise ValueError("looks like a token: put the NAME of the environment variable here and export "
                             "the token in it (e.g. hf_token_env: HF_TOKEN, then `export HF_TOKEN=...`)")
        return value


_ALLOW_RE = re.compile(r"(?P<first>[0-9]{1,5})(?:-(?P<last>[0-9]{1,5}))?(?:/(?P<proto>tcp|udp))?\Z")


def _allow(value: object) -> str:
    """One port the firewall lets in on the management side: 8080, 8080/tcp, 5353/udp or 9100-9110/tcp (tcp when
    not said); a number alone is read as tcp."""
    if isinstance(value, bool):
        raise ValueError("must be a port (e.g. 8080 or 8080/tcp), not true/false")
    text = str(value) if isinstance(value, int) else value
    match = _ALLOW_RE.match(text) if isinstance(text, str) else None
    if not match:
        raise ValueError("not a port to let in (write 8080, 8080/tcp, 5353/udp or 9100-9110/tcp)")
    first, last = int(match["first"]), int(match["last"] or match["first"])
    if not 1 <= first <= last <= 65535:
        raise ValueError("ports are 1 to 65535, the first of a range not above the last (e.g. 9100-9110/tcp)")
    span = f"{first}" if first == last else f"{first}-{last}"
    return f"{span}/{match['proto'] or 'tcp'}"


def _source(value: object) -> str:
    """A network SSH is let in from: an IPv4 or IPv6 network or address (no zone: `fe80::1%eth0` means nothing to
    nftables)."""
    if isinstance(value, str) and "%" in value:
        return _bad_source()
    try:
        return str(ipaddress.ip_network(str(value), strict=True)) if isinstance(value, str) else _bad_source()
    except ValueError:
        try:
            fixed = ipaddress.ip_network(str(value), strict=False)
        except ValueError:
            return _bad_source()
        raise ValueError(f"has host bits set (did you mean {fixed}?)") from None


def _bad_source() -> str:
    raise ValueError("not a network or address (write it like 10.0.0.0/24 or 10.0.0.5)")


AllowedPort = Annotated[str, PlainValidator(_allow)]


@dataclass(frozen=True)
class PortSpan:
    """One `firewall.allow` entry as _allow wrote it (`9100-9110/tcp`), read back."""

    first: int
    last: int
    proto: Literal["tcp", "udp"]

    @classmethod
    def of(cls, allowed: str) -> PortSpan:
        span, _, proto = allowed.partition("/")
        first, _, last = span.partition("-")
        return cls(int(first), int(last or first), "udp" if proto == "udp" else "tcp")

    @property
    def nft(self) -> str:
        """As nftables writes a port or a range: 8080, 9100-9110."""
        return str(self.first) if self.first == self.last else f"{self.first}-{self.last}"

    def holds(self, port: int, proto: str = "tcp") -> bool:
        return proto == self.proto and self.first <= port <= self.last
SourceNetwork = Annotated[str, PlainValidator(_source)]


class FirewallSettings(_Section):
    """sparkctl's own nftables table on every node (docs/firewall.md): on the management side only sshd, the
    endpoint on the head, established traffic, ICMP and what `allow` lists answer; the fabric and loopback keep
    everything."""

    allow: list[AllowedPort] = Field(default_factory=list, max_length=64, description=(
        "more ports let in on the management side (not the fabric): 8080, 8080/tcp, 5353/udp, 9100-9110/tcp"))
    ssh_from: list[SourceNetwork] | None = Field(None, min_length=1, max_length=64, description=(
        "the networks sshd is let in from (default: anywhere); the controller must be in one: a rule set that "
        "cuts its way in is put back by the node itself"))

    def spans(self) -> list[PortSpan]:
        return [PortSpan.of(allowed) for allowed in self.allow]


def resolve_topology(explicit: str | None, node_count: int) -> str | None:
    """The topology in force; None when it cannot be guessed (3+ nodes: ring or switch is the user's call)."""
    if explicit:
        return explicit
    return {1: "single", 2: "pair"}.get(node_count)


def subnet_count(topology: str, node_count: int) -> int:
    return {"single": 0, "pair": 2, "switch": 2}.get(topology, 2 * node_count)


def default_subnets(topology: str, node_count: int) -> list[ipaddress.IPv4Network]:
    if topology == "single":
        return []
    if topology == "ring":
        # 192.168.0.0/24 .. 192.168.255.0/24: enough for a ring of 128 (MAX_NODES is below that)
        return [ipaddress.IPv4Network(f"192.168.{i}.0/24") for i in range(min(2 * node_count, 256))]
    return [ipaddress.IPv4Network("192.168.100.0/24"), ipaddress.IPv4Network("192.168.101.0/24")]
