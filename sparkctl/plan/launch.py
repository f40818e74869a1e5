"""PURE: a serving cluster's launch, whatever the engine: ClusterPlan.launch.

Each engine's planner (plan/trtllm.py, plan/vllm.py, plan/sglang.py; plan/launches.py holds one entry per engine)
makes a Launch for the image's release: the config file every serving container reads (or none), the line each
serving node's unit runs, what the release left out of the preset, and how the plan is shown. Tasks, doctor and
`cluster plan` use this interface and never one engine's fields.
"""

from __future__ import annotations

import shlex
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import ClassVar

from sparkctl.engines import Engine
from sparkctl.inventory import Inventory
from sparkctl.plan.gateway import ENGINE_HOST
from sparkctl.plan.serve_unit import ServeUnitSpec, UnitRun
from sparkctl.plan.watchdog import watchdog_run
from sparkctl.plan.world import WorldNames


@dataclass(frozen=True, kw_only=True)
class Launch(ABC):
    #: its name in the world's run/serve dir (plan/world.py); None: the engine reads no config file, its command lines
    #: are its whole setup
    config_file: ClassVar[str | None]

    engine: Engine
    #: the world's names on its nodes: its unit, its dir, its processes' marker (plan/world.py)
    names: WorldNames
    #: where its API server answers (world.engine_host): the head's loopback, else its node's fabric address
    host: str = ENGINE_HOST
    #: the release the launch was planned for (shown as the engine numbers it); None: not known from the image
    release: object | None
    #: the preset's keys or flags the release does not have, left out (not the user's to fix)
    dropped: list[str] = field(default_factory=list)
    #: one line per key of the user's own the release would refuse (the launch must not start)
    refused: list[str] = field(default_factory=list)
    #: which known release an unknown one is judged as
    note: str = ""

    @property
    def config_path(self) -> str | None:
        """The config file as the containers read it."""
        return self.names.in_container(self.config_file) if self.config_file else None

    @abstractmethod
    def config_text(self) -> str:
        """The config file every serving container reads."""

    @abstractmethod
    def commands(self) -> dict[str, list[str]]:
        """Each node whose unit runs a server -> the server's argv (one node for mpirun: the head)."""

    @abstractmethod
    def command_lines(self) -> str:
        """What the launch is started from besides its config (its fingerprint's part): a changed line anywhere
        restarts the world."""

    @classmethod
    @abstractmethod
    def leftovers(cls, names: WorldNames) -> str:
        """A script that kills what an earlier server of the engine left in a container on any node (they would
        hold GPU memory), of the world `names` names (its marker) or of none, and prints their PIDs. Needs no plan:
        `serve stop` runs it whatever the fabric's state."""

    @classmethod
    @abstractmethod
    def servers(cls, names: WorldNames | None = None) -> tuple[str, ...]:
        """The command lines (regexes) of what the engine's units run: of the world `names` names, or of any."""

    @abstractmethod
    def unit_run(self, inventory: Inventory, node: str) -> UnitRun:
        """What `node`'s serving unit runs (a node in commands())."""

    @abstractmethod
    def describe(self) -> list[str]:
        """`cluster plan`'s lines for the launch: the release, the config file, every node's line."""

    @abstractmethod
    def configured(self, inventory: Inventory, labels: dict[str, str]) -> Launch:
        """The launch for the release the running image's labels name (itself when they name the same)."""

    def unit(self, inventory: Inventory, node: str, *, state_dir: str, user: str, fingerprint: str) -> ServeUnitSpec:
        """`node`'s serving unit: its state dir and login user (from its facts), and the launch's fingerprint."""
        return ServeUnitSpec(
            cluster=inventory.cluster.name, user=user, container=inventory.container.name, state_dir=state_dir,
            model=inventory.serve_spec().model, run=self.unit_run(inventory, node), fingerprint=fingerprint,
            node=node, key=self.names.key,
            watchdog=watchdog_run(inventory, self.host) if node == inventory.serving_nodes()[0] else None)

    def rendezvous(self) -> str | None:
        """`address:port` on the head that every other rank connects to over the fabric (None: none of its own)."""
        return None

    def programs(self) -> tuple[str, ...]:
        """What the image must have besides the server to run this launch."""
        return ()

    def head_command(self) -> str:
        """The head's line, as shown."""
        return shlex.join(next(iter(self.commands().values())))

    def world(self, inventory: Inventory) -> str:
        spec = inventory.serve_spec()
        return f"TP={spec.tp_size} x PP={spec.pp_size} on {', '.join(inventory.serving_nodes())}"
