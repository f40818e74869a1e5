"""serve.launch: the serving unit started on the head (it runs mpirun in the head container), until /health
answers 200. With an engine of one rank per node (vLLM, SGLang) every serving node's unit is started, the workers'
before the head's.

/health is asked on the head itself (inside its container, over the SSH connection already open): the
inventory host may be an ssh_config alias or behind a jump host or a firewall the controller cannot pass.

Idempotent: the same config already serving and healthy under its unit is ok (same PID); a changed config or
model restarts it (the config diff shows in `--diff`); a dead or unhealthy server, or a unit that is not active
(stopped, disabled by `serve stop`, failed), is started again.
"""

from __future__ import annotations

import time
from functools import partial

from sparkctl.facts.parse import listening_on
from sparkctl.inventory import Inventory
from sparkctl.knowledge.nccl import parse_nccl_log
from sparkctl.knowledge.serve_failures import likely_cause
from sparkctl.plan.gateway import ENGINE_HOST
from sparkctl.plan.launches import launch_type
from sparkctl.plan.serve import endpoint
from sparkctl.plan.serve_unit import unit_summary
from sparkctl.plan.world import world_names
from sparkctl.rules.serving import fell_back_to_sockets, left_out, rdma_up, serving_enabled
from sparkctl.taskgraph.diff import unified_diff
from sparkctl.taskgraph.events import Event
from sparkctl.taskgraph.task import Change, Scope, Task, TaskFailed
from sparkctl.tasks.container.run import port_owner
from sparkctl.tasks.context import ClusterContext, NodeContext
from sparkctl.tasks.serve.config import desired_launch
from sparkctl.tasks.serve.server import ServerHandle, ServingState, head_client
from sparkctl.tasks.serve.unit import node_unit
from sparkctl.tasks.worlds import cluster_worlds, world_launch
from sparkctl.transport.base import q
from sparkctl.transport.framing import Framing

#: Loading a 235B checkpoint from the page cache takes minutes; from disk longer.
PROGRESS_EVERY_S = 10.0
POLL_S = 1.0
#: the check's one read of the head: /health's own limit, docker exec and the log's grep
STATE_READ_S = 30.0


class ServeLaunchTask(Task[ClusterContext, str]):
    name = "serve.launch"
    phase = "serve"
    scope = Scope.CLUSTER
    needs = ("serve.config", "serve.unit", "model.fetch", "model.copy", "mpi.hostfile")
    description = ("start the serving unit on the head (mpirun in the head container; vLLM and SGLang: every "
                   "serving node's, the workers' first) and wait for /health")
    checks = ("the head's serving unit is active and the mpirun it runs (serve.pid: its PID in the container) "
              "lives, started from the planned config and launch line (<state>/run/serve/launch.json), and "
              "/health answers 200 on the head (asked on the head, over the SSH connection: the controller's "
              "route to the endpoint does not matter); the serve log's NCCL lines (NCCL_DEBUG=INFO) do not say "
              "NCCL runs over TCP sockets while the head's RoCE devices are Up (NCCL chooses its network once, at "
              "start); all of it is one read of the head, on a rerun read ahead with its facts: the command line "
              "and /health read by the node itself where it sees the container's processes, else in one "
              "`docker exec`")
    changes = ("stops the unit (mpirun TERM) and leftover ranks on every node, records the launch, starts the "
               "unit (it waits for every serving node's container, then runs mpirun ... trtllm-llmapi-launch "
               "trtllm-serve ..., logging to run/serve/serve.log); waits for /health 200 with progress, or fails "
               "with the log's last lines and the likely cause")

    def check(self, ctx: ClusterContext) -> list[Change[str]]:
        """Each world's changes, carrying its key."""
        if not serving_enabled(ctx.inventory):
            return []
        worlds = cluster_worlds(ctx)
        spared = left_out(ctx.inventory)
        if spared and len(worlds) == 1:
            spec, serving = ctx.inventory.serve_spec(), ctx.inventory.serving_nodes()
            ctx.emit(Event(event="log", task=self.name, message=(
                f"the model runs on {', '.join(serving)} (tp_size {spec.tp_size} x pp_size {spec.pp_size} = "
                f"{spec.world_size} rank(s)); left out of the launch: {', '.join(spared)}"),
                data={"serving_nodes": serving, "left_out": spared}))
        elif spared:
            ctx.emit(Event(event="log", task=self.name, message=f"no model runs on {', '.join(spared)}",
                           data={"left_out": spared}))
        changes: list[Change[str]] = []
        failed: list[TaskFailed] = []
        for world in worlds:
            try:
                changes += [Change(c.summary, diff=c.diff, payload=world.inventory.world_key, node=c.node)
                            for c in self._check_world(world)]
            except TaskFailed as exc:
                failed.append(exc)
        # a world whose state cannot be read (a hung docker on its head) does not keep another from starting: the
        # others are started, and the check after them meets the failure again; a dry run says it at once
        if failed and (not changes or ctx.options.check):
            raise failed[0]
        return changes

    def apply(self, ctx: ClusterContext, changes: list[Change[str]]) -> None:
        """Each world that changes is started again in turn, the others left serving; a world that fails does not
        keep the next from starting (the first failure is raised once all were tried)."""
        keys = {c.carried() for c in changes}
        failed: list[TaskFailed] = []
        for world in cluster_worlds(ctx):
            if world.inventory.world_key in keys:
                try:
                    self._apply_world(world)
                except TaskFailed as exc:
                    failed.append(exc)
        if failed:
            raise failed[0]

    def _check_world(self, ctx: ClusterContext) -> list[Change[None]]:
        head = ctx.head()
        text, command, fingerprint = desired_launch(head)
        handle = ServerHandle.of(head)
        states = read_states(ctx, self.name, [head.name, *worker_ranks(ctx.inventory)], world_launch(ctx).host)
        state = states[head.name]
        record = state.record
        if record is None:
            return [Change(f"start the server on {head.name}: {ctx.inventory.serve_spec().model}", node=head.name)]
        for node, each in states.items():
            if each.unit.get("ActiveState") != "active":
                return [Change(f"start the server on {node}: its unit {handle.unit} is "
                               f"{unit_summary(each.unit)}", node=node)]
            if not each.alive:
                why = f"; {each.exec_error}" if each.exec_error else ""
                return [Change(f"restart the server on {node}: {server_process(ctx.inventory)} (pid "
                               f"{each.pid or '-'}) is gone (its log: {handle.names.log}{why})", node=node)]
        if record.get("fingerprint") != fingerprint:
            diff = unified_diff("running config", record.get("config"), text) or ""
            if record.get("command") != command:
                diff += unified_diff("launch line", (record.get("command") or "") + "\n", command + "\n") or ""
            return [Change(f"restart the server on {head.name}: the config or launch line changed",
                           diff=diff or None, node=head.name)]
        status, why = state.health, state.health_why
        if status != 200:
            return [Change(f"restart the server on {head.name}: pid {state.pid} runs but /health answers "
                           f"{status or 'nothing'}" + (f" ({why})" if why else ""), node=head.name)]
        report = parse_nccl_log(state.nccl)
        if fell_back_to_sockets(report, head.facts()):
            return [Change(f"restart the server on {head.name}: NCCL runs over TCP sockets though RoCE devices "
                           f"are Up ({', '.join(rdma_up(head.facts()))}; it chose its network when it started)",
                           node=head.name)]
        return []

    def _apply_world(self, ctx: ClusterContext) -> None:
        inv = ctx.inventory
        head = ctx.head()
        text, command, fingerprint = desired_launch(head)
        handle = ServerHandle.of(head)
        workers = worker_ranks(inv)
        stopped = stop_ranks(ctx, [head.name, *workers])
        for node, pid in stopped.items():
            ctx.emit(Event(event="log", task=self.name, node=node, message=f"stopped the server (pid {pid})"))
        kill_leftover_ranks(ctx)
        port = inv.serve_spec().engine_port
        self._wait_port_free(head, port, world_launch(ctx).host)
        handle.write_record({"fingerprint": fingerprint, "model": inv.serve_spec().model, "config": text,
                             "command": command, "started": time.time(), "endpoint": endpoint(inv)})
        for node in [*workers, head.name]:  # a worker's rank waits for the master; the master not for it
            ranked = ctx.nodes[node]
            try:
                ServerHandle.of(ranked).start(node_unit(ranked).host_script)
            except RuntimeError as exc:
                raise TaskFailed(f"starting the server on {node} failed: {exc}") from exc
        self._wait_healthy(ctx, head, handle)

    def _wait_port_free(self, head: NodeContext, port: int, host: str) -> None:
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            # the engine's own address, or a wildcard that holds it too (the gateway's addresses do not)
            listening = listening_on(head.run(f"ss -ltnH 'sport = :{int(port)}'", timeout=15).stdout, port)
            if not listening & {host, "0.0.0.0", "*", "::"}:
                return
            time.sleep(0.5)
        head.invalidate()
        owner = port_owner(head, port) or "another process"
        raise TaskFailed(f"port {port} on {head.name} is taken by {owner}: the server cannot listen there",
                         hint="stop that process, or set serve.port in the inventory")

    def _wait_healthy(self, ctx: ClusterContext, head: NodeContext, handle: ServerHandle) -> None:
        client = head_client(head.transport, ctx.inventory, host=world_launch(ctx).host)
        url = client.base_url
        started = time.monotonic()
        next_note = started + PROGRESS_EVERY_S / 2
        why = ""
        while True:
            status, why = client.health_detail()
            if status == 200:
                ctx.emit(Event(event="log", task=self.name, node=head.name,
                               message=f"{url} is healthy after {time.monotonic() - started:.0f}s "
                                       f"(pid {handle.read_pid()}, unit {handle.unit})"))
                return
            now = time.monotonic()
            unit = handle.unit_state()
            if unit.get("ActiveState") == "failed" or unit.get("SubState") == "auto-restart":
                self._fail(head, handle, f"the server exited during start-up on {head.name} (unit "
                                         f"{handle.unit}: {unit_summary(unit)}; it starts it again by itself)")
            if now - started > ctx.inventory.serve.ready_timeout:
                self._fail(head, handle, f"{url}/health did not answer 200 within {ctx.inventory.serve.ready_timeout}s "
                                         f"(last: {status or why or 'no answer'}; the unit is left running; a "
                                         "rerun restarts it)")
            if now >= next_note:
                if unit.get("SubState") == "start-pre":
                    last = f"the unit waits for the other nodes' containers ({handle.unit})"
                else:
                    last = "log: " + (handle.tail(1) or ["(no log line yet)"])[-1][:160]
                ctx.emit(Event(event="log", task=self.name, node=head.name,
                               message=f"waiting for {url}/health: {now - started:.0f}s; {last}"))
                next_note = now + PROGRESS_EVERY_S
            time.sleep(POLL_S)

    @staticmethod
    def _fail(head: NodeContext, handle: ServerHandle, message: str) -> None:
        lines = handle.tail(40) or handle.tail(40, previous=True)
        cause = likely_cause(lines)
        hint = f"likely cause: {cause[0]}: {cause[1]}" if cause else f"see {handle.log_path} on {head.name}"
        raise TaskFailed(message, hint=hint, details=lines[-12:])


def worker_ranks(inventory: Inventory) -> list[str]:
    """The serving nodes besides the head that run a unit of their own (one per rank); none when the head's mpirun
    starts the ranks there."""
    if not inventory.engine().unit_per_rank:
        return []
    return inventory.serving_nodes()[1:]


def server_process(inventory: Inventory) -> str:
    return inventory.engine().server


def read_states(ctx: ClusterContext, task: str, nodes: list[str], host: str = ENGINE_HOST) -> dict[str, ServingState]:
    """Each node's serving state of the world `ctx` sees (ServerHandle.state_script; its API server at `host` on
    its head), one read per node, all at once; on a rerun read ahead with its facts."""
    states: dict[str, ServingState] = {}

    def read(node: NodeContext) -> None:
        handle = ServerHandle.of(node)
        framing = Framing()
        head = node.name == ctx.inventory.serving_nodes()[0]
        container = node.facts().containers.get(ctx.inventory.container.name)
        script = handle.state_script(ctx.inventory.serve_spec().engine_port, framing, host if head else ENGINE_HOST,
                                     container)
        result = node.read(task + handle.names.suffix, script, framing, timeout=STATE_READ_S)
        if result.timed_out:  # not known to be down: a restart would meet the same hung docker
            raise TaskFailed(f"reading the server's state on {node.name} timed out after {STATE_READ_S:g} s",
                             hint=f"is docker answering on {node.name}? (`docker ps`, `docker exec "
                                  f"{ctx.inventory.container.name} true`)")
        states[node.name] = handle.parse_state(result.stdout, framing, node.name)

    ctx.each_node({n: partial(read, ctx.nodes[n]) for n in nodes})
    return {n: states[n] for n in nodes}


def stop_ranks(ctx: ClusterContext, nodes: list[str], *, disable: bool = False) -> dict[str, int]:
    """Stop the serving unit on each of `nodes` at once; the PID that ran on each where one did.

    Every rank is told first that its end is asked for (world.sh's `stopping` mark): the ranks of one world end
    together, a worker when its master goes and the master when a worker goes, and none of those ends may count
    as a failure of its unit (it would be left `failed`, or counted towards a unit that loops)."""
    stopped: dict[str, int] = {}
    ctx.run_on_all({n: f"touch {q(ServerHandle.of(ctx.nodes[n]).dir)}/stopping 2>/dev/null; true"
                    for n in nodes if n in ctx.nodes}, timeout=30)

    def stop(node: NodeContext) -> None:
        pid = ServerHandle.of(node).stop(disable=disable)
        if pid:
            stopped[node.name] = pid

    ctx.each_node({n: partial(stop, ctx.nodes[n]) for n in nodes if n in ctx.nodes})
    return {n: stopped[n] for n in nodes if n in stopped}


def kill_leftover_ranks(ctx: ClusterContext) -> list[str]:
    """Ranks of our server that outlived their mpirun (or a node's own server), on any node (they would hold GPU
    memory), killed.

    `ctx`: a ClusterContext (the task's, or `sparkctl serve stop`'s); returns `node: pid` per rank."""
    container = ctx.inventory.container.name
    script = launch_type(ctx.inventory).leftovers(world_names(ctx.inventory))
    line = f"docker exec {q(container)} sh -c {q(script)} 2>/dev/null; true"
    results = ctx.run_on_all({n: line for n in ctx.nodes}, timeout=30)
    return [f"{n}: {p}" for n, r in results.items() for p in r.stdout.split()]
