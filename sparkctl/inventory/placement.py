"""PURE: the models of `serve:` and where each runs.

A plain `serve:` is one model. `serve.models` lists several; each entry holds what a plain `serve:` says of its
model and is read with serve:'s shared settings (port, listen, auth, ...) around it. Every model gets one world
per placement: its `nodes`, else `replicas` one-node worlds placed where the most memory is left after the models
before it in the list (a model's replicas on different nodes), else the first tp_size x pp_size nodes of the
inventory.

Memory is a node's usable memory as DGX OS reports it on a Spark (knowledge/spark.py); what a world takes on each
of its nodes is the fit check's figure (knowledge/fitcheck.py), summed over every world on the node.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace

from sparkctl.inventory.sections import MODEL_FIELD_NAMES, ModelEntry, ServeSettings
from sparkctl.inventory.serve import ServeSpec, engine_port, resolve_serve
from sparkctl.knowledge.fitcheck import needed_per_node_gb

Loc = tuple[str | int, ...]
#: A world's key, as long as it may be in a unit's name and a directory's.
WORLD_KEY_MAX = 80
#: How far apart the engines of two models are by default: the engine's port and the collector's after it.
ENGINE_PORT_STRIDE = 2


@dataclass(frozen=True)
class ModelSource:
    """One model as written: where, its entry (None for a plain serve:), and its settings with serve:'s shared
    ones around them."""

    loc: Loc
    entry: ModelEntry | None
    settings: ServeSettings


@dataclass(frozen=True)
class World:
    """One running copy of a model: its ranks' nodes in rank order (the first serves HTTP)."""

    model: str
    nodes: tuple[str, ...]
    replica: int = 0
    #: what tells its things apart on a node (its unit, its run/serve dir, its processes' marker): "" for the first
    #: world of serve.models[0] (the names a cluster of one model always had, so adding a model renames nothing that
    #: runs), else its model's name as a word (world_key)
    key: str = ""


@dataclass(frozen=True)
class ServedModel:
    name: str
    aliases: tuple[str, ...]
    loc: Loc
    settings: ServeSettings
    spec: ServeSpec
    worlds: tuple[World, ...]

    @property
    def needed_gb(self) -> float | None:
        """What one of its ranks takes on a node, when sparkctl knows the model's size."""
        return model_needed_gb(self.spec)


def model_needed_gb(spec: ServeSpec) -> float | None:
    if spec.weights_gb is None:
        return None
    return needed_per_node_gb(spec.weights_gb, spec.tp_size, spec.draft_gb)


def model_sources(serve: ServeSettings) -> list[ModelSource]:
    """Each model of serve: with its own settings (a plain serve: is its one model)."""
    if not serve.models:
        return [ModelSource(("serve",), None, serve)]
    several = len(serve.models) > 1
    return [ModelSource(("serve", "models", i), entry, entry_settings(serve, entry, i, several))
            for i, entry in enumerate(serve.models)]


def entry_settings(serve: ServeSettings, entry: ModelEntry, index: int, several: bool) -> ServeSettings:
    """An entry of serve.models read as a plain serve: would be: its model's fields, serve:'s shared ones. With
    several models the endpoint's port is serve.port (no one preset's), and an engine's port, when not written,
    is serve.port's engine port moved by ENGINE_PORT_STRIDE per entry, so that two engines never want one."""
    values = {name: getattr(serve, name) for name in ServeSettings.model_fields if name not in MODEL_FIELD_NAMES}
    values.update({name: getattr(entry, name) for name in MODEL_FIELD_NAMES})
    values["models"] = None
    written = ({n for n in serve.model_fields_set if n not in MODEL_FIELD_NAMES and n != "models"}
               | (entry.model_fields_set & MODEL_FIELD_NAMES) | ({"port"} if several else set()))
    settings = ServeSettings.model_construct(_fields_set=written, **values)
    if entry.tp_size is None and entry.preset is None:
        # a model of its own, no tp_size: its world is the nodes it names, or one node per replica
        if entry.nodes:
            settings.__dict__["tp_size"] = max(1, len(entry.nodes) // (entry.pp_size or 1))
        elif entry.replicas:
            settings.__dict__["tp_size"] = 1
    if entry.engine_port is None and several:
        base = engine_port(settings, 1)
        settings.__dict__["engine_port"] = base + ENGINE_PORT_STRIDE * index
    return settings


def _named(spec: ServeSpec, entry: ModelEntry | None) -> ServeSpec:
    return spec if entry is None else replace(spec, name=entry.name, aliases=tuple(entry.aliases))


def served_models(serve: ServeSettings, node_names: list[str], budget_gb: float) -> list[ServedModel]:
    """Every model with its worlds placed. The inventory's checks have passed (placement_problems says what
    would not)."""
    sources = model_sources(serve)
    specs = [_named(resolve_serve(s.settings, len(node_names)), s.entry) for s in sources]
    load = {name: 0.0 for name in node_names}
    held = {name: 0 for name in node_names}
    placed: dict[int, list[tuple[str, ...]]] = {}

    def take(nodes: tuple[str, ...], spec: ServeSpec) -> None:
        for node in nodes:
            load[node] += model_needed_gb(spec) or 0.0
            held[node] += 1

    # in list order: a model appended later moves none placed before it (a world moved would start again elsewhere)
    for i, (source, spec) in enumerate(zip(sources, specs, strict=True)):
        replicas = _auto_placed(source, spec)
        if replicas is None:
            nodes = tuple(source.settings.nodes or node_names[:spec.world_size])
            placed[i] = [nodes]
            take(nodes, spec)
            continue
        placed[i] = []
        for _ in range(replicas):
            free = [n for n in node_names if (n,) not in placed[i]]
            if not free:
                break
            best = max(free, key=lambda n: (budget_gb - load[n], -held[n], -node_names.index(n)))
            placed[i].append((best,))
            take((best,), spec)
    out = []
    for i, (source, spec) in enumerate(zip(sources, specs, strict=True)):
        worlds = tuple(World(spec.served_name, nodes, r, "" if i == r == 0 else world_key(spec.served_name, r))
                       for r, nodes in enumerate(placed[i]))
        out.append(ServedModel(spec.served_name, spec.aliases, source.loc, source.settings, spec, worlds))
    return out


def world_key(name: str, replica: int) -> str:
    """A world's key from its model's name: lowercase letters, digits and '-' (a repo id's '/' and '.' as '-'),
    then its replica's number from the second on (`gpt-oss`, `gpt-oss-2`)."""
    word = re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")[:WORLD_KEY_MAX - 4].strip("-") or "model"
    return f"{word}-{replica + 1}" if replica else word


def _auto_placed(source: ModelSource, spec: ServeSpec) -> int | None:
    """How many one-node worlds sparkctl places for this model; None when its nodes are written or it spans
    several nodes (then it takes the first ones)."""
    entry = source.entry
    if entry is None or entry.nodes or spec.world_size != 1:
        return None
    return entry.replicas or 1


def node_loads(models: list[ServedModel]) -> dict[str, list[tuple[ServedModel, float | None]]]:
    """{node: [(model, what one of its ranks takes there)]} over every world."""
    out: dict[str, list[tuple[ServedModel, float | None]]] = {}
    for model in models:
        for world in model.worlds:
            for node in world.nodes:
                out.setdefault(node, []).append((model, model.needed_gb))
    return out
