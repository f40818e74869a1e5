"""serve.config: the TensorRT-LLM config (extra_llm_api_options) for the image's release, on every node.

Every rank reads the file at start, so each node gets it, in the mounted state dir (/sparkctl/serve inside
the container). Keys the release does not have are never written; an override the release would reject is
refused here, before anything is launched.
"""

from __future__ import annotations

import posixpath

from sparkctl.knowledge.trtllm_releases import Release, release_of
from sparkctl.plan.serve import ReleaseConfig, launch_fingerprint, release_config
from sparkctl.plan.vllm import VLLM_CONFIG_FILE
from sparkctl.rules.serving import serves
from sparkctl.taskgraph.diff import unified_diff
from sparkctl.taskgraph.task import Change, Task, TaskFailed
from sparkctl.tasks.context import NodeContext
from sparkctl.tasks.serve.server import ServerHandle
from sparkctl.transport.base import q


def image_release(ctx: NodeContext) -> Release | None:
    """The release of the image the node's container runs (its version label), else of the inventory's tag."""
    inv = ctx.inventory
    info = ctx.facts().containers.get(inv.container.name)
    labels = info.labels if info is not None and info.exists else {}
    return release_of(inv.container.image, labels)


def desired_config(ctx: NodeContext) -> ReleaseConfig:
    return release_config(ctx.inventory, image_release(ctx))


def refuse_rejected(rc: ReleaseConfig) -> None:
    if rc.refused:
        raise TaskFailed(
            f"serve.config has {len(rc.refused)} key(s) TensorRT-LLM {rc.release} would reject: "
            + "; ".join(rc.refused) + (f" ({rc.note})" if rc.note else ""),
            hint="fix or remove them in serve.config in the inventory (the args model forbids unknown keys at every "
                 "depth, so the server would fail at start)")


def desired_launch(head: NodeContext) -> tuple[str, str, str]:
    """(config text, launch command, fingerprint) the head should be serving with. With vLLM the command is every
    serving node's line, one per line (`node: ...`): a worker's changed line restarts the world too."""
    vllm = head.plan().vllm
    if vllm is not None:
        text, command = vllm.config_text(), vllm.command_lines()
        return text, command, launch_fingerprint(text, command)
    rc = desired_config(head)
    refuse_rejected(rc)
    text, command = rc.text(), head.plan().launch_command
    return text, command, launch_fingerprint(text, command)


class ServeConfigTask(Task[NodeContext, tuple[str, str]]):
    name = "serve.config"
    phase = "serve"
    needs = ("container.run", "model.fit")
    description = "write the engine's config for the image's release on every serving node"
    checks = ("<state>/run/serve/extra-llm-api-config.yml is the preset's config with serve.config merged "
              "over it, draft path in the HF cache, only keys the image's TensorRT-LLM release has (release from "
              "the image's com.nvidia.tensorrt-llm.version label, else its tag; an unknown release is judged as "
              "the nearest known one), checked at every depth; an override the release would reject fails here, "
              "naming the key's path and the release; on a rerun the file is read ahead with the node's facts. "
              "With vLLM: <state>/run/serve/vllm.yaml, the --config file of every node's vllm serve (the preset's "
              "flags under serve.config, the draft's path in speculative-config, only flags the release has)")
    changes = "writes the config file (atomic); `--diff` shows what changes"

    def check(self, ctx: NodeContext) -> list[Change[tuple[str, str]]]:
        if not serves(ctx.inventory, ctx.name):
            return []
        path, want = self._desired(ctx)
        current = ctx.read_file(self.name, path)
        if current == want:
            return []
        return [Change(f"{'update' if current is not None else 'create'} {path}",
                       diff=unified_diff(path, current, want), payload=(path, want))]

    def _desired(self, ctx: NodeContext) -> tuple[str, str]:
        """(path on the node, content): TensorRT-LLM's extra_llm_api_options, or vLLM's --config file."""
        handle = ServerHandle.of(ctx)
        vllm = ctx.plan().vllm
        if vllm is not None:
            if vllm.release is None:
                ctx.warn(f"cannot tell the vLLM release of {ctx.inventory.container.image}: flags not checked "
                         "against it", task=self.name)
            if vllm.dropped:
                ctx.log(f"left out of the --config file, vLLM {vllm.release} does not have: "
                        f"{', '.join(vllm.dropped)}")
            return posixpath.join(handle.dir, VLLM_CONFIG_FILE), vllm.config_text()
        rc = desired_config(ctx)
        refuse_rejected(rc)
        if rc.release is None:
            ctx.warn(f"cannot tell the TensorRT-LLM release of {ctx.inventory.container.image}: config keys not "
                     "checked against it", task=self.name)
        if rc.note:
            ctx.log(rc.note)
        if rc.dropped:
            ctx.log(f"left out of the config, TensorRT-LLM {rc.release} does not have: {', '.join(rc.dropped)}")
        return handle.config_path, rc.text()

    def apply(self, ctx: NodeContext, changes: list[Change[tuple[str, str]]]) -> None:
        handle = ServerHandle.of(ctx)
        ctx.must(f"mkdir -p {q(handle.dir)}", "creating the serve dir")
        path, text = changes[0].carried()
        ctx.transport.put(path, text, mode=0o644)
