"""container.run: the trtllm-multinode container on every node, from that node's plan."""

from __future__ import annotations

import re
import shlex
import time

from sparkctl.facts import ContainerInfo
from sparkctl.plan.container import SPEC_LABEL, ContainerSpec
from sparkctl.rules.container import SSHD_NAMES, spec_differences
from sparkctl.rules.fabric import listening_on_management
from sparkctl.taskgraph.diff import unified_diff
from sparkctl.taskgraph.task import Change, Task, TaskFailed
from sparkctl.tasks.context import NodeContext
from sparkctl.transport.base import q

#: How long a fresh container gets to prove it stays up (its entrypoint exits at once when sshd cannot bind).
START_GRACE_S = 1.5


def node_spec(ctx: NodeContext) -> ContainerSpec:
    return ctx.plan().nodes[ctx.name].container


def _diff_text(spec: ContainerSpec, current: ContainerInfo) -> str:
    def lines(image, env, mounts):
        return "\n".join([f"image {image}", *(f"{k}={v}" for k, v in sorted(env.items())),
                          *(f"mount {m}" for m in mounts)]) + "\n"

    mine = {k: v for k, v in current.env.items() if k in spec.env}
    have_mounts = sorted(f"{m.get('Source', '')}:{m.get('Destination', '')}" for m in current.mounts)
    want_mounts = sorted(f"{h}:{i}" for h, i, _ in spec.mounts)
    return unified_diff(f"container {spec.name}", lines(current.image, mine, have_mounts),
                        lines(spec.image, spec.env, want_mounts))


def port_owner(ctx: NodeContext, port: int) -> str | None:
    """`name (pid N)` of whatever listens on the TCP port on the node, or None when nothing does."""
    facts = ctx.facts()
    if port not in facts.listening_tcp:
        return None
    result = ctx.run(f"ss -ltnpH 'sport = :{int(port)}'", sudo=True, timeout=15)
    m = re.search(r'users:\(\("(?P<name>[^"]+)",pid=(?P<pid>\d+)', result.stdout)
    if m:
        return f"{m['name']} (pid {m['pid']})"
    return f"{facts.listening_tcp.get(port) or 'an unknown process'} (pid unknown)"


def remove_command(name: str) -> str:
    """Remove the container at once. Docker's `rm -f` kills it at once; Podman's (behind a `docker` alias) first
    waits out the stop timeout, 10 s when PID 1 ignores SIGTERM (`sleep infinity` in a hand-started container):
    `stop -t 0` first makes every docker CLI kill it at once."""
    return f"docker stop -t 0 {q(name)} >/dev/null 2>&1; docker rm -f {q(name)}"


class ContainerRunTask(Task[NodeContext, str]):
    name = "container.run"
    phase = "container"
    # its sshd listens on the node's planned fabric addresses only (SPARKCTL_SSHD_LISTEN): without them it
    # cannot bind and the container exits
    needs = ("container.image", "serve.switch", "container.state", "container.retire", "network.netplan")
    description = "run the trtllm-multinode container with the settings of THIS node's own interfaces"
    checks = ("the container exists, runs, and carries the label with the hash of the planned spec (image, env, "
              "mounts, args, entrypoint); its env holds the planned NCCL/UCX/Open MPI settings; nothing else "
              "owns the container ssh port")
    changes = ("`docker run` with GPUs, host network, memlock/stack ulimits, /dev/infiniband, the HF cache and "
               "sparkctl's state mounted, per-node env; a container with another spec is removed and created "
               "again (`--diff` shows what differs); a stopped one is started")

    def check(self, ctx: NodeContext) -> list[Change[str]]:
        spec = node_spec(ctx)
        current = ctx.facts().containers.get(spec.name)
        if current is not None and current.status == "unknown":
            # docker did not answer in time: ask once more before anything is decided
            current = ctx.facts(refresh=True).containers.get(spec.name)
            if current is not None and current.status == "unknown":
                raise TaskFailed(f"the state of container {spec.name} on {ctx.name} could not be read: "
                                 f"{current.error or 'docker did not say'}",
                                 hint=f"nothing was changed; `docker inspect {spec.name}` on the node shows what "
                                      "docker says (slow: rerun when the node is less busy)")
        if current is None or not current.exists:
            return [Change(f"create container {spec.name}", payload="create")]
        differences = spec_differences(spec, current)
        if current.labels.get(SPEC_LABEL) != spec.spec_hash() or differences:
            why = "; ".join(differences) or "spec label differs (docker args or entrypoint changed)"
            return [Change(f"recreate container {spec.name}: {why}", diff=_diff_text(spec, current),
                           payload="recreate")]
        if not current.running:
            return [Change(f"start container {spec.name} (it is {current.status})", payload="start")]
        port = int(ctx.inventory.container.ssh_port)
        exposed = listening_on_management(ctx.facts(), port)
        if exposed and ctx.facts().listening_tcp.get(port) in (None, *SSHD_NAMES):
            # an sshd started by hand in the container (or a listener the spec never asked for): only a fresh
            # container listens on the fabric addresses alone
            return [Change(f"recreate container {spec.name}: its ssh port {port} answers on the management "
                           f"address {', '.join(exposed)} (the mesh belongs on the fabric)", payload="recreate")]
        return []

    def apply(self, ctx: NodeContext, changes: list[Change[str]]) -> None:
        spec = node_spec(ctx)
        action = changes[0].payload
        ssh_port = ctx.inventory.container.ssh_port
        try:
            if action == "start":
                # `docker start` reuses the old spec, which is exactly the planned one (same label)
                self._free_port_or_fail(ctx, ssh_port, ours_running=False)
                started = ctx.run(f"docker start {q(spec.name)}", timeout=120)
                if not started.ok:
                    # the container holds nothing of its own (the cache and state dir are mounted): one that
                    # will not start (a run cut mid-create leaves the runtime's state behind) is made again
                    why = (started.stderr or started.stdout).strip().splitlines()[-1:] or ["no output"]
                    ctx.warn(f"container {spec.name} would not start ({why[0][:200]}): made again from the plan",
                             task=self.name)
                    action = "recreate"
            if action != "start":
                if action == "recreate":
                    ctx.must(remove_command(spec.name), f"removing container {spec.name}", timeout=120)
                    ctx.invalidate()
                self._free_port_or_fail(ctx, ssh_port, ours_running=False)
                ctx.must(shlex.join(spec.run_argv()), f"docker run {spec.name}", timeout=300)
            self._wait_running(ctx, spec.name)
        finally:
            ctx.invalidate()

    def _free_port_or_fail(self, ctx: NodeContext, port: int, ours_running: bool) -> None:
        owner = port_owner(ctx, port) if not ours_running else None
        if owner:
            raise TaskFailed(
                f"port {port} on {ctx.name} is taken by {owner}: the container's sshd cannot listen there",
                hint="stop that process, or set container.ssh_port to a free port in the inventory")

    def _wait_running(self, ctx: NodeContext, name: str) -> None:
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
