"""The inventory: which Sparks, how to reach them, how they are cabled, what to serve.

The model is strict (unknown keys are errors) and hides input values from its errors, so a token pasted
in the wrong place is never echoed. Defaults that depend on other fields (topology, fabric subnets, the
preset, tp_size) are resolved by methods, never written back, so `dump_inventory` gives back what the
user wrote.
`load_inventory` (sparkctl.inventory_loader) reports every problem at once as `file:line: field: what (fix)`.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationInfo,
    field_validator,
    model_validator,
)

from sparkctl.inventory_serve import DEFAULT_PORT, ServeSpec, resolve_serve
from sparkctl.presets import get_preset, preset_names

NODE_NAME_RE = re.compile(r"[a-z0-9][a-z0-9-]{0,62}\Z")
CLUSTER_NAME_RE = re.compile(r"[a-z0-9][a-z0-9-]*\Z")
ENV_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
HF_TOKEN_RE = re.compile(r"hf_[A-Za-z0-9]{20,}")
CONTAINER_NAME_RE = re.compile(r"[a-zA-Z0-9][a-zA-Z0-9_.-]*\Z")
IFNAME_RE = re.compile(r"[A-Za-z0-9_.:-]{1,15}\Z")
# Never fabric: the management session and Wi-Fi ride on these (REFERENCE.md §1).
RESERVED_INTERFACES = {"enP7s7": "the 10GbE management port", "wlP9s9": "the Wi-Fi interface"}
# Pair and switch hosts get .10, .11, ... by position, as NVIDIA's current two-Spark playbook.
FIRST_HOST_NUMBER = 10
# The validation context key that makes the model skip cross-field checks (the loader runs them itself,
# with locations, on whatever parts did validate).
SKIP_CROSS_CHECKS = "sparkctl_skip_cross_checks"

Topology = Literal["single", "pair", "ring", "switch"]
Decoding = Literal["eagle3", "draft-target", "none"]


def redact(text: str) -> str:
    """Hide anything shaped like a Hugging Face token: messages repeat values, never secrets."""
    return HF_TOKEN_RE.sub("hf_***", text)


def _login_word(value: str) -> str:
    if not value or any(c.isspace() for c in value):
        raise ValueError("must be a non-empty word without spaces")
    if value.startswith("-"):
        raise ValueError("must not start with '-' (it would be read as an ssh option)")
    return value


def _check_subnet(value: str) -> str:
    try:
        return str(ipaddress.IPv4Network(value))
    except ValueError:
        pass
    try:
        fixed = ipaddress.IPv4Network(value, strict=False)
    except ValueError:
        raise ValueError("not an IPv4 subnet (write it like 192.168.100.0/24)") from None
    raise ValueError(f"has host bits set (did you mean {fixed}?)")


Subnet = Annotated[str, AfterValidator(_check_subnet)]


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", hide_input_in_errors=True)


class ClusterSettings(_Section):
    name: str = "sparks"

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        if not CLUSTER_NAME_RE.match(value):
            raise ValueError("lowercase letters, digits and '-', starting with a letter or digit "
                             "(e.g. spark-pair)")
        return value


class SshSettings(_Section):
    identity_file: str | None = None
    port: int = Field(22, ge=1, le=65535)
    known_hosts: str = "~/.ssh/known_hosts"
    use_ssh_config: bool = True
    connect_timeout: float = Field(10, gt=0)


class NodeFabric(_Section):
    interfaces: list[str] | None = Field(None, description="the twin netdevs of the cabled port, e.g. "
                                         "[enp1s0f1np1, enP2p1s0f1np1]")

    @field_validator("interfaces")
    @classmethod
    def _interfaces(cls, value: list[str] | None) -> list[str] | None:
        if value is None:
            return None
        for name in value:
            if name in RESERVED_INTERFACES:
                raise ValueError(f"{name} is {RESERVED_INTERFACES[name]}, never a fabric interface "
                                 "(name the two CX-7 twins, see `ibdev2netdev`)")
            if not IFNAME_RE.match(name):
                raise ValueError(f"{redact(repr(name))} is not an interface name (see `ip -br link`)")
        if len(value) != 2 or value[0] == value[1]:
            raise ValueError(f"needs exactly 2 different names, {len(value)} given (the two twins of the "
                             "cabled port, e.g. [enp1s0f1np1, enP2p1s0f1np1])")
        return value


class Node(_Section):
    name: str = Field(description="a short name like spark1")
    host: str = Field(description="the management address or an ~/.ssh/config alias")
    user: str | None = None
    port: int | None = Field(None, ge=1, le=65535)
    identity_file: str | None = None
    local: bool = False
    fabric: NodeFabric = Field(default_factory=NodeFabric)

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        if not NODE_NAME_RE.match(value):
            raise ValueError(f"{redact(repr(value))} is not a node name (lowercase letters, digits and '-', "
                             "at most 63, starting with a letter or digit)")
        return value

    @field_validator("host")
    @classmethod
    def _host(cls, value: str) -> str:
        value = _login_word(value)
        if "@" in value:
            raise ValueError("contains '@' (put the user in `user:` and only the address here)")
        return value

    @field_validator("user")
    @classmethod
    def _user(cls, value: str | None) -> str | None:
        return None if value is None else _login_word(value)


class FabricSettings(_Section):
    topology: Topology | None = None
    port: Literal["auto", 0, 1] = "auto"
    subnets: list[Subnet] | None = None
    mtu: int = Field(9000, ge=1280, le=9216)
    netplan_file: str = "/etc/netplan/40-cx7.yaml"

    @field_validator("netplan_file")
    @classmethod
    def _netplan_file(cls, value: str) -> str:
        if not (value.startswith("/etc/netplan/") and value.endswith(".yaml") and ".." not in value):
            raise ValueError("must be a .yaml file in /etc/netplan/ (e.g. /etc/netplan/40-cx7.yaml)")
        return value


class ContainerSettings(_Section):
    # env values are strings in the end; `NCCL_IB_GID_INDEX: 3` should not need quotes
    model_config = ConfigDict(extra="forbid", hide_input_in_errors=True, coerce_numbers_to_str=True)

    name: str = "trtllm-multinode"
    image: str = "nvcr.io/nvidia/tensorrt-llm/release:1.3.0rc12"
    ssh_port: int = Field(2233, ge=1, le=65535)
    hf_cache: str = "~/.cache/huggingface"
    env: dict[str, str] = Field(default_factory=dict)
    docker_args: list[str] = Field(default_factory=list)

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        if not CONTAINER_NAME_RE.match(value):
            raise ValueError("not a container name (letters, digits, '_', '.', '-')")
        return value

    @field_validator("hf_cache")
    @classmethod
    def _hf_cache(cls, value: str) -> str:
        # docker reads a relative `-v` source as a volume name, and `~user` is not expanded on the node
        if not (value.startswith("/") or value == "~" or value.startswith("~/")):
            raise ValueError("must be an absolute path or start with ~/ (e.g. ~/.cache/huggingface)")
        return value


class ServeSettings(_Section):
    preset: str | None = None
    model: str | None = None
    draft: str | None = None
    decoding: Decoding | None = None
    max_draft_len: int | None = Field(None, gt=0)
    tp_size: int | None = Field(None, ge=1)
    # Written as 8355 for code that reads it directly; when left out, ServeSpec.port is the preset's.
    port: int = Field(DEFAULT_PORT, ge=1, le=65535)
    max_num_tokens: int = Field(1024, gt=0)
    max_batch_size: int = Field(1, gt=0)
    config: dict[str, Any] = Field(default_factory=dict)
    hf_token_env: str = "HF_TOKEN"
    #: "warn" goes on when the fit check says the model cannot fit (for memory sparkctl misjudges)
    fit_check: Literal["refuse", "warn"] = "refuse"
    #: seconds to wait for /health 200 after launch (a 235B model takes minutes to load)
    ready_timeout: int = Field(1800, gt=0)
    distribute: Literal["download", "copy"] = Field(
        "download", description="how the model and draft reach the nodes: download (every node from the Hub, "
        "in parallel) or copy (the head downloads once, then sends them to the peers over the fabric)")

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
            raise ValueError(redact(f"{err.args[0]} ({hint})")) from None
        return value

    @field_validator("hf_token_env")
    @classmethod
    def _hf_token_env(cls, value: str) -> str:
        # The value is not repeated: it may be the token itself.
        if HF_TOKEN_RE.search(value) or not ENV_NAME_RE.match(value):
            raise ValueError("looks like a token: put the NAME of the environment variable here and export "
                             "the token in it (e.g. hf_token_env: HF_TOKEN, then `export HF_TOKEN=...`)")
        return value


@dataclass(frozen=True)
class SshTarget:
    """How to open the management SSH session to one node (per-node overrides applied)."""

    name: str
    host: str
    user: str
    port: int
    identity_file: str | None
    known_hosts: str
    use_ssh_config: bool
    connect_timeout: float
    local: bool


class Inventory(_Section):
    cluster: ClusterSettings = Field(default_factory=ClusterSettings)
    user: str = Field(description="the SSH user, the same on every node")
    ssh: SshSettings = Field(default_factory=SshSettings)
    nodes: list[Node] = Field(min_length=1, description="the Sparks, head first")
    fabric: FabricSettings = Field(default_factory=FabricSettings)
    container: ContainerSettings = Field(default_factory=ContainerSettings)
    serve: ServeSettings = Field(default_factory=ServeSettings)

    _source: Path | None = PrivateAttr(default=None)
    _lines: dict[tuple, int] = PrivateAttr(default_factory=dict)

    @field_validator("user")
    @classmethod
    def _user(cls, value: str) -> str:
        return _login_word(value)

    @model_validator(mode="after")
    def _cross_checks(self, info: ValidationInfo) -> Inventory:
        if info.context and info.context.get(SKIP_CROSS_CHECKS):
            return self
        from sparkctl.inventory_checks import InventoryParts, cross_check_problems, field_path

        problems = cross_check_problems(InventoryParts.of(self))
        if problems:
            raise ValueError(redact("; ".join(f"{field_path(loc)}: {message}" for loc, message in problems)))
        return self

    # -- resolved views ------------------------------------------------------------------------------------
    @property
    def head(self) -> Node:
        """MPI rank 0, the node that serves HTTP."""
        return self.nodes[0]

    @property
    def topology(self) -> str:
        return resolve_topology(self.fabric.topology, len(self.nodes)) or "switch"

    def fabric_subnets(self) -> list[ipaddress.IPv4Network]:
        """One subnet per twin. pair/switch: [twin 1, twin 2]; ring: cable i uses [2i] and [2i+1]."""
        if self.fabric.subnets is not None:
            return [ipaddress.IPv4Network(s) for s in self.fabric.subnets]
        return default_subnets(self.topology, len(self.nodes))

    @property
    def tp_size(self) -> int:
        return self.serve_spec().tp_size

    def serve_spec(self) -> ServeSpec:
        return resolve_serve(self.serve, len(self.nodes))

    def node(self, name: str) -> Node:
        for node in self.nodes:
            if node.name == name:
                return node
        raise KeyError(f"no node named {name!r} in the inventory")

    def ssh_target(self, node: Node | str) -> SshTarget:
        node = self.node(node) if isinstance(node, str) else node
        return SshTarget(
            name=node.name,
            host=node.host,
            user=node.user or self.user,
            port=node.port or self.ssh.port,
            identity_file=node.identity_file or self.ssh.identity_file,
            known_hosts=self.ssh.known_hosts,
            use_ssh_config=self.ssh.use_ssh_config,
            connect_timeout=self.ssh.connect_timeout,
            local=node.local,
        )

    # -- where things were written ---------------------------------------------------------------------------
    @property
    def source(self) -> Path | None:
        return self._source

    def line_of(self, *loc: str | int, nearest: bool = False) -> int | None:
        """The line of a field, e.g. line_of("nodes", 1, "host"); with nearest, else its written parent's."""
        loc_t = tuple(loc)
        while True:
            if loc_t in self._lines:
                return self._lines[loc_t]
            if not nearest or not loc_t:
                return None
            loc_t = loc_t[:-1]

    def where(self, *loc: str | int) -> str:
        """`file:line` of a field (its closest written parent if it was defaulted), for messages."""
        name = str(self._source) if self._source else "<inventory>"
        line = self.line_of(*loc, nearest=True)
        return f"{name}:{line}" if line else name


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
        return [ipaddress.IPv4Network(f"192.168.{i}.0/24") for i in range(2 * node_count)]
    return [ipaddress.IPv4Network("192.168.100.0/24"), ipaddress.IPv4Network("192.168.101.0/24")]


def load_inventory(path: str | Path) -> Inventory:
    """Load and validate; raises sparkctl.errors.InventoryError listing every problem as file:line."""
    from sparkctl.inventory_loader import load_inventory as load

    return load(path)


def inventory_json_schema() -> dict[str, Any]:
    return Inventory.model_json_schema()


def dump_inventory(inventory: Inventory) -> str:
    """YAML for the inventory as written: fields never given are left out (and keep resolving as defaults)."""
    data = inventory.model_dump(mode="json", exclude_unset=True)
    return yaml.safe_dump(data, sort_keys=False, default_flow_style=False)
