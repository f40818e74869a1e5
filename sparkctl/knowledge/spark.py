"""What a DGX Spark is, as far as the fabric is concerned: its CX-7 netdev names, their RoCE devices, its
management interfaces and the line rate of a QSFP port.

Sources: NVIDIA/dgx-spark-playbooks, nvidia/connect-two-sparks/README.md (Step 2: the `ibdev2netdev` output of
a Spark, "each physical port has two logical interfaces", "use the same physical port on each device"; Step 3:
the 200GbE link and the 40-cx7.yaml netplan file); the DGX Spark hardware overview (10GbE RJ45 management port
enP7s7, Wi-Fi wlP9s9).
"""

from __future__ import annotations

import re

#: Physical QSFP port -> its two netdevs ("twins": two PCIe Gen5 x4 halves), twin 1 in PCIe domain 0000 first.
SPARK_TWINS: dict[int, tuple[str, str]] = {
    0: ("enp1s0f0np0", "enP2p1s0f0np0"),
    1: ("enp1s0f1np1", "enP2p1s0f1np1"),
}
#: Netdev -> its RoCE device, as `ibdev2netdev` prints them on a Spark (the mixed case is real).
SPARK_ROCE: dict[str, str] = {
    "enp1s0f0np0": "rocep1s0f0",
    "enP2p1s0f0np0": "roceP2p1s0f0",
    "enp1s0f1np1": "rocep1s0f1",
    "enP2p1s0f1np1": "roceP2p1s0f1",
}
#: The port NVIDIA's two-Spark playbook cables when nothing else says which.
DEFAULT_PORT = 1
#: Never fabric: the management session and Wi-Fi ride on these.
MANAGEMENT_INTERFACES: dict[str, str] = {"enP7s7": "the 10GbE management port", "wlP9s9": "the Wi-Fi interface"}
MANAGEMENT_NAMES = tuple(MANAGEMENT_INTERFACES)
#: A QSFP port's line rate: 200GbE (`ethtool` Speed: 200000Mb/s); a switch may negotiate 100G.
PORT_SPEED_MBPS = 200_000

# CX-7 netdev names: en[P<domain>]p<bus>s<slot>f<function>np<port>. Domain 2 is the second PCIe half ("twin 2")
# of the same physical port; `np<N>` is the physical QSFP port.
_SPARK_NETDEV = re.compile(r"^en(?:P(?P<domain>\d+))?p\d+s\d+f\d+np(?P<port>\d+)$")


def spark_port_of(netdev: str) -> tuple[int, int] | None:
    """(physical port, PCIe domain) of a Spark-named fabric netdev, or None for any other name."""
    m = _SPARK_NETDEV.match(netdev)
    if not m:
        return None
    return int(m.group("port")), int(m.group("domain") or 0)
