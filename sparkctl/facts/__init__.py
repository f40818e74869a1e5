"""Facts about a node, read in one round trip: `gather_facts(transport, node) -> Facts`."""

from __future__ import annotations

from sparkctl.facts.controller import gather_local_controller_addrs
from sparkctl.facts.gather import facts_from_output, gather_facts
from sparkctl.facts.model import (
    Address,
    ContainerInfo,
    Facts,
    Interface,
    Lldp,
    LldpNeighbor,
    NetplanFile,
    NetworkManagerView,
    NmDevice,
    NmProfile,
    RoceDevice,
    Route,
)

__all__ = [
    "Address", "ContainerInfo", "Facts", "Interface", "Lldp", "LldpNeighbor", "NetplanFile", "NetworkManagerView",
    "NmDevice", "NmProfile", "RoceDevice", "Route", "facts_from_output", "gather_facts",
    "gather_local_controller_addrs",
]
