"""The inventory's sections as strict pydantic models (unknown keys are errors; input values are never
repeated in their errors, so a token pasted in the wrong place is never echoed), and the topology defaults.
"""

from __future__ import annotations

import ipaddress
import re
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, field_validator

from sparkctl.inventory.presets import get_preset, preset_names
from sparkctl.knowledge.spark import MANAGEMENT_INTERFACES
from sparkctl.secrets import looks_like_credential, mask_credentials

DEFAULT_SERVE_PORT = 8355
NODE_NAME_RE = re.compile(r"[a-z0-9][a-z0-9-]{0,62}\Z")
CLUSTER_NAME_RE = re.compile(r"[a-z0-9][a-z0-9-]*\Z")
ENV_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
CONTAINER_NAME_RE = re.compile(r"[a-zA-Z0-9][a-zA-Z0-9_.-]*\Z")
IFNAME_RE = re.compile(r"[A-Za-z0-9_.:-]{1,15}\Z")
# Pair and switch hosts get .10, .11, ... by position, as NVIDIA's current two-Spark playbook.
FIRST_HOST_NUMBER = 10

Topology = Literal["single", "pair", "ring", "switch"]
Decoding = Literal["eagle3", "draft-target", "none"]


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
            raise ValueError(f"{mask_credentials(repr(value))} is not a node name (lowercase letters, digits and '-', "
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
    port: int = Field(DEFAULT_SERVE_PORT, ge=1, le=65535)
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
            raise ValueError(mask_credentials(f"{err.args[0]} ({hint})")) from None
        return value

    @field_validator("hf_token_env")
    @classmethod
    def _hf_token_env(cls, value: str) -> str:
        # The value is not repeated: it may be the token itself.
        if looks_like_credential(value) or not ENV_NAME_RE.match(value):
            raise ValueError("looks like a token: put the NAME of the environment variable here and export "
                             "the token in it (e.g. hf_token_env: HF_TOKEN, then `export HF_TOKEN=...`)")
        return value


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
