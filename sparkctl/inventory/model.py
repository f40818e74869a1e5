"""The inventory: which Sparks, how to reach them, how they are cabled, what to serve.

Defaults that depend on other fields (topology, fabric subnets, the preset, tp_size) are resolved by methods,
never written back, so `dump_inventory` gives back what the user wrote. `load_inventory`
(sparkctl/inventory/loader.py) reports every problem at once as `file:line: field: what (fix)`.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import BeforeValidator, Field, PrivateAttr, ValidationInfo, model_validator

from sparkctl.engines import ENGINES, Engine
from sparkctl.inventory.checks import SKIP_CROSS_CHECKS, InventoryParts, cross_check_problems, field_path
from sparkctl.inventory.placement import ServedModel, World, model_sources, served_models
from sparkctl.inventory.sections import (
    MAX_NODES,
    MODEL_FIELD_NAMES,
    ClusterSettings,
    ContainerSettings,
    FabricSettings,
    FirewallSettings,
    Node,
    ServeSettings,
    SshSettings,
    UserName,
    _Section,
    default_subnets,
    off_word,
    resolve_topology,
)
from sparkctl.inventory.serve import ServeSpec, engine_of, resolve_serve
from sparkctl.knowledge.fitcheck import SPARK_USABLE_GB
from sparkctl.secrets import mask_credentials


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


class SeveralModels(RuntimeError):
    """A question with one answer per model asked of an inventory that serves several (a caller not yet made
    per model: loud, never the default preset's answer in silence)."""


class Inventory(_Section):
    cluster: ClusterSettings = Field(default_factory=ClusterSettings)
    user: UserName = Field(description="the SSH user, the same on every node")
    ssh: SshSettings = Field(default_factory=SshSettings)
    nodes: list[Node] = Field(min_length=1, max_length=MAX_NODES, description="the Sparks, head first")
    fabric: FabricSettings = Field(default_factory=FabricSettings)
    container: ContainerSettings = Field(default_factory=ContainerSettings)
    serve: ServeSettings = Field(default_factory=ServeSettings)
    firewall: Annotated[FirewallSettings | Literal["off"], BeforeValidator(off_word)] = Field(
        default_factory=FirewallSettings, description=(
            "sparkctl's nftables table on every node: on the management side only sshd, the endpoint (head), "
            "established traffic, ICMP and firewall.allow answer; the fabric keeps everything (docs/firewall.md); "
            "off: the nodes' own rules are left alone, and every run says so"))

    _source: Path | None = PrivateAttr(default=None)
    _lines: dict[tuple, int] = PrivateAttr(default_factory=dict)
    _warnings: list[str] = PrivateAttr(default_factory=list)
    #: the one world this inventory is a view of (for_world), with its model's spec; None: the whole inventory
    _world: World | None = PrivateAttr(default=None)
    _world_spec: ServeSpec | None = PrivateAttr(default=None)

    @model_validator(mode="after")
    def _one_entry(self) -> Inventory:
        """serve.models with one entry is a plain serve: with that entry's fields: read in place but not marked as
        set, so dump_inventory still gives back what the user wrote."""
        if self.serve.models and len(self.serve.models) == 1:
            # as placement reads it (a model of its own without tp_size: one rank per named node or replica)
            settings = model_sources(self.serve)[0].settings
            for name in MODEL_FIELD_NAMES - self.serve.model_fields_set:
                self.serve.__dict__[name] = getattr(settings, name)
        return self

    @model_validator(mode="after")
    def _engine_defaults(self) -> Inventory:
        """The container's name and image follow the engine where they are not written: resolved in place but not
        marked as set, so dump_inventory still gives back what the user wrote. The models of serve.models share
        one engine (checked)."""
        first = model_sources(self.serve)[0].settings
        engine = ENGINES[engine_of(first, len(self.nodes))]
        for key, value in (("name", engine.container_name), ("image", engine.container_image)):
            if key not in self.container.model_fields_set:
                self.container.__dict__[key] = value
        return self

    @model_validator(mode="after")
    def _cross_checks(self, info: ValidationInfo) -> Inventory:
        if info.context and info.context.get(SKIP_CROSS_CHECKS):
            return self
        problems = cross_check_problems(self.parts())
        if problems:
            raise ValueError(mask_credentials("; ".join(f"{field_path(loc)}: {message}" for loc, message in problems)))
        return self

    def parts(self) -> InventoryParts:
        return InventoryParts(len(self.nodes), list(self.nodes), self.fabric, self.serve, self.container, self.ssh,
                              serving="serve" in self.model_fields_set, firewall=self.firewall)

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
        """The one model's spec (a plain serve:, or serve.models of one entry). With several models there is no one
        answer: their fields are each entry's, and serve:'s own are unset (it would be the default preset's)."""
        if self._world_spec is not None:
            return self._world_spec
        if self.serve.models and len(self.serve.models) > 1:
            raise SeveralModels("the inventory serves several models: ask for each one's spec (served_models())")
        spec = resolve_serve(self.serve, len(self.nodes))
        if self.serve.models:
            entry = self.serve.models[0]
            spec = replace(spec, name=entry.name, aliases=tuple(entry.aliases))
        return spec

    def engine(self) -> Engine:
        """The engine that serves (serve.engine, else the preset's, else the default); the models of serve.models
        share one (checked), so the first entry's."""
        return ENGINES[engine_of(model_sources(self.serve)[0].settings, len(self.nodes))]

    def served_models(self) -> list[ServedModel]:
        """Every model of serve: with its worlds placed (a plain serve: is one model, one world)."""
        return served_models(self.serve, [n.name for n in self.nodes], SPARK_USABLE_GB)

    def endpoint_port(self) -> int:
        """Where the endpoint answers: serve.port (a plain serve: of a preset, the preset's unless written)."""
        return self.served_models()[0].spec.port

    def worlds(self) -> list[World]:
        """Every world of every model, in the order of serve.models (a plain serve: has one)."""
        return [world for model in self.served_models() for world in model.worlds]

    def for_world(self, world: World) -> Inventory:
        """The inventory as one of its worlds sees it: serve: is its model's settings (serve:'s shared ones around
        them) and serve.nodes its nodes; the cluster (nodes, head, fabric, container) stays whole. What plans or
        runs one world (its launch, unit, config) reads this."""
        model = next(m for m in self.served_models() if world in m.worlds)
        settings = model.settings.model_copy()
        settings.__dict__.update(nodes=list(world.nodes), models=None)
        view = self.model_copy(update={"serve": settings})
        # the copy marks serve: as written; a bare inventory's view must still serve nothing (serving_enabled)
        view.__pydantic_fields_set__ = set(self.model_fields_set)
        view._world, view._world_spec = world, model.spec
        return view

    @property
    def world_key(self) -> str:
        """Which world this inventory is a view of (World.key); "" for the whole inventory (its first world)."""
        return self._world.key if self._world is not None else ""

    def serving_nodes(self) -> list[str]:
        """The nodes the model runs on, in rank order (the head first): serve.nodes, else the first
        tp_size x pp_size nodes of the inventory. A node not in it is left out of the launch."""
        if self.serve.nodes:
            return list(self.serve.nodes)
        return [n.name for n in self.nodes[:self.serve_spec().world_size]]

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

    @property
    def warnings(self) -> list[str]:
        """`file:line: field: what` for what loaded but is most likely a mistake."""
        return list(self._warnings)

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


def inventory_json_schema() -> dict[str, Any]:
    return Inventory.model_json_schema()


def dump_inventory(inventory: Inventory) -> str:
    """YAML for the inventory as written: fields never given are left out (and keep resolving as defaults)."""
    data = inventory.model_dump(mode="json", exclude_unset=True)
    return yaml.safe_dump(data, sort_keys=False, default_flow_style=False)
