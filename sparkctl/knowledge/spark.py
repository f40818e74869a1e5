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

# --- bandwidth figures (the verdicts of `fabric bench` are against these) -------------------------------------
#: One twin is one PCIe Gen5 x4 endpoint of the 200G port: "~100 Gbps each" (NVIDIA/dgx-spark-playbooks,
#: nvidia/nccl/README.md, "Reaching full 200 Gbps bandwidth"; ServeTheHome, "The NVIDIA GB10 ConnectX-7 200GbE
#: Networking is Really Different": two 32GT/s PCIe Gen5 x4 links, "a PCIe Gen5 x4 link is roughly 100Gbps").
TWIN_LINE_RATE_GBPS = 100.0
#: What one twin really gave with `ib_write_bw` between two Sparks: 11,679 MB/sec = 93.4 Gbps
#: (github.com/elizabetht/spark, infiniband-tutorial/02_Multi_Rail_Tutorial.md, "Measured Performance").
TWIN_RDMA_WRITE_MEASURED_GBPS = 93.4
#: A link passes at this share of its line rate (the measured 93.4 of 100 is 93%).
LINK_PASS_FRACTION = 0.80
#: A twin's PCIe width: x4 (ServeTheHome, above). A BIOS before 2026-04 wired the second controller at Gen5 x2
#: (tonyd2wild/DeepSeek-v4-Flash-Vision-Exp-DSpark-1M-NVFP4-KV-2x-DGX-Spark PR #35, "fix via fwupdmgr").
TWIN_PCIE_WIDTH = 4
#: The fabric MTU every Spark guide sets (NVIDIA nccl playbook: "jumbo frames on the CX-7 interfaces", 9000).
FABRIC_MTU = 9000
#: NCCL bus bandwidth between two Sparks on one cable with both twins in NCCL_IB_HCA and MTU 9000: "busbw ≈ 20-24
#: GB/s (~190 Gbps)" (NVIDIA/dgx-spark-playbooks nvidia/nccl/README.md, all_gather_perf); bus bandwidth is the
#: figure nccl-tests normalises so that every collective compares with the hardware's (NVIDIA/nccl-tests
#: doc/PERFORMANCE.md), so all_reduce_perf's busbw is judged against it too.
PAIR_BUSBW_GBYTES = (20.0, 24.0)
#: NVIDIA's setup tool passes a pair at >= 21.875 GB/s and a three-node ring at >= 10 GB/s (NVIDIA/dgx-spark-playbooks).
PAIR_BUSBW_PASS_GBYTES = 21.875
RING_BUSBW_PASS_GBYTES = 10.0
#: "~3 GB/s regardless of buffer size" means one twin, TCP, or MTU 1500 (the nccl playbook's Troubleshooting).
SLOW_BUSBW_GBYTES = 3.5


def expected_busbw(topology: str, nodes: int) -> tuple[float, str]:
    """The bus bandwidth an NCCL all-reduce should reach, and where the figure comes from."""
    if topology == "ring" and nodes >= 3:
        return RING_BUSBW_PASS_GBYTES, "NVIDIA's setup tool passes a three-node ring at 10 GB/s"
    source = "NVIDIA's pair figure (20-24 GB/s, setup tool passes at 21.875)"
    if nodes > 2:
        source += f"; NVIDIA publishes none for {nodes} nodes, each node still has one 200G port"
    return PAIR_BUSBW_PASS_GBYTES, source
