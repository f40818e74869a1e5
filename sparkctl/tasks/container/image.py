"""container.image: the TensorRT-LLM image on every node, pulled detached with a progress line."""

from __future__ import annotations

import re
import time

from sparkctl.rules.serving import relay_mode
from sparkctl.taskgraph.events import Event
from sparkctl.taskgraph.task import Change, Task, TaskFailed
from sparkctl.tasks.context import NodeContext, known_cause
from sparkctl.transport.base import q

PULL_TIMEOUT = 3600.0
_LOGIN_NEEDED = re.compile(r"unauthori[sz]ed|authentication required|no basic auth credentials|denied", re.I)


class ContainerImageTask(Task[NodeContext, None]):
    name = "container.image"
    phase = "container"
    needs = ("preflight.node", "preflight.cluster")
    description = "make sure the TensorRT-LLM image is on every node"
    checks = "`docker image inspect <image>` on the node"
    changes = ("`docker pull <image>` (a missing registry login is reported with the `docker login nvcr.io` "
               "hint); with container.distribute: relay on the head only (container.relay sends it on)")

    def check(self, ctx: NodeContext) -> list[Change[None]]:
        image = ctx.inventory.container.image
        if relay_mode(ctx.inventory) and ctx.name != ctx.inventory.head.name:
            return []  # the head's is sent to it over the fabric (container.relay)
        if ctx.facts().images.get(image):
            return []
        return [Change(f"pull {image}")]

    def apply(self, ctx: NodeContext, changes: list[Change[None]]) -> None:
        image = ctx.inventory.container.image
        started = time.monotonic()
        code, output = _pull_with_progress(ctx, image)
        ctx.invalidate()
        if code != 0:
            registry = image.split("/", 1)[0] if "/" in image else "docker.io"
            if _LOGIN_NEEDED.search(output):
                raise TaskFailed(
                    f"pulling {image} on {ctx.name} was refused: no registry login for {registry}",
                    hint=f"on {ctx.name}: docker login {registry} (user $oauthtoken, password: your NGC API key)")
            reason = "timed out" if code == TIMED_OUT else f"exit {code}"
            tail = output.strip().splitlines()[-3:]
            known = known_cause(tail, ctx.name)
            raise TaskFailed(f"pulling {image} on {ctx.name} failed ({known[0] if known else reason})",
                             hint=known[1] if known else None, details=tail)
        ctx.log(f"pulled {image} in {time.monotonic() - started:.0f}s")


PULL_POLL_S = 5.0
TIMED_OUT = 124
_PULL_EXIT = re.compile(r"^sparkctl-pull-exit=(\d+)$", re.M)
_LAYER = re.compile(r"^([0-9a-f]{6,64}): (.+)$", re.M)


def pull_progress(output: str) -> tuple[int, int]:
    """(layers done, layers seen) from `docker pull` output on a non-terminal."""
    state: dict[str, str] = {}
    for layer, status in _LAYER.findall(output):
        state[layer] = status
    done = sum(1 for status in state.values() if status in ("Pull complete", "Already exists"))
    return done, len(state)


def _pull_with_progress(ctx: NodeContext, image: str) -> tuple[int, str]:
    """`docker pull` detached on the node (a pull of tens of GB outlives any one command's timeout), its
    output in a temp file read every few seconds for a progress line. Returns (exit code, output)."""
    inner = f"docker pull {q(image)} > \"$0\" 2>&1; echo \"sparkctl-pull-exit=$?\" >> \"$0\""
    # `f=... || exit` on its own line: `a && b &` would run the assignment in the background subshell too
    path = ctx.must(f'f=$(mktemp "${{TMPDIR:-/tmp}}/sparkctl-pull.XXXXXX") || exit 1\n'
                    f'setsid nohup sh -c {q(inner)} "$f" </dev/null >/dev/null 2>&1 &\necho "$f"',
                    f"starting docker pull {image}").stdout.strip().splitlines()[-1]
    started = time.monotonic()
    try:
        while True:
            output = ctx.run(f"cat {q(path)}", timeout=30).stdout
            finished = _PULL_EXIT.search(output)
            if finished:
                return int(finished.group(1)), _PULL_EXIT.sub("", output)
            elapsed = time.monotonic() - started
            if elapsed > PULL_TIMEOUT:
                return TIMED_OUT, output
            done, seen = pull_progress(output)
            ctx.cluster.emit(Event(event="log", task=ContainerImageTask.name, node=ctx.name,
                                   message=f"pulling {image}: {done}/{seen} layers, {elapsed:.0f}s",
                                   data={"progress": {"what": image, "layers_done": done, "layers": seen,
                                                      "seconds": round(elapsed, 1)}}))
            time.sleep(PULL_POLL_S)
    finally:
        ctx.run(f"rm -f {q(path)}", timeout=30)
