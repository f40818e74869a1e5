"""serve.config: the engine's config file for the image's release, on every serving node.

Every rank reads the file at start, so each node gets it, in the mounted state dir (/sparkctl/serve inside
the container). Keys the release does not have are never written; an override the release would reject is
refused here, before anything is launched.
"""

from __future__ import annotations

import posixpath

from sparkctl.plan.launch import Launch
from sparkctl.plan.revisions import repo_folder
from sparkctl.plan.serve import launch_fingerprint
from sparkctl.plan.world import world_names
from sparkctl.rules.serving import serves
from sparkctl.taskgraph.diff import unified_diff
from sparkctl.taskgraph.task import Change, Task, TaskFailed
from sparkctl.tasks.context import NodeContext
from sparkctl.tasks.serve.server import ServerHandle
from sparkctl.tasks.worlds import node_worlds, world_launch
from sparkctl.transport.base import q


def node_launch(ctx: NodeContext) -> Launch:
    """The launch of the world `ctx` sees (tasks/worlds.py) for the release of the image the node's container runs
    (its version label), else of the inventory's tag."""
    inv = ctx.inventory
    info = ctx.facts().containers.get(inv.container.name)
    labels = info.labels if info is not None and info.exists else {}
    return world_launch(ctx).configured(inv, labels)


def refuse_rejected(launch: Launch) -> None:
    if launch.refused:
        raise TaskFailed(
            f"serve.config has {len(launch.refused)} key(s) {launch.engine.label} {launch.release} would reject: "
            + "; ".join(launch.refused) + (f" ({launch.note})" if launch.note else ""),
            hint="fix or remove them in serve.config in the inventory (the args model forbids unknown keys at every "
                 "depth, so the server would fail at start)")


def desired_launch(head: NodeContext) -> tuple[str, str, str]:
    """(config text, launch command, fingerprint) the head of the world `head` sees should be serving with. The
    command is every unit's
    line (`node: ...` where each serving node runs its own): a worker's changed line restarts the world too, and so
    does a model pinned at another commit (model.pin)."""
    launch = node_launch(head)
    refuse_rejected(launch)
    text, command = launch.config_text(), launch.command_lines()
    spec, pins = head.inventory.serve_spec(), head.facts().model_pins
    # the draft too: a --local-dir pinned at another commit is downloaded over the one the world loaded
    pinned = [pins.get(repo_folder(repo)) for repo in (spec.model, spec.draft) if repo]
    return text, command, launch_fingerprint(text, command, "+".join(p for p in pinned if p) or None)


class ServeConfigTask(Task[NodeContext, tuple[str, str]]):
    name = "serve.config"
    phase = "serve"
    # a model or draft that cannot be had leaves the serving world's files as they are
    needs = ("container.run", "model.fit", "model.fetch", "model.verify")
    description = "write the engine's config for the image's release on every serving node"
    checks = ("<state>/run/serve/extra-llm-api-config.yml is the preset's config with serve.config merged "
              "over it, draft path in the HF cache, only keys the image's TensorRT-LLM release has (release from "
              "the image's com.nvidia.tensorrt-llm.version label, else its tag; an unknown release is judged as "
              "the nearest known one), checked at every depth; an override the release would reject fails here, "
              "naming the key's path and the release; on a rerun the file is read ahead with the node's facts. "
              "With vLLM: <state>/run/serve/vllm.yaml, the --config file of every node's vllm serve (the preset's "
              "flags under serve.config, the draft's path in speculative-config, only flags the release has). "
              "With SGLang: no file (its flags are on each node's command line, checked when the inventory loads)")
    changes = "writes the config file (atomic); `--diff` shows what changes"

    def check(self, ctx: NodeContext) -> list[Change[tuple[str, str]]]:
        if not serves(ctx.inventory, ctx.name):
            return []
        changes = []
        for world in node_worlds(ctx):
            desired = self._desired(world)
            if desired is None:
                continue
            path, want = desired
            current = ctx.read_file(self.name + world_names(world.inventory).suffix, path)
            if current != want:
                changes.append(Change(f"{'update' if current is not None else 'create'} {path}",
                                      diff=unified_diff(path, current, want), payload=(path, want)))
        return changes

    def _desired(self, ctx: NodeContext) -> tuple[str, str] | None:
        """(path on the node, content) of the engine's config file; None: the engine reads none."""
        handle = ServerHandle.of(ctx)
        launch = node_launch(ctx)
        refuse_rejected(launch)
        if launch.config_file is None:
            return None
        label = launch.engine.label
        if launch.release is None:
            ctx.warn(f"cannot tell the {label} release of {ctx.inventory.container.image}: its config not checked "
                     "against it", task=self.name)
        if launch.note:
            ctx.log(launch.note)
        if launch.dropped:
            ctx.log(f"left out of the config, {label} {launch.release} does not have: {', '.join(launch.dropped)}")
        return posixpath.join(handle.dir, launch.config_file), launch.config_text()

    def apply(self, ctx: NodeContext, changes: list[Change[tuple[str, str]]]) -> None:
        for change in changes:
            path, text = change.carried()
            ctx.must(f"mkdir -p {q(posixpath.dirname(path))}", "creating the serve dir")
            ctx.transport.put(path, text, mode=0o644)
