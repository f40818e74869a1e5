"""serve.unit: the serving unit (sparkctl/plan/serve_unit.py) written and enabled on the head (on every serving
node where each runs its own rank); on every other node no unit of this cluster (the head moved, a node left out).
serve.unit_remove: `cluster down`'s, on every node.

Idempotent: the unit file and its two scripts have the planned content and the unit is enabled; a file that
differs is written again (with its diff: they hold no secret) and systemd reloaded. Starting the unit is
serve.launch's: it knows whether the world that runs is the planned one.
"""

from __future__ import annotations

from sparkctl.plan.serve_unit import ServeUnitSpec, unit_name, unit_path
from sparkctl.rules.serving import has_unit, serving_enabled
from sparkctl.taskgraph.diff import unified_diff
from sparkctl.taskgraph.task import Change, Task
from sparkctl.tasks.context import NodeContext
from sparkctl.tasks.serve.config import desired_launch
from sparkctl.transport.base import q
from sparkctl.transport.framing import Framing


def node_unit(ctx: NodeContext) -> ServeUnitSpec:
    """The unit serving node `ctx` should have, from its facts (login user, home) and the planned launch."""
    inv = ctx.inventory
    _text, _command, fingerprint = desired_launch(ctx)
    return ctx.plan().launch.unit(inv, ctx.name, state_dir=ctx.state_dir(),
                                  user=ctx.facts().user or ctx.node.user or inv.user, fingerprint=fingerprint)


def _remove_script(cluster: str) -> str:
    name, path = unit_name(cluster), unit_path(cluster)
    return (f"systemctl disable --now {q(name)} >/dev/null 2>&1; rm -f {q(path)}; systemctl daemon-reload; "
            f"systemctl reset-failed {q(name)} >/dev/null 2>&1; true")


class ServeUnitTask(Task[NodeContext, str]):
    name = "serve.unit"
    phase = "serve"
    needs = ("serve.config",)
    description = ("write and enable the systemd unit that keeps the model served (on the head; vLLM and SGLang: every "
                   "rank's node)")
    checks = ("on the head: /etc/systemd/system/sparkctl-serve-<cluster>.service, <state>/run/serve/unit.sh and "
              "world.sh have the planned content (the launch line, the other serving nodes' hostfile addresses) "
              "and the unit is enabled (`sparkctl serve stop` disables it); with vLLM or SGLang the same on every "
              "serving node, each world.sh running that node's own server (or Ray node); on every other node: no such "
              "unit; one read of the node, on a rerun read ahead with its facts")
    changes = ("writes what differs (the scripts as the login user, the unit as root), `systemctl daemon-reload`, "
               "`systemctl enable` (serve.launch starts it); elsewhere `systemctl disable --now` and removes it")

    def check(self, ctx: NodeContext) -> list[Change[str]]:
        inv = ctx.inventory
        if not serving_enabled(inv):
            return []
        if not has_unit(inv, ctx.name):
            framing = Framing()
            script = framing.section("unit", f"test -e {q(unit_path(inv.cluster.name))} && echo present; true")
            said = Framing.texts_of(framing.split(ctx.read(self.name, script, framing).stdout))
            why = ("it serves no rank of the model" if inv.engine().unit_per_rank
                   else f"the head is {inv.head.name}")
            return [Change(f"remove the serving unit {unit_name(inv.cluster.name)} ({why})",
                           payload="remove")] if "present" in said.get("unit", "") else []
        spec = node_unit(ctx)
        framing = Framing()
        files = spec.files()
        script = "\n".join([*(framing.section(f"file{i}", f"cat {q(path)}") for i, path in enumerate(files)),
                            framing.section("enabled", f"systemctl is-enabled {q(spec.name)}"), "true"])
        found = framing.split(ctx.read(self.name, script, framing).stdout)
        texts = Framing.texts_of(found)
        changes = []
        for i, (path, want) in enumerate(files.items()):
            section = found.get(f"file{i}")
            have = texts.get(f"file{i}") if section is not None and section.ok else None
            if have != want:
                changes.append(Change(f"{'update' if have is not None else 'write'} {path}",
                                      diff=unified_diff(path, have, want), payload=path))
        enabled = texts.get("enabled", "").strip()
        if enabled != "enabled":
            why = " (it is disabled, as `sparkctl serve stop` leaves it)" if enabled == "disabled" else ""
            changes.append(Change(f"enable {spec.name}{why}", payload="enable"))
        return changes

    def apply(self, ctx: NodeContext, changes: list[Change[str]]) -> None:
        inv = ctx.inventory
        try:
            if any(c.payload == "remove" for c in changes):
                ctx.must(_remove_script(inv.cluster.name), "removing the serving unit", sudo=True)
                return
            spec = node_unit(ctx)
            files = spec.files()
            ctx.must(f"install -d -m 755 {q(spec.serve_dir)}", f"making {spec.serve_dir}")
            written = {c.payload for c in changes} & set(files)
            for path in (spec.watchdog_script, spec.world_script, spec.host_script):
                if path in written:
                    ctx.transport.put(path, files[path], mode=0o755)
            if spec.unit_path in written:
                ctx.transport.put(spec.unit_path, files[spec.unit_path], mode=0o644, owner="root:root", sudo=True)
                ctx.must("systemctl daemon-reload", "reloading systemd", sudo=True)
            ctx.must(f"systemctl enable {q(spec.name)}", f"enabling {spec.name}", sudo=True)
        finally:
            ctx.invalidate()


class ServeUnitRemoveTask(Task[NodeContext, None]):
    name = "serve.unit_remove"
    phase = "container"
    description = "stop, disable and remove the cluster's serving unit"
    checks = "whether /etc/systemd/system/sparkctl-serve-<cluster>.service exists on the node"
    changes = ("`systemctl disable --now` (its stop ends the server), removes the unit, `systemctl "
               "daemon-reload`; before the containers go")

    def check(self, ctx: NodeContext) -> list[Change[None]]:
        path = unit_path(ctx.inventory.cluster.name)
        found = ctx.run(f"test -e {q(path)} && echo present; true", timeout=30).stdout
        return [Change(f"stop and remove {unit_name(ctx.inventory.cluster.name)}")] if "present" in found else []

    def apply(self, ctx: NodeContext, changes: list[Change[None]]) -> None:
        try:
            ctx.must(_remove_script(ctx.inventory.cluster.name), "removing the serving unit", sudo=True, timeout=120)
        finally:
            ctx.invalidate()
