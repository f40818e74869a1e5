"""A run's connections, and its cluster lock, opened in the background as soon as the input is checked, while the
rest of sparkctl loads: on a no-op rerun the controller spends about 0.12 s importing what only runs the tasks, and
about 0.13 s waiting for the nodes to log it in and answer the lock; the two now overlap.

Light by design: it imports the inventory, the transport and the lock only, all of them loaded by the main thread
before the thread starts, so that the thread never imports while the main thread does (two threads importing
modules that import each other can deadlock).
"""

from __future__ import annotations

import encodings.idna  # noqa: F401 - resolving a host name loads it on first use: here, in the main thread
import os
import threading
from dataclasses import dataclass, field

from sparkctl.errors import BadInput, Unreachable
from sparkctl.inventory import Inventory
from sparkctl.runs.lock import ClusterLock, Holder
from sparkctl.runs.outputs import unwritable_reason
from sparkctl.transport.connect import ConnectOptions, NodeAddress, connect_all
from sparkctl.transport.shell import ShellTransport


def node_address(inventory: Inventory, name: str) -> NodeAddress:
    """Where and as whom sparkctl logs in to one node."""
    target = inventory.ssh_target(name)
    return NodeAddress(node=target.name, host=target.host, user=target.user, port=target.port,
                       identity_file=target.identity_file, local=target.local)


def connect_options(inventory: Inventory, become_password: str | None) -> ConnectOptions:
    return {"known_hosts_path": inventory.ssh.known_hosts, "use_ssh_config": inventory.ssh.use_ssh_config,
            "connect_timeout": inventory.ssh.connect_timeout, "become_password": become_password}


def check_known_hosts(inventory: Inventory) -> None:
    """A known_hosts file in a folder that does not exist is refused before connecting (ssh makes ~/.ssh, never
    a folder the inventory names: a typo there would scatter host keys)."""
    path = os.path.expanduser(inventory.ssh.known_hosts)
    if os.path.dirname(path) == os.path.expanduser("~/.ssh"):
        return
    reason = unwritable_reason(path)
    if reason:
        raise BadInput(f"{inventory.where('ssh', 'known_hosts')}: ssh.known_hosts {inventory.ssh.known_hosts}: "
                       f"{reason}")


@dataclass
class Opened:
    """What an Opening found: the nodes reached (inventory order), why each other one was not, and the cluster
    lock held on the reached ones (None: not asked for, or `lock_error` says why it was not taken)."""

    transports: dict[str, ShellTransport] = field(default_factory=dict)
    unreachable: dict[str, Unreachable] = field(default_factory=dict)
    lock: ClusterLock | None = None
    lock_error: BaseException | None = None


class Opening:
    """Connect to every node, then take the cluster lock on those reached (when `holder` is given), in a thread.
    `hand_over()` waits for it and hands over what it opened (the taker closes the connections and releases the
    lock). Leaving the `with` block without handing over closes and releases everything: at once when the thread
    is done, else (an exception, Ctrl-C, while it still connects) by the thread itself as it finishes, without
    taking the lock; the command does not wait for it.

    Start it only once everything a command can refuse is checked: a refused input must not have connected."""

    def __init__(self, inventory: Inventory, *, forks: int, become_password: str | None, holder: Holder | None):
        check_known_hosts(inventory)
        self.inventory = inventory
        self._addresses = [node_address(inventory, n.name) for n in inventory.nodes]
        self._options = connect_options(inventory, become_password)
        self._forks = forks
        self._holder = holder
        self._opened = Opened()
        self._error: BaseException | None = None
        self._handed_over = False
        self._done = False
        #: the command went on without it: what the thread opens from now on, it closes itself
        self._abandoned = threading.Event()
        self._owner = threading.Lock()  # who closes what was opened: the thread once abandoned, else the taker
        self._thread = threading.Thread(target=self._open, name="sparkctl-opening", daemon=True)

    def __enter__(self) -> Opening:
        self._thread.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, *exc: object) -> None:
        if self._handed_over:
            return
        if exc_type is None:
            self._thread.join()
        with self._owner:
            self._abandoned.set()
            if self._done:
                self._close()

    def _open(self) -> None:
        try:
            transports, self._opened.unreachable = connect_all(self._addresses, forks=self._forks, **self._options)
            names = [n.name for n in self.inventory.nodes]
            self._opened.transports = {n: transports[n] for n in names if n in transports}
            if self._holder is not None and not self._abandoned.is_set():
                lock = ClusterLock(self.inventory.cluster.name, dict(self._opened.transports), self._holder,
                                   forks=self._forks)
                try:
                    lock.acquire()  # releases what it took when it fails
                    self._opened.lock = lock
                except BaseException as exc:  # noqa: BLE001 - raised where the run takes the lock (runs/session.py)
                    self._opened.lock_error = exc
        except BaseException as exc:  # noqa: BLE001 - raised in the main thread by hand_over()
            self._error = exc
        finally:
            with self._owner:
                self._done = True
                if self._abandoned.is_set():
                    self._close()

    def hand_over(self) -> Opened:
        """What was opened, once it is (raises what connecting raised); from now on the caller's to close. Once."""
        if self._handed_over or self._abandoned.is_set():
            raise RuntimeError("an Opening is handed over once, and only while its command still runs")
        self._thread.join()
        if self._error is not None:
            raise self._error
        self._handed_over = True
        return self._opened

    def _close(self) -> None:
        if self._opened.lock is not None:
            self._opened.lock.release()
            self._opened.lock = None
        for transport in self._opened.transports.values():
            transport.close()
