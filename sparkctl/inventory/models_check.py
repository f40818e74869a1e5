"""Checks of serve.models as a whole: one name per model, a placement the nodes can hold (memory summed over
every model on a node), the cabling its worlds need, one engine per cluster, and ports of their own.

Each entry's own settings are checked like a plain serve: (checks.py runs those per entry); these run once they
pass.
"""

from __future__ import annotations

from collections.abc import Iterator

from sparkctl.engines import ENGINES
from sparkctl.inventory.placement import ServedModel, World, model_sources, node_loads, served_models
from sparkctl.inventory.sections import MODEL_FIELD_NAMES, ServeSettings, resolve_topology
from sparkctl.inventory.serve import collector_port, engine_of, engine_port, resolve_serve
from sparkctl.knowledge.fitcheck import SPARK_USABLE_GB
from sparkctl.knowledge.vllm_releases import release_of
from sparkctl.knowledge.vllm_releases import schema_for as vllm_schema_for

Loc = tuple
Problem = tuple[Loc, str]


def entry_loc(loc: Loc, entry: Loc) -> Loc:
    """A plain serve:'s location (("serve", "tp_size")) as the entry's (("serve", "models", 1, "tp_size")); a
    shared setting's stays where it is."""
    if loc == ("serve",):
        return entry
    if len(loc) > 1 and loc[0] == "serve" and loc[1] in MODEL_FIELD_NAMES:
        return (*entry, *loc[1:])
    return loc


def models_problems(serve: ServeSettings, names: list[str], topology: str | None, image: str = "") -> list[Problem]:
    """serve.models's problems as a whole, on nodes `names` cabled as `topology`, served from `image`."""
    count = len(names)
    problems = [*_written_twice(serve), *_names(serve), *_engines(serve, count), *_replicas(serve, count)]
    if problems:
        return problems
    models = served_models(serve, names, SPARK_USABLE_GB)
    topology = resolve_topology(topology, count) or "switch"
    return [*_keys(models), *_revisions(models), *_rays(models, image), *_copied(serve, models),
            *_ports(serve, models, count), *_links(models, names, topology), *_fit(models, names)]


def _written_twice(serve: ServeSettings) -> Iterator[Problem]:
    for name in sorted(serve.model_fields_set & MODEL_FIELD_NAMES):
        yield (("serve", name), "is about one model: with serve.models, write it in the entries it is for (move it "
                                "into serve.models[...])")


def _names(serve: ServeSettings) -> Iterator[Problem]:
    seen: dict[str, int] = {}
    for source in model_sources(serve):
        entry, index = source.entry, source.loc[2]
        assert entry is not None and isinstance(index, int)
        written: list[tuple[Loc, str]] = [((*source.loc, "name"), entry.name)] if entry.name else []
        written += [((*source.loc, "aliases", j), alias) for j, alias in enumerate(entry.aliases)]
        told = ""
        if not entry.name:
            # unnamed, it answers to its repo id
            written.insert(0, (source.loc, resolve_serve(source.settings, 1).model))
            told = f" (the repo id of {entry.model or entry.preset}: clients ask for it by name)"
        for where, name in written:
            if seen.setdefault(name, index) != index:
                told_here = told if where == source.loc else ""
                yield (where, f"{name!r} is a name of serve.models[{seen[name]}] too{told_here}: give each model a "
                              "name of its own (name: ...)")


def _engines(serve: ServeSettings, count: int) -> Iterator[Problem]:
    """The models share each node's container (one image, one sshd for the ranks): one engine per cluster."""
    sources = model_sources(serve)
    first = engine_of(sources[0].settings, count)
    for source in sources[1:]:
        engine = engine_of(source.settings, count)
        if engine != first:
            loc = (*source.loc, "engine") if source.settings.engine else source.loc
            yield (loc, f"runs on {ENGINES[engine].label}, serve.models[0] on {ENGINES[first].label}: the models of a "
                        "cluster run in each node's one container, so they share its engine (choose a "
                        f"{ENGINES[first].label} model or preset here)")


def _replicas(serve: ServeSettings, count: int) -> Iterator[Problem]:
    for source in model_sources(serve):
        entry = source.entry
        assert entry is not None
        if entry.replicas is None:
            continue
        loc = (*source.loc, "replicas")
        if entry.nodes:
            yield (loc, "and nodes both set: name the nodes of one world, or let sparkctl place replicas (remove "
                        "one of them)")
        elif (world := resolve_serve(source.settings, count).world_size) > 1:
            yield (loc, f"are one-node copies, and this model's world has {world} ranks (tp_size x pp_size): name "
                        "its nodes instead, one entry per world")
        elif entry.replicas > count:
            yield (loc, f"{entry.replicas} replicas need {entry.replicas} nodes, the inventory has {count} (at most "
                        f"{count})")


def _keys(models: list[ServedModel]) -> Iterator[Problem]:
    """Two worlds whose names would be one word (`org/m.1` and `org-m-1`) would share a unit and a directory."""
    seen: dict[str, int] = {}
    for i, model in enumerate(models):
        for world in model.worlds:
            j = seen.setdefault(world.key, i)
            if j != i:
                yield ((*model.loc, "name"), f"{model.name!r} makes the same unit and directory name "
                                             f"({world.key!r}) as serve.models[{j}]'s {models[j].name!r}: give this "
                                             "model a name of its own (name: ...)")
                break


def _revisions(models: list[ServedModel]) -> Iterator[Problem]:
    """A node's HF cache keeps one pin and one refs/main per repo: one repo is served at one revision."""
    asked: dict[str, tuple[str, int]] = {}
    for i, model in enumerate(models):
        revision = model.settings.revision or "main"
        first = asked.setdefault(model.spec.model, (revision, i))
        if first[0] != revision:
            loc = (*model.loc, "revision") if model.settings.revision else model.loc
            yield (loc, f"{model.spec.model} is served at {first[0]} by serve.models[{first[1]}]: a node keeps one "
                        f"pinned commit of a repo, so its models serve one revision of it (write revision: "
                        f"{first[0]} here, or serve the other revision from another repo)")


def _rays(models: list[ServedModel], image: str) -> Iterator[Problem]:
    """A Ray world stops every Ray of its node's container when it ends (`ray stop --force`): two Ray worlds never
    share a node."""
    version = release_of(image) if image else None
    schema = vllm_schema_for(version) if version else None
    held: dict[str, int] = {}
    for i, model in enumerate(models):
        executor = model.settings.vllm.executor
        # serve.vllm is vLLM's section; an image of another engine names no vLLM release
        ray = model.spec.world_size > 1 and (
            executor == "ray" or (executor == "auto" and schema is not None and not schema.has_nnodes))
        if not ray:
            continue
        shared = sorted({n for w in model.worlds for n in w.nodes if n in held})
        if shared:
            loc = (*model.loc, "vllm", "executor") if executor == "ray" else model.loc
            yield (loc, f"runs on Ray on {', '.join(shared)}, as serve.models[{held[shared[0]]}] does: a Ray world "
                        "stops every Ray of the node's container when it ends (place them on nodes of their own, or "
                        "use vllm.executor: mp)")
        for world in model.worlds:
            held.update({n: i for n in world.nodes if n not in held})


def _copied(serve: ServeSettings, models: list[ServedModel]) -> Iterator[Problem]:
    """model.copy sends one model's files from the head to the nodes of its world: not yet each world's own."""
    if serve.distribute == "copy" and sum(len(m.worlds) for m in models) > 1:
        yield (("serve", "distribute"), "copy sends the head's model to the other nodes of its world, and several "
                                        "worlds are not copied yet: each node downloads its own (remove "
                                        "`distribute: copy`)")


def _ports(serve: ServeSettings, models: list[ServedModel], count: int) -> Iterator[Problem]:
    """Every engine (and its figures collector) has its own port: the gateway reaches each by it."""
    taken: dict[int, str] = {serve.port: "the endpoint's (serve.port)"}
    for i, model in enumerate(models):
        ports = [engine_port(model.settings, count)]
        if ENGINES[model.spec.engine].metrics_drained:
            ports.append(collector_port(model.settings, count))
        for port in ports:
            if port in taken:
                loc = (*model.loc, "engine_port")
                yield (loc, f"the engine's port {port} is {taken[port]} too: give this model's engine a port of "
                            f"its own (serve.models[{i}].engine_port, two free ports in a row)")
                break
        else:
            taken.update({port: f"serve.models[{i}]'s" for port in ports})
    yield from _meeting_ports(models)


def _meeting_ports(models: list[ServedModel]) -> Iterator[Problem]:
    """Two worlds whose heads share a node cannot meet on one port there."""
    where: dict[tuple[str, int], int] = {}
    for i, model in enumerate(models):
        key = _meeting_port(model)
        if key is None:
            continue
        field, port = key
        for world in model.worlds:
            if len(world.nodes) < 2:
                continue
            other = where.setdefault((world.nodes[0], port), i)
            if other != i:
                yield ((*model.loc, *field.split(".")), f"{port} is where serve.models[{other}]'s ranks meet on "
                                                        f"{world.nodes[0]} too: choose another port")
                break


def _meeting_port(model: ServedModel) -> tuple[str, int] | None:
    setting = ENGINES[model.spec.engine].meeting_port
    if setting is None:
        return None
    section, field = setting.split(".")
    return setting, getattr(getattr(model.settings, section), field)


def _links(models: list[ServedModel], names: list[str], topology: str) -> Iterator[Problem]:
    """On a ring a node is cabled to its two neighbours only: a world of some of its nodes must be made of
    neighbours (NCCL's RDMA goes over a cable, not through another node)."""
    if topology != "ring":
        return
    for model in models:
        for world in model.worlds:
            if len(world.nodes) < 2 or len(world.nodes) == len(names):
                continue
            apart = _not_neighbours(world, names)
            if apart:
                width = len(world.nodes)
                instead = (f"place the world on neighbours, e.g. [{', '.join(names[:2])}]" if width == 2 else
                           f"a world of {width} of the ring's {len(names)} nodes always holds two that are not "
                           "cabled to each other: use 2 neighbours or the whole ring")
                yield ((*model.loc, "nodes"), f"{apart[0]} and {apart[1]} are not cabled to each other (a ring "
                                              f"cables each node to the next): {instead}")
                break


def _not_neighbours(world: World, names: list[str]) -> tuple[str, str] | None:
    size = len(names)
    for a in world.nodes:
        for b in world.nodes:
            gap = abs(names.index(a) - names.index(b))
            if a < b and min(gap, size - gap) != 1:
                return a, b
    return None


def _fit(models: list[ServedModel], names: list[str]) -> Iterator[Problem]:
    """Per node, what every model placed there takes against a Spark's usable memory."""
    loads = node_loads(models)
    room = {n: SPARK_USABLE_GB - sum(gb or 0 for _, gb in loads.get(n, [])) for n in names}
    for node, held in loads.items():
        known = [(model, gb) for model, gb in held if gb is not None]
        total = sum(gb for _, gb in known)
        if total <= SPARK_USABLE_GB or len(held) < 2:
            continue
        parts = " + ".join(f"{model.name} {gb:.1f} GB" for model, gb in known)
        last = known[-1][0]
        need = known[-1][1]
        fits = [n for n, left in room.items() if n != node and need is not None and left >= need]
        fix = (f"place {last.name} on {fits[0]} (nodes: [{fits[0]}])" if fits else
               f"serve {last.name} elsewhere or choose a smaller model")
        message = (f"{node} would hold {parts} = {total:.1f} GB, a Spark has {SPARK_USABLE_GB:.1f} GB usable: "
                   f"{fix}")
        if all(model.settings.fit_check == "warn" for model, _ in known):
            continue
        yield (last.loc, message)
