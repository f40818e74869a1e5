"""PURE: the serving unit, a systemd service that keeps the TP/PP world running (docs/serving.md).

It starts the world once every serving node's container answers over the fabric (leftover ranks of an earlier
server killed on every node first), starts it again when it dies or a node comes back, waiting longer after each
run that did not last, and stays down after `sparkctl serve stop` (disabled) until the next serving bootstrap.

Three files: the unit in /etc/systemd/system; `unit.sh` on the node (the wait before a start, the record after a
stop), and `world.sh` inside the container (run the server in the foreground, stop it, check the world is ready),
both in the state dir's run/serve, which the container mounts.

What a unit runs is the engine's launch's (plan/launch.py, UnitRun), in one of two shapes:
- mpirun: the head's unit alone; its world.sh waits for every serving node's container to answer over the fabric
  and runs mpirun, which starts the ranks there (serve-world-mpirun.sh.j2);
- one rank per node: every serving node has its own unit of the same name, each running that node's server (rank
  0 with the API server); a worker's unit waits for no one: its rank retries the head until it answers, and ends
  (to be started again) when the head goes (serve-world-rank.sh.j2).
"""

from __future__ import annotations

import json
import posixpath
import shlex
from dataclasses import dataclass

from sparkctl.plan.paths import HOSTFILE_PATH
from sparkctl.plan.render import render
from sparkctl.plan.watchdog import EVIDENCE_NAME, WatchdogRun, watchdog_script
from sparkctl.plan.world import LOG_FILE, PID_FILE, UNIT_DIR, WorldNames, literal

#: world.sh exits with it when what sparkctl wrote is missing (EX_CONFIG, sysexits.h): the unit does not restart
#: then (RestartPreventExitStatus), only a bootstrap repairs it
EXIT_NOT_SET_UP = 78
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


#: The key of a serving unit's [Unit] section that names its cluster (systemd ignores X- keys).
CLUSTER_KEY = "X-Sparkctl-Cluster"


def units_of_cluster(cluster: str) -> str:
    """A script printing the name of every serving unit of the cluster on a node, one per line: the first world's by
    its name, every other world's by its name and the cluster its file names (CLUSTER_KEY)."""
    first = WorldNames(cluster)
    others = shlex.quote(posixpath.join(UNIT_DIR, f"{first.unit_name.removesuffix('.service')}--")) + "*.service"
    # each file's lines read by the shell itself (a `grep -qx` per file was a process; for the unmatched glob too)
    return (f"test -e {shlex.quote(first.unit_path)} && echo {shlex.quote(first.unit_name)}; "
            f"for f in {others}; do [ -f \"$f\" ] || continue; "
            f"while IFS= read -r l || [ -n \"$l\" ]; do [ \"$l\" = {shlex.quote(f'{CLUSTER_KEY}={cluster}')} ] && "
            "{ echo \"${f##*/}\"; break; }; done 2>/dev/null <\"$f\"; done; true")


def world_key_of(cluster: str, unit: str) -> str | None:
    """The key of the world whose unit `unit` is (a name units_of_cluster printed); None: not one of the
    cluster's."""
    stem = unit.removeprefix(f"sparkctl-serve-{cluster}").removesuffix(".service")
    if stem == "" and unit == WorldNames(cluster).unit_name:
        return ""
    return stem[2:] if stem.startswith("--") and stem[2:] and unit.endswith(".service") else None


#: The variable a world's processes carry (world.sh exports it; every process it starts inherits it): which world
#: of which cluster they are, so that ending what one world left never ends another's.
WORLD_VARIABLE = "SPARKCTL_WORLD"


def leftovers_script(patterns: tuple[str, ...], marker: str) -> str:
    """Kill the processes of an earlier server that outlived it (they would hold GPU memory), found by `pgrep -f`
    patterns of their command lines, and not another world's (a process whose WORLD_VARIABLE names another world
    is left alone; one with none was started before worlds were marked, or by mpirun on a peer); prints their
    PIDs."""
    found = "; ".join(f"pgrep -f -- {shlex.quote(p)}" for p in patterns)
    return (f"for p in $({found}); do "
            f"w=$(tr '\\0' '\\n' < /proc/\"$p\"/environ 2>/dev/null | sed -n 's/^{WORLD_VARIABLE}=//p'); "
            f"[ -z \"$w\" ] || [ \"$w\" = {shlex.quote(marker)} ] || continue; "
            "kill -KILL \"$p\" 2>/dev/null && echo \"$p\"; done; true")


def own_pattern(program: str, config: str) -> str:
    """A server's command line as `grep -E` and re.search read it: the program, then our config file (`config`, a
    regex: world.config_pattern)."""
    return f"{literal(program)}.*{config}"


def show_command(cluster: str, key: str = "") -> str:
    """`systemctl show` of a world's unit (plan/world.py): KEY=VALUE lines (LoadState=not-found when there is
    none)."""
    return f"systemctl show --timestamp=unix -p {','.join(SHOW_PROPERTIES)} {WorldNames(cluster, key).unit_name}"


@dataclass(frozen=True)
class Peer:
    name: str
    address: str   # its hostfile address: where mpirun reaches its container


@dataclass(frozen=True)
class UnitRun:
    """What one node's serving unit runs in its container: the engine's launch makes it (plan/launch.py)."""
    command: str                  # the server's line, in the foreground
    config: str                   # the file it reads, as the container sees it: no start without it
    world: str                    # the world in words ("TP=2 x PP=1 on spark1, spark2")
    ours: str                     # the server's command line, a regex (grep -E, re.search)
    leftovers: str                # kills what an earlier server left, prints their PIDs (leftovers_script)
    #: True: mpirun, which starts every rank from this unit (the head's); False: this node's rank alone
    mpirun: bool = False
    peers: tuple[Peer, ...] = ()  # mpirun: the containers that must answer before it starts
    rank: int = 0
    before: str = ""              # started and waited for before the server (vLLM's Ray head node)
    after: str = ""               # run once the server ended or was stopped (`ray stop`)


@dataclass(frozen=True)
class ServeUnitSpec:
    cluster: str
    user: str            # the login user (docker group): the unit runs what sparkctl would run
    container: str
    state_dir: str       # on the node
    model: str
    run: UnitRun
    fingerprint: str
    node: str = ""       # whose unit
    #: the world's head's watchdog (plan/watchdog.py); None: off, or not the world's head
    watchdog: WatchdogRun | None = None
    #: which world of the cluster (plan/world.py): "" for the first
    key: str = ""

    @property
    def names(self) -> WorldNames:
        return WorldNames(self.cluster, self.key)

    @property
    def name(self) -> str:
        return self.names.unit_name

    @property
    def unit_path(self) -> str:
        return self.names.unit_path

    @property
    def world(self) -> str:
        return self.run.world

    @property
    def marker(self) -> str:
        """What WORLD_VARIABLE holds in the processes of this world."""
        return self.names.marker

    @property
    def serve_dir(self) -> str:
        return self.names.node_dir(self.state_dir)

    @property
    def host_script(self) -> str:
        return posixpath.join(self.serve_dir, "unit.sh")

    @property
    def world_script(self) -> str:
        return posixpath.join(self.serve_dir, "world.sh")

    @property
    def watchdog_script(self) -> str:
        return posixpath.join(self.serve_dir, "watchdog.py")

    def files(self) -> dict[str, str]:
        """path on the node -> content: the scripts (the watchdog's where it runs), then the unit that names them."""
        watchdog = {self.watchdog_script: watchdog_script()} if self.watchdog else {}
        return {**watchdog, self.world_script: self.world_text(), self.host_script: self.host_text(),
                self.unit_path: self.unit_text()}

    def unit_text(self) -> str:
        return render("serve-unit.service.j2", spec=self, world_script=self.names.in_container("world.sh"),
                      cluster_key=CLUSTER_KEY,
                      restart_s=RESTART_S, start_timeout=BACKOFF_MAX_S + WORLD_WAIT_S + 60,
                      stop_timeout=STOP_WAIT_S + 15, not_set_up=EXIT_NOT_SET_UP)

    def host_text(self) -> str:
        return render("serve-unit.sh.j2", spec=self, world_script=self.names.in_container("world.sh"),
                      exits_log=EXITS_LOG, world_wait=WORLD_WAIT_S, base=BACKOFF_BASE_S, most=BACKOFF_MAX_S,
                      lasted=LASTED_S, evidence=EVIDENCE_NAME)

    def world_text(self) -> str:
        template = "serve-world-mpirun.sh.j2" if self.run.mpirun else "serve-world-rank.sh.j2"
        names = self.names
        return render(template, spec=self, run=self.run, dir=names.container_dir, pid=names.in_container(PID_FILE),
                      log=names.in_container(LOG_FILE),
                      hostfile=HOSTFILE_PATH, stop_wait=STOP_WAIT_S, not_set_up=EXIT_NOT_SET_UP,
                      watchdog=self.watchdog, evidence=EVIDENCE_NAME, world_variable=WORLD_VARIABLE)


@dataclass(frozen=True)
class RunEnd:
    """One line of exits.log (unit.sh after): how a run of the unit ended."""
    when: str        # ISO time, UTC
    result: str      # systemd's $SERVICE_RESULT: success, exit-code, signal, timeout, ...; `asked`: sparkctl started
    code: str        # $EXIT_CODE: exited, killed, dumped
    status: str      # $EXIT_STATUS: the exit status or the signal's name
    lasted_s: int
    #: `stuck`: what the watchdog saw (reason, last_token_at, running, gpu_power_w ...)
    evidence: dict | None = None

    @property
    def by_itself(self) -> bool:
        return self.result not in ("success", "asked")

    def text(self) -> str:
        if self.result == "stuck":
            seen = self.evidence or {}
            power = ", ".join(f"{w:g} W" for w in seen.get("gpu_power_w") or []) or "not read"
            return (f"{self.when}, stuck after {self.lasted_s}s: {seen.get('reason', 'no reason recorded')} (last "
                    f"token {seen.get('last_token_at', '?')}, {seen.get('running', '?')} requests running, the head's "
                    f"GPU power {power}); the whole world was started again")
        how = {"exited": f"exited with status {self.status}", "killed": f"killed by SIG{self.status}",
               "dumped": f"dumped core (SIG{self.status})"}.get(self.code, self.result)
        return f"{self.when}, {how} after {self.lasted_s}s"


def parse_exits(text: str) -> list[RunEnd]:
    """exits.log's lines: six fields, and after a `stuck` end the watchdog's evidence (JSON) as the rest."""
    out = []
    for line in text.splitlines():
        parts = line.split(maxsplit=6)
        if len(parts) >= 6 and parts[5].isdigit():
            evidence = None
            if len(parts) == 7:
                try:
                    evidence = json.loads(parts[6])
                except ValueError:
                    evidence = None
            out.append(RunEnd(parts[0], parts[2], parts[3], parts[4], int(parts[5]),
                              evidence if isinstance(evidence, dict) else None))
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
