"""PURE: the serving unit on the head, a systemd service that keeps the TP/PP world running (docs/serving.md).

It starts the world once every serving node's container answers over the fabric (leftover ranks of an earlier
server killed on every node first), starts it again when it dies or a node comes back, waiting longer after each
run that did not last, and stays down after `sparkctl serve stop` (disabled) until the next serving bootstrap.

Three files: the unit in /etc/systemd/system; `unit.sh` on the head (the wait before a start, the record after a
stop), and `world.sh` inside the container (run the server in the foreground, stop it, check the world is ready),
both in the state dir's run/serve, which the container mounts.

With vLLM every serving node has its own unit of the same name: each runs that node's `vllm serve` (rank 0 with the
API server, the others `--headless`; or with Ray, `ray start` and on the head `vllm serve` over it). A worker's
unit waits for no one: its rank retries the master until it answers, and ends (to be started again) when the
master goes.
"""

from __future__ import annotations

import posixpath
import shlex
from dataclasses import dataclass

from sparkctl.inventory import Inventory
from sparkctl.plan.container import serving_hosts
from sparkctl.plan.fabric import FabricPlan
from sparkctl.plan.paths import CONFIG_PATH, CONTAINER_STATE, HOSTFILE_PATH, LOG_PATH, PID_PATH
from sparkctl.plan.render import render
from sparkctl.plan.vllm import VLLM_CONFIG_PATH, VllmLaunch

UNIT_DIR = "/etc/systemd/system"
#: world.sh exits with it when what sparkctl wrote is missing (EX_CONFIG, sysexits.h): the unit does not restart
#: then (RestartPreventExitStatus), only a bootstrap repairs it
EXIT_NOT_SET_UP = 78
#: run/serve as the container sees it
CONTAINER_SERVE_DIR = f"{CONTAINER_STATE}/serve"
#: How long the start waits for every serving node's container to answer before it fails (then restarts)
WORLD_WAIT_S = 300
#: The wait between a run's end and the next start, doubled after each run that lasted less than LASTED_S,
#: up to BACKOFF_MAX_S; systemd's own RestartSteps= (systemd 254) never resets its count after a good run
RESTART_S = 5
BACKOFF_BASE_S = 10
BACKOFF_MAX_S = 300
LASTED_S = 600
#: unit.sh's record of how each run ended, in run/serve
EXITS_LOG = "exits.log"
#: How many runs in a row that ended by themselves early make a unit that loops (doctor)
LOOPING_RUNS = 2
#: world.sh stop: TERM mpirun, then KILL after this long
STOP_WAIT_S = 15
#: what `systemctl show` is asked for, by the launch, doctor and `serve status`
SHOW_PROPERTIES = ("LoadState", "ActiveState", "SubState", "UnitFileState", "NRestarts", "Result",
                   "ExecMainStartTimestamp")


#: vLLM names its processes `VLLM::EngineCore`, `VLLM::Worker_TP0`... (set_process_title, prefix
#: VLLM_PROCESS_NAME_PREFIX, default VLLM: vllm/utils/system_utils.py at v0.20.1): the ones left in our container
#: after their `vllm serve` ended are ours
VLLM_TITLE = "^VLLM::"


def leftover_ranks_script(engine: str = "trtllm") -> str:
    """Kill processes of OUR server that outlived it: TensorRT-LLM's ranks (they name our config file) after
    their mpirun, vLLM's processes after their `vllm serve`; prints their PIDs."""
    # `[ ]` matches the space in a rank's command line but not this script's own text
    if engine == "vllm":
        found = f"pgrep -f -- {shlex.quote(f'--config[ ]{VLLM_CONFIG_PATH}')}; pgrep -f -- {shlex.quote(VLLM_TITLE)}"
    else:
        found = f"pgrep -f -- {shlex.quote(f'--extra_llm_api_options[ ]{CONFIG_PATH}')}"
    return (f"for p in $({found}); do "
            "kill -KILL \"$p\" 2>/dev/null && echo \"$p\"; done; true")


def is_our_server(cmdline: str) -> bool:
    """Is this command line (a /proc cmdline, NULs as spaces) the server world.sh runs: mpirun with our config,
    `vllm serve` with our --config file, or a Ray worker node's `ray start --block`?"""
    return (("mpirun" in cmdline and CONFIG_PATH in cmdline) or ("vllm" in cmdline and VLLM_CONFIG_PATH in cmdline)
            or ("ray" in cmdline and " start " in f" {cmdline} " and "--block" in cmdline))


def unit_name(cluster: str) -> str:
    return f"sparkctl-serve-{cluster}.service"


def unit_path(cluster: str) -> str:
    return posixpath.join(UNIT_DIR, unit_name(cluster))


def show_command(cluster: str) -> str:
    """`systemctl show` of the unit: KEY=VALUE lines (LoadState=not-found when there is none)."""
    return f"systemctl show --timestamp=unix -p {','.join(SHOW_PROPERTIES)} {unit_name(cluster)}"


@dataclass(frozen=True)
class Peer:
    name: str
    address: str   # its hostfile address: where mpirun reaches its container


@dataclass(frozen=True)
class ServeUnitSpec:
    cluster: str
    user: str            # the login user (docker group): the unit runs what sparkctl would run
    container: str
    state_dir: str       # on the head
    model: str
    world: str           # "TP=2 x PP=1 on spark1, spark2"
    peers: tuple[Peer, ...]
    command: str         # the launch line (vLLM: this node's; a Ray worker's `ray start --block`)
    fingerprint: str
    engine: str = "trtllm"
    node: str = ""       # whose unit (vLLM: every serving node has one)
    rank: int = 0
    ray_head: str = ""   # vLLM with Ray, on the head: the `ray start --head` before its `vllm serve`

    @property
    def name(self) -> str:
        return unit_name(self.cluster)

    @property
    def unit_path(self) -> str:
        return unit_path(self.cluster)

    @property
    def ray_worker(self) -> bool:
        return self.engine == "vllm" and self.command.startswith("ray ")

    @property
    def uses_ray(self) -> bool:
        return bool(self.ray_head) or self.ray_worker

    @property
    def serve_dir(self) -> str:
        return posixpath.join(self.state_dir, "run", "serve")

    @property
    def host_script(self) -> str:
        return posixpath.join(self.serve_dir, "unit.sh")

    @property
    def world_script(self) -> str:
        return posixpath.join(self.serve_dir, "world.sh")

    def files(self) -> dict[str, str]:
        """path on the head -> content: the two scripts, then the unit that names them."""
        return {self.world_script: self.world_text(), self.host_script: self.host_text(),
                self.unit_path: self.unit_text()}

    def unit_text(self) -> str:
        return render("serve-unit.service.j2", spec=self, world_script=f"{CONTAINER_SERVE_DIR}/world.sh",
                      restart_s=RESTART_S, start_timeout=BACKOFF_MAX_S + WORLD_WAIT_S + 60,
                      stop_timeout=STOP_WAIT_S + 15, not_set_up=EXIT_NOT_SET_UP)

    def host_text(self) -> str:
        return render("serve-unit.sh.j2", spec=self, world_script=f"{CONTAINER_SERVE_DIR}/world.sh",
                      exits_log=EXITS_LOG, world_wait=WORLD_WAIT_S, base=BACKOFF_BASE_S, most=BACKOFF_MAX_S,
                      lasted=LASTED_S)

    def world_text(self) -> str:
        if self.engine == "vllm":
            return render("serve-world-vllm.sh.j2", spec=self, dir=CONTAINER_SERVE_DIR, config=VLLM_CONFIG_PATH,
                          pid=PID_PATH, log=LOG_PATH, stop_wait=STOP_WAIT_S, not_set_up=EXIT_NOT_SET_UP,
                          leftovers=leftover_ranks_script("vllm"))
        return render("serve-world.sh.j2", spec=self, dir=CONTAINER_SERVE_DIR, config=CONFIG_PATH, pid=PID_PATH,
                      log=LOG_PATH, hostfile=HOSTFILE_PATH, stop_wait=STOP_WAIT_S, not_set_up=EXIT_NOT_SET_UP,
                      leftovers=leftover_ranks_script())


def serve_unit_spec(inventory: Inventory, fabric: FabricPlan, *, state_dir: str, user: str, command: str,
                    fingerprint: str) -> ServeUnitSpec:
    """The head's unit: the login user it runs as, the head's state dir, the launch line, and where mpirun
    reaches the other serving nodes' containers (their hostfile addresses)."""
    spec = inventory.serve_spec()
    names = inventory.serving_nodes()
    addresses = dict(zip(names, serving_hosts(inventory, fabric), strict=True))
    return ServeUnitSpec(
        cluster=inventory.cluster.name, user=user, container=inventory.container.name, state_dir=state_dir,
        model=spec.model, world=f"TP={spec.tp_size} x PP={spec.pp_size} on {', '.join(names)}",
        peers=tuple(Peer(name, addresses[name]) for name in names if name != inventory.head.name),
        command=command, fingerprint=fingerprint)


def vllm_unit_spec(inventory: Inventory, launch: VllmLaunch, node: str, *, state_dir: str, user: str,
                   fingerprint: str) -> ServeUnitSpec:
    """Serving node `node`'s unit with vLLM: its own `vllm serve` (or its Ray node), its own state dir and user."""
    spec = inventory.serve_spec()
    names = inventory.serving_nodes()
    rank = names.index(node)
    if launch.executor == "ray":
        ray_line = launch.ray[node]
        if rank == 0:  # the head's Ray node runs in the background, under its vllm serve
            command, ray_head = shlex.join(launch.serve[node]), shlex.join([a for a in ray_line if a != "--block"])
        else:
            command, ray_head = shlex.join(ray_line), ""
    else:
        command, ray_head = shlex.join(launch.serve[node]), ""
    role = "the API server" if rank == 0 else "headless"
    return ServeUnitSpec(
        cluster=inventory.cluster.name, user=user, container=inventory.container.name, state_dir=state_dir,
        model=spec.model, world=f"vLLM TP={spec.tp_size} x PP={spec.pp_size}, rank {rank} of {len(names)} "
                                f"({role}, {launch.executor})",
        peers=(), command=command, fingerprint=fingerprint, engine="vllm", node=node, rank=rank, ray_head=ray_head)


@dataclass(frozen=True)
class RunEnd:
    """One line of exits.log (unit.sh after): how a run of the unit ended."""
    when: str        # ISO time, UTC
    result: str      # systemd's $SERVICE_RESULT: success, exit-code, signal, timeout, ...; `asked`: sparkctl started
    code: str        # $EXIT_CODE: exited, killed, dumped
    status: str      # $EXIT_STATUS: the exit status or the signal's name
    lasted_s: int

    @property
    def by_itself(self) -> bool:
        return self.result not in ("success", "asked")

    def text(self) -> str:
        how = {"exited": f"exited with status {self.status}", "killed": f"killed by SIG{self.status}",
               "dumped": f"dumped core (SIG{self.status})"}.get(self.code, self.result)
        return f"{self.when}, {how} after {self.lasted_s}s"


def parse_exits(text: str) -> list[RunEnd]:
    out = []
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 6 and parts[5].isdigit():
            out.append(RunEnd(parts[0], parts[2], parts[3], parts[4], int(parts[5])))
    return out


def failing_early(ends: list[RunEnd]) -> int:
    """How many runs at the end of the record ended by themselves within LASTED_S (unit.sh's count, for its
    backoff; doctor calls the unit looping from it)."""
    n = 0
    for end in ends:
        n = n + 1 if end.by_itself and end.lasted_s < LASTED_S else 0
    return n


def last_failure(lines: list[str]) -> tuple[RunEnd | None, bool]:
    """The latest run of the unit that ended by itself, and whether it is the latest run that ended at all."""
    ends = [e for e in parse_exits("\n".join(lines)) if e.result != "asked"]
    failures = [e for e in ends if e.by_itself]
    return (failures[-1], failures[-1] is ends[-1]) if failures else (None, False)


def parse_show(text: str) -> dict[str, str]:
    """`systemctl show -p ...`'s KEY=VALUE lines."""
    out = {}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep:
            out[key.strip()] = value.strip()
    return out


def unit_summary(unit: dict[str, str]) -> str:
    """`active (running)`, `inactive (dead)`, `absent` ... as systemctl says it."""
    if unit.get("LoadState") == "not-found" or not unit:
        return "absent"
    return f"{unit.get('ActiveState', '?')} ({unit.get('SubState', '?')})"
