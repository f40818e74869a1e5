"""The cluster lock: one changing run per cluster at a time, held ON the nodes, so two controllers exclude each
other as surely as two shells on one controller.

On every reachable node, in inventory order, sparkctl leaves a small bash process running over its connection:
it holds `flock` on `<state dir>/run.lock` and writes who holds it to `run.holder`. The kernel lock lives exactly
as long as that process, which ends when its stdin closes (sparkctl ends, is killed or loses the connection) or
when no heartbeat came for LEASE_S seconds. A clean release removes `run.holder`; a run that ended any other way
leaves it, so the next run finds a free lock with a holder record: stale, taken over, and said so. A holder of
this controller whose process is gone but whose node-side process still waits (its link was cut: no FIN reached
the node) is ended by the next run at once, not after the lease.
Read-only commands never take it (`peek` only tells them a run is changing the cluster).
"""

from __future__ import annotations

import getpass
import json
import os
import re
import socket
import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime, timezone

from sparkctl import __version__
from sparkctl.errors import ClusterBusy, SparkctlError
from sparkctl.shipped import shipped_text
from sparkctl.transport.base import Transport, q
from sparkctl.transport.held import HeldCommand

#: A holder that sent no heartbeat for this long is gone: its node-side process exits and frees the lock.
LEASE_S = 45
HEARTBEAT_S = 10.0
ANSWER_TIMEOUT_S = 30.0
MARK = "sparkctl-lock"


# The node-side scripts, shipped as files (templates/lock-*.sh): the holder left running ($1 the cluster, $2 this
# run's holder record, $3 the lease; its lines start with MARK), the takeover of a holder gone from here (its run id
# on stdin), and the read-only peek ($1 the cluster). The lock's folder is sparkctl's state dir on the node
# (plan.paths.state_dir), beside what the container mounts. Read from the shipped files alone: the lock is taken in
# the opening's own thread while the nodes are still being connected, before the planners are loaded.


def hold_script() -> str:
    return shipped_text("lock-hold.sh")


def takeover_script() -> str:
    return shipped_text("lock-takeover.sh")


def peek_script() -> str:
    return shipped_text("lock-peek.sh")


def no_answer(node: str, ended: bool) -> SparkctlError:
    """The lock script gave no answer: it ended without one (bash could not run it), or none came in time."""
    if ended:
        return SparkctlError(f"{node}: the cluster lock's script ended without an answer",
                             hint="is bash on the node? (`bash --version` there)")
    return SparkctlError(f"{node}: no answer within {ANSWER_TIMEOUT_S:g} s while taking the cluster lock",
                         hint="the node or its connection is slow to answer (load, a stalled link); try again")


def gone_from_here(holder: Holder) -> bool:
    """A holder started on this controller whose process no longer exists (a reused pid counts as alive: the
    lease then ends it, never a guess)."""
    if holder.controller != socket.gethostname() or not re.fullmatch(r"[0-9a-f]{12}", holder.run):
        return False
    try:
        os.kill(holder.pid, 0)
    except ProcessLookupError:
        return True
    except (PermissionError, OverflowError, ValueError):
        return False
    return False


@dataclass
class Holder:
    """Who holds (or held) a cluster lock."""

    command: str
    user: str
    controller: str
    pid: int
    since: str
    run: str
    version: str = ""
    limit: list[str] = field(default_factory=list)

    @classmethod
    def now(cls, command: str, limit: set[str] | None = None) -> Holder:
        return cls(command=command, user=getpass.getuser(), controller=socket.gethostname(), pid=os.getpid(),
                   since=datetime.now(timezone.utc).isoformat(timespec="seconds").replace("+00:00", "Z"),
                   run=uuid.uuid4().hex[:12], version=__version__, limit=sorted(limit or ()))

    @classmethod
    def parse(cls, text: str) -> Holder | None:
        try:
            data = json.loads(text)
            return cls(**{k: data[k] for k in ("command", "user", "controller", "pid", "since", "run")},
                       version=str(data.get("version", "")), limit=list(data.get("limit") or []))
        except (ValueError, KeyError, TypeError):
            return None

    def record(self) -> str:
        return json.dumps(self.__dict__, separators=(",", ":"), sort_keys=True)

    def describe(self, now: float | None = None) -> str:
        """`bootstrap by nvidia@ctl (pid 4242) since 02:40:11Z (12 s ago)`"""
        ago = ""
        try:
            started = datetime.fromisoformat(self.since.replace("Z", "+00:00")).timestamp()
            ago = f" ({_duration((now or time.time()) - started)} ago)"
        except ValueError:
            pass
        limit = f" --limit {','.join(self.limit)}" if self.limit else ""
        return (f"{self.command}{limit} by {self.user}@{self.controller} (pid {self.pid}) since "
                f"{self.since.replace('T', ' ')}{ago}")


def _duration(seconds: float) -> str:
    seconds = max(0, int(seconds))
    if seconds < 120:
        return f"{seconds} s"
    if seconds < 7200:
        return f"{seconds // 60} min"
    return f"{seconds // 3600} h"


def describe_other(text: str) -> str:
    holder = Holder.parse(text.strip())
    return holder.describe() if holder else "another sparkctl run (no holder record)"


class ClusterLock:
    """Take with `acquire()` (raises ClusterBusy naming the holder), give back with `release()`. A context
    manager does both. `stale` lists the holders found gone (their lock taken over); `warn` is told when the lease
    on a node is lost mid-run and taken again."""

    def __init__(self, cluster: str, transports: dict[str, Transport], holder: Holder,
                 warn: Callable[[str, str], None] | None = None, forks: int = 32):
        self.cluster = cluster
        self.forks = max(1, forks)  # nodes asked at once (--forks)
        self.transports = transports  # in inventory order
        self.holder = holder
        self.stale: dict[str, Holder | None] = {}
        #: told when the lease on a node is lost mid-run (may be set once the run's events have somewhere to go)
        self.warn: Callable[[str, str], None] = warn or (lambda node, message: None)
        self._held: dict[str, HeldCommand] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._beat: threading.Thread | None = None

    def __enter__(self) -> ClusterLock:
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

    def acquire(self) -> None:
        """All of the nodes, or none. The first node (in inventory order) first: every run meets it first, so it
        decides between two runs started together; the others then in parallel (one round trip each)."""
        try:
            nodes = list(self.transports.items())
            if nodes:
                self._take(*nodes[0])
            if len(nodes) > 1:
                with ThreadPoolExecutor(max_workers=min(self.forks, len(nodes) - 1), thread_name_prefix="lock") as pool:
                    for future in [pool.submit(self._take, node, t) for node, t in nodes[1:]]:
                        future.result()
        except BaseException:
            self.release()
            raise
        self._beat = threading.Thread(target=self._heartbeat, name="sparkctl-lock", daemon=True)
        self._beat.start()

    def _take(self, node: str, transport: Transport, retried: bool = False) -> None:
        held = transport.hold(hold_script(), self.cluster, self.holder.record(), str(LEASE_S),
                              what=f"cluster lock on {node}")
        deadline = time.monotonic() + ANSWER_TIMEOUT_S
        while True:
            line = held.readline(max(0.1, deadline - time.monotonic()))
            if line is None:
                ended = held.ended
                held.close()
                raise no_answer(node, ended)
            word, _, rest = line.removeprefix(MARK + " ").partition(" ")
            if not line.startswith(MARK):
                continue
            if word == "held":
                held.close()
                gone = Holder.parse(rest.strip())
                if not retried and gone is not None and gone_from_here(gone):
                    # a run of this controller that died with its link down: the node still waits for its
                    # heartbeat (no FIN ever came), so the lease would hold the cluster for LEASE_S more
                    transport.run(f"bash -c {q(takeover_script())}", input=gone.run + "\n", timeout=15)
                    self._take(node, transport, retried=True)
                    with self._lock:
                        self.stale[node] = gone
                    return
                raise ClusterBusy(f"cluster {self.cluster} is busy: {describe_other(rest)} holds it "
                                  f"(lock on {node}); try again when that run ends")
            if word == "error":
                held.close()
                raise SparkctlError(f"{node}: cannot take the cluster lock: {rest}")
            if word == "stale":
                with self._lock:
                    self.stale[node] = Holder.parse(rest)
            if word == "acquired":
                with self._lock:
                    self._held[node] = held
                return
            if time.monotonic() > deadline:
                held.close()
                raise SparkctlError(f"{node}: no answer while taking the cluster lock")

    def _heartbeat(self) -> None:
        while not self._stop.wait(HEARTBEAT_S):
            for node, held in list(self._held.items()):
                if self._stop.is_set():
                    return
                if held.send(""):
                    continue
                # the channel is gone: the node freed the lock; take it again unless someone else did
                self._held.pop(node, None)
                try:
                    self._take(node, self.transports[node])
                    self.warn(node, "the cluster lock's connection dropped; taken again")
                except SparkctlError as exc:
                    self.warn(node, f"lost the cluster lock: {exc.message}")

    def release(self) -> None:
        self._stop.set()
        if self._beat is not None and self._beat is not threading.current_thread():
            self._beat.join(ANSWER_TIMEOUT_S + 5)  # a heartbeat taking a lease again finishes first
        # every node asked first, then each answer waited for: the nodes release at once, not one round trip after
        # another
        holders = list(reversed(list(self._held.values())))
        asked = [held for held in holders if held.send("release")]
        for held in asked:
            held.readline(5.0)
        for held in holders:
            held.close()
        self._held.clear()


def peek(cluster: str, transports: dict[str, Transport]) -> dict[str, str]:
    """Node -> who holds the cluster lock now, for the nodes where a run holds it (read-only)."""
    out = {}
    for node, transport in transports.items():
        result = transport.run(f"bash -c {q(peek_script())} sparkctl {q(cluster)}", timeout=15)
        line = result.stdout.strip()
        if result.ok and line.startswith("held"):
            out[node] = describe_other(line[4:])
    return out
