"""PURE RoCE checks: each planned twin's RoCE device is ACTIVE (`ibv_devinfo`) and has a RoCE v2 GID on the
twin's own IPv4 address (`show_gids`): without one NCCL cannot use that HCA and leaves the twin idle or falls back
to sockets."""

from __future__ import annotations

from sparkctl.doctor.catalog import ROCE_GID_MISSING, ROCE_PORT_INACTIVE
from sparkctl.doctor.findings import Finding, Phase, finding
from sparkctl.doctor.snapshot import Snapshot
from sparkctl.knowledge.spark import SPARK_ROCE

PHASE: Phase = "network"


def check_roce(s: Snapshot) -> list[Finding]:
    if s.inventory.topology == "single" or s.plan is None:
        return []
    out = []
    # a RoCE port follows its link: where either end of a twin's cable is not Up, the link's finding (on the end
    # that is down) is the cause, said once there; where the far end's node does not answer (powered off, its
    # cables dark), node.unreachable is
    far_down = {(node, link.interface) for node in s.order for link in s.plan.fabric.links(node)
                for peer, pif, _ in link.peers
                if peer in s.unreachable or (peer in s.facts and not s.facts[peer].interface_up(pif))}
    for node in s.order:
        f, system = s.facts[node], s.probe(node).system
        ports = s.plan.fabric.ports.get(node)
        if ports is None:
            continue
        planned = s.plan.fabric.addresses.get(node, {})
        for iface in ports.interfaces:
            if not f.interface_up(iface) or (node, iface) in far_down:
                continue  # the port's own finding (fabric.port_down) explains the rest
            roce = f.roce_for(iface)
            device = roce.device if roce else SPARK_ROCE.get(iface, "")
            if not device:
                continue
            hca = (system.hcas or {}).get(device)
            if system.hcas is not None and (hca is None or hca.state != "PORT_ACTIVE"):
                state = "not listed" if hca is None else hca.state or "no state"
                out.append(finding(ROCE_PORT_INACTIVE, node, f"RoCE device {device} ({iface}) is not active",
                                   evidence=f"ibv_devinfo: {device} port 1 {state} while {iface} is Up",
                                   fix=f"sudo ip link set {iface} down && sudo ip link set {iface} up; if it stays "
                                       "down, check `dmesg | grep mlx5` (a person must)"))
                continue
            address = planned.get(iface)
            if system.gids is None or address is None:
                continue
            if str(address) not in {str(a) for a in f.addresses_of(iface)}:
                continue  # the address itself is missing: fabric.address_missing says so
            v2 = [g for g in system.gids if g.device == device and g.version == "v2" and g.ipv4 == str(address.ip)]
            if not v2:
                have = [f"{g.index} {g.ipv4 or g.gid} {g.version}" for g in system.gids if g.device == device]
                out.append(finding(ROCE_GID_MISSING, node,
                                   f"no RoCE v2 GID for {address.ip} on {device}: NCCL cannot use this HCA",
                                   evidence=f"show_gids {device}: {'; '.join(have) or 'no GIDs'}; {iface} has "
                                            f"{address.ip}",
                                   fix=f"re-add the address so the kernel rebuilds the GID table: "
                                       f"sudo ip addr del {address} dev {iface} && sudo netplan apply"))
    return out


CHECKS = [check_roce]
