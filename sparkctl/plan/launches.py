"""PURE: each engine's launch, one entry per engine (sparkctl/engines names them), and what any of them runs."""

from __future__ import annotations

import re
from collections.abc import Callable

from sparkctl.engines import EngineName
from sparkctl.inventory import Inventory
from sparkctl.plan.fabric import FabricPlan
from sparkctl.plan.launch import Launch
from sparkctl.plan.sglang import SglangLaunch, sglang_launch
from sparkctl.plan.trtllm import TrtllmLaunch, trtllm_launch
from sparkctl.plan.vllm import VllmLaunch, vllm_launch

LAUNCHES: dict[EngineName, type[Launch]] = {"trtllm": TrtllmLaunch, "vllm": VllmLaunch, "sglang": SglangLaunch}
PLANNERS: dict[EngineName, Callable[[Inventory, FabricPlan], Launch]] = {
    "trtllm": trtllm_launch, "vllm": vllm_launch, "sglang": sglang_launch}
#: the command line of a server any serving unit of sparkctl's runs (an engine switch leaves the last one's)
_SERVERS = re.compile("|".join(p for launch in LAUNCHES.values() for p in launch.servers()))


def plan_launch(inventory: Inventory, fabric: FabricPlan) -> Launch:
    return PLANNERS[inventory.engine().name](inventory, fabric)


def launch_type(inventory: Inventory) -> type[Launch]:
    """The engine's launch, for what needs no plan (`serve stop`'s leftovers)."""
    return LAUNCHES[inventory.engine().name]


def is_our_server(cmdline: str) -> bool:
    """Is this command line (a /proc cmdline, NULs as spaces) a server a serving unit of sparkctl's runs?"""
    return _SERVERS.search(cmdline) is not None
