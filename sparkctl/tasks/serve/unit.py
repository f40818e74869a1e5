"""serve.unit: each world's serving unit (sparkctl/plan/serve_unit.py) written and enabled on the world's head (on
every node of the world where each runs its own rank); no other unit of this cluster (the head moved, a node left
out, a model removed). serve.unit_remove: `cluster down`'s, on every node.

Idempotent: the unit file and its two scripts have the planned content and the unit is enabled; a file that
differs is written again (with its diff: they hold no secret) and systemd reloaded. Starting the unit is
serve.launch's: it knows whether the world that runs is the planned one.
"""

from __future__ import annotations

from sparkctl.inventory import Inventory
from sparkctl.plan.serve_unit import ServeUnitSpec, units_of_cluster, world_key_of
from sparkctl.plan.world import WorldNames
from sparkctl.rules.serving import has_unit, serving_enabled
from sparkctl.taskgraph.diff import unified_diff
from sparkctl.taskgraph.task import Change, Task
from sparkctl.tasks.context import NodeContext
from sparkctl.tasks.serve.config import desired_launch
from sparkctl.tasks.worlds import node_worlds, world_launch
from sparkctl.transport.base import q, text_of
from sparkctl.transport.framing import Framing


def node_unit(ctx: NodeContext) -> ServeUnitSpec:
    """The unit node `ctx` should have for the world it sees (tasks/worlds.py), from its facts (login user, home)
    and the planned launch."""
    inv = ctx.inventory
    _text, _command, fingerprint = desired_launch(ctx)
    return world_launch(ctx).unit(inv, ctx.name, state_dir=ctx.state_dir(),
                                  user=ctx.facts().user or ctx.node.user or inv.user, fingerprint=fingerprint)


def _remove_script(names: WorldNames) -> str:
    name, path = names.unit_name, names.unit_path
    return (f"systemctl disable --now {q(name)} >/dev/null 2>&1; rm -f {q(path)}; systemctl daemon-reload; "
            f"systemctl reset-failed {q(name)} >/dev/null 2>&1; true")


#: A change's payload: (the world's key, what: a file's path, "enable" or "remove")
UnitChange = tuple[str, str]


class ServeUnitTask(Task[NodeContext, UnitChange]):
    name = "serve.unit"
    phase = "serve"
    needs = ("serve.config",)
    description = ("write and enable the systemd unit that keeps each model's world served (on its head; vLLM and "
                   "SGLang: every rank's node)")
    checks = ("on a world's head: /etc/systemd/system/sparkctl-serve-<cluster>.service (another world's: "
              "sparkctl-serve-<cluster>--<world>.service), <state>/run/serve/unit.sh and world.sh (another world's: "
              "run/serve--<world>/) have the planned content (the launch line, the other serving nodes' hostfile "
              "addresses) and the unit is enabled (`sparkctl serve stop` disables it); with vLLM or SGLang the same "
              "on every node of the world, each world.sh running that node's own server (or Ray node); no unit of "
              "the cluster that no world plans there (the head moved, a node left out, a model removed); one read "
              "of the node, on a rerun read ahead with its facts")
    changes = ("writes what differs (the scripts as the login user, the unit as root), `systemctl daemon-reload`, "
               "`systemctl enable` (serve.launch starts it); a unit no world plans: `systemctl disable --now` and "
               "removed")

    def check(self, ctx: NodeContext) -> list[Change[UnitChange]]:
        inv = ctx.inventory
        if not serving_enabled(inv):
            return []
        specs = [node_unit(world) for world in node_worlds(ctx) if has_unit(world.inventory, ctx.name)]
        framing = Framing()
        script = [framing.section("units", units_of_cluster(inv.cluster.name))]
        for j, spec in enumerate(specs):
            script += [framing.section(f"w{j}file{i}", text_of(q(path))) for i, path in enumerate(spec.files())]
            script.append(framing.section(f"w{j}enabled", f"systemctl is-enabled {q(spec.name)}"))
        found = framing.split(ctx.read(self.name, "\n".join([*script, "true"]), framing).stdout)
        texts = Framing.texts_of(found)
        changes = []
        planned = {spec.key for spec in specs}
        for unit in texts.get("units", "").split():
            key = world_key_of(inv.cluster.name, unit)
            if key is not None and key not in planned:
                changes.append(Change(f"remove the serving unit {unit} ({_why_none(inv, key)})",
                                      payload=(key, "remove")))
        for j, spec in enumerate(specs):
            for i, (path, want) in enumerate(spec.files().items()):
                section = found.get(f"w{j}file{i}")
                have = texts.get(f"w{j}file{i}") if section is not None and section.ok else None
                if have != want:
                    changes.append(Change(f"{'update' if have is not None else 'write'} {path}",
                                          diff=unified_diff(path, have, want), payload=(spec.key, path)))
            enabled = texts.get(f"w{j}enabled", "").strip()
            if enabled != "enabled":
                why = " (it is disabled, as `sparkctl serve stop` leaves it)" if enabled == "disabled" else ""
                changes.append(Change(f"enable {spec.name}{why}", payload=(spec.key, "enable")))
        return changes

    def apply(self, ctx: NodeContext, changes: list[Change[UnitChange]]) -> None:
        cluster = ctx.inventory.cluster.name
        try:
            for key, what in (c.carried() for c in changes):
                if what == "remove":
                    ctx.must(_remove_script(WorldNames(cluster, key)), "removing the serving unit", sudo=True)
            written = {(key, what) for key, what in (c.carried() for c in changes) if what != "remove"}
            for world in node_worlds(ctx):
                if not has_unit(world.inventory, ctx.name) or world.inventory.world_key not in {
                        key for key, _what in written}:
                    continue
                spec = node_unit(world)
                files = spec.files()
                ctx.must(f"install -d -m 755 {q(spec.serve_dir)}", f"making {spec.serve_dir}")
                for path in (spec.watchdog_script, spec.world_script, spec.host_script):
                    if (spec.key, path) in written:
                        ctx.transport.put(path, files[path], mode=0o755)
                if (spec.key, spec.unit_path) in written:
                    ctx.transport.put(spec.unit_path, files[spec.unit_path], mode=0o644, owner="root:root",
                                      sudo=True)
                    ctx.must("systemctl daemon-reload", "reloading systemd", sudo=True)
                ctx.must(f"systemctl enable {q(spec.name)}", f"enabling {spec.name}", sudo=True)
        finally:
            ctx.invalidate()


def _why_none(inventory: Inventory, key: str) -> str:
    """Why a node has no unit of the world `key`, in words."""
    if key and key not in {w.key for w in inventory.worlds()}:
        return "no model of serve.models has that world any more"
    if inventory.engine().unit_per_rank:
        return "it serves no rank of that world" if key else "it serves no rank of the model"
    return f"the head is {inventory.head.name}" if not key else "it is not that world's head"


class ServeUnitRemoveTask(Task[NodeContext, str]):
    name = "serve.unit_remove"
    phase = "container"
    description = "stop, disable and remove the cluster's serving units"
    checks = ("which serving units of the cluster the node has (/etc/systemd/system/sparkctl-serve-<cluster>.service, "
              "and every other world's sparkctl-serve-<cluster>--<world>.service)")
    changes = ("`systemctl disable --now` (its stop ends the server), removes the unit, `systemctl "
               "daemon-reload`; before the containers go")

    def check(self, ctx: NodeContext) -> list[Change[str]]:
        cluster = ctx.inventory.cluster.name
        found = ctx.run(units_of_cluster(cluster), timeout=30).stdout.split()
        return [Change(f"stop and remove {unit}", payload=key) for unit in found
                if (key := world_key_of(cluster, unit)) is not None]

    def apply(self, ctx: NodeContext, changes: list[Change[str]]) -> None:
        cluster = ctx.inventory.cluster.name
        try:
            for change in changes:
                ctx.must(_remove_script(WorldNames(cluster, change.carried())), "removing the serving unit",
                         sudo=True, timeout=120)
        finally:
            ctx.invalidate()
