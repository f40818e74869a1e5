"""container.image and container.run: the trtllm-multinode container on every node, from that node's plan."""

from __future__ import annotations

import re
import shlex
import time

from sparkctl.engine.events import Event
from sparkctl.engine.task import Change, Task, TaskFailed
from sparkctl.facts.parse import REDACTED
from sparkctl.plan.container import SPEC_LABEL, ContainerSpec
from sparkctl.tasks.netplan_files import unified_diff
from sparkctl.transport.base import q

PULL_TIMEOUT = 3600.0
#: How long a fresh container gets to prove it stays up (its entrypoint exits at once when sshd cannot bind).
START_GRACE_S = 1.5
_LOGIN_NEEDED = re.compile(r"unauthori[sz]ed|authentication required|no basic auth credentials|denied", re.I)


def node_spec(ctx) -> ContainerSpec:
    return ctx.plan().nodes[ctx.name].container


class ContainerImageTask(Task):
    name = "container.image"
    phase = "container"
    needs = ("preflight.node",)
    description = "make sure the TensorRT-LLM image is on every node"
    checks = "`docker image inspect <image>` on the node"
    changes = ("`docker pull <image>` (a missing registry login is reported with the `docker login nvcr.io` "
               "hint)")

    def check(self, ctx) -> list[Change]:
        image = ctx.inventory.container.image
        if ctx.facts().images.get(image):
            return []
        return [Change(f"pull {image}")]

    def apply(self, ctx, changes) -> None:
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
            raise TaskFailed(f"pulling {image} on {ctx.name} failed ({reason})",
                             details=output.strip().splitlines()[-3:])
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


def _pull_with_progress(ctx, image: str) -> tuple[int, str]:
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


def spec_differences(spec: ContainerSpec, current) -> list[str]:
    """What differs between the planned spec and the running container, one line per setting."""
    out = []
    if current.image != spec.image:
        out.append(f"image {current.image} -> {spec.image}")
    # Only the planned keys: the image brings its own env (PATH, NCCL_VERSION ...) that is not ours to judge.
    for key in sorted(spec.env):
        have = current.env.get(key)
        if have == REDACTED:
            continue  # facts never carry secret-looking values; the spec label still covers them
        if have != spec.env[key]:
            out.append(f"env {key}: {have if have is not None else '(unset)'} -> {spec.env[key]}")
    have_mounts = {m.get("Destination", "").rstrip("/"): m.get("Source", "").rstrip("/")
                   for m in current.mounts}
    for host, inside, _mode in spec.mounts:
        got = have_mounts.get(inside.rstrip("/"))
        if got != host.rstrip("/"):
            out.append(f"mount {inside}: {got or '(none)'} -> {host}")
    return out


def _diff_text(spec: ContainerSpec, current) -> str:
    def lines(image, env, mounts):
        return "\n".join([f"image {image}", *(f"{k}={v}" for k, v in sorted(env.items())),
                          *(f"mount {m}" for m in mounts)]) + "\n"

    mine = {k: v for k, v in current.env.items() if k in spec.env}
    have_mounts = sorted(f"{m.get('Source', '')}:{m.get('Destination', '')}" for m in current.mounts)
    want_mounts = sorted(f"{h}:{i}" for h, i, _ in spec.mounts)
    return unified_diff(f"container {spec.name}", lines(current.image, mine, have_mounts),
                        lines(spec.image, spec.env, want_mounts))


def port_owner(ctx, port: int) -> str | None:
    """`name (pid N)` of whatever listens on the TCP port on the node, or None when nothing does."""
    facts = ctx.facts()
    if port not in facts.listening_tcp:
        return None
    result = ctx.run(f"ss -ltnpH 'sport = :{int(port)}'", sudo=True, timeout=15)
    m = re.search(r'users:\(\("(?P<name>[^"]+)",pid=(?P<pid>\d+)', result.stdout)
    if m:
        return f"{m['name']} (pid {m['pid']})"
    return f"{facts.listening_tcp.get(port) or 'an unknown process'} (pid unknown)"


class ContainerRunTask(Task):
    name = "container.run"
    phase = "container"
    needs = ("container.image", "container.state")
    description = "run the trtllm-multinode container with the settings of THIS node's own interfaces"
    checks = ("the container exists, runs, and carries the label with the hash of the planned spec (image, env, "
              "mounts, args, entrypoint); its env holds the planned NCCL/UCX/Open MPI settings; nothing else "
              "owns the container ssh port")
    changes = ("`docker run` with GPUs, host network, memlock/stack ulimits, /dev/infiniband, the HF cache and "
               "sparkctl's state mounted, per-node env; a container with another spec is removed and created "
               "again (`--diff` shows what differs); a stopped one is started")

    def check(self, ctx) -> list[Change]:
        spec = node_spec(ctx)
        current = ctx.facts().containers.get(spec.name)
        if current is None or not current.exists:
            return [Change(f"create container {spec.name}", payload="create")]
        differences = spec_differences(spec, current)
        if current.labels.get(SPEC_LABEL) != spec.spec_hash() or differences:
            why = "; ".join(differences) or "spec label differs (docker args or entrypoint changed)"
            return [Change(f"recreate container {spec.name}: {why}", diff=_diff_text(spec, current),
                           payload="recreate")]
        if not current.running:
            return [Change(f"start container {spec.name} (it is {current.status})", payload="start")]
        return []

    def apply(self, ctx, changes) -> None:
        spec = node_spec(ctx)
        action = changes[0].payload
        ssh_port = ctx.inventory.container.ssh_port
        try:
            if action == "start":
                # `docker start` reuses the old spec, which is exactly the planned one (same label)
                self._free_port_or_fail(ctx, ssh_port, ours_running=False)
                ctx.must(f"docker start {q(spec.name)}", f"starting container {spec.name}", timeout=120)
            else:
                if action == "recreate":
                    ctx.must(f"docker rm -f {q(spec.name)}", f"removing container {spec.name}", timeout=120)
                    ctx.invalidate()
                self._free_port_or_fail(ctx, ssh_port, ours_running=False)
                ctx.must(shlex.join(spec.run_argv()), f"docker run {spec.name}", timeout=300)
            self._wait_running(ctx, spec.name)
        finally:
            ctx.invalidate()

    def _free_port_or_fail(self, ctx, port: int, ours_running: bool) -> None:
        owner = port_owner(ctx, port) if not ours_running else None
        if owner:
            raise TaskFailed(
                f"port {port} on {ctx.name} is taken by {owner}: the container's sshd cannot listen there",
                hint="stop that process, or set container.ssh_port to a free port in the inventory")

    def _wait_running(self, ctx, name: str) -> None:
        time.sleep(START_GRACE_S)
        fmt = "{{.State.Status}} {{.State.ExitCode}}"
        result = ctx.run(f"docker inspect --format {q(fmt)} {q(name)}; docker logs --tail 5 {q(name)} 2>&1",
                         timeout=30)
        status = (result.stdout.splitlines() or [""])[0].split()
        if status and status[0] == "running":
            return
        raise TaskFailed(f"container {name} on {ctx.name} exited right after starting "
                         f"({' '.join(status) or 'no status'})",
                         hint=f"docker logs {name} on {ctx.name}", details=result.stdout.splitlines()[1:])


class ContainerRemoveTask(Task):
    name = "container.remove"
    phase = "container"
    description = "stop and remove the trtllm-multinode container"
    checks = "whether the container exists"
    changes = "`docker rm -f <container>`"

    def check(self, ctx) -> list[Change]:
        name = ctx.inventory.container.name
        current = ctx.facts().containers.get(name)
        return [Change(f"remove container {name}")] if current is not None and current.exists else []

    def apply(self, ctx, changes) -> None:
        name = ctx.inventory.container.name
        try:
            ctx.must(f"docker rm -f {q(name)}", f"removing container {name}", timeout=120)
        finally:
            ctx.invalidate()


def tasks() -> list[Task]:
    from sparkctl.tasks.container_ssh import ContainerSshTask, ContainerStateTask

    return [ContainerImageTask(), ContainerStateTask(), ContainerRunTask(), ContainerSshTask()]


TASKS = tasks()
DOWN_TASKS = [ContainerRemoveTask()]
