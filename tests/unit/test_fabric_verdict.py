"""Verdicts of `fabric bench`: pass, or the share of line rate with causes the evidence supports, in order."""

from __future__ import annotations

from pathlib import Path

import pytest

from sparkctl.knowledge.fabric_verdict import TwinEnd, judge_allreduce, judge_link, parse_shaper
from sparkctl.knowledge.nccl import parse_nccl_log

NCCL = Path(__file__).resolve().parent.parent / "fixtures" / "nccl-2.28.9"


def healthy(node: str, iface: str = "enp1s0f1np1") -> TwinEnd:
    return TwinEnd(node, iface, speed_mbps=200000, mtu=9000, pcie_width=4, pcie_max_width=4)


def test_a_healthy_twin_passes():
    verdict = judge_link(93.4, "rdma", [healthy("spark1"), healthy("spark2")])
    assert verdict.ok and verdict.percent == 93 and verdict.causes == []
    assert verdict.summary().startswith("pass")


def test_a_slow_twin_without_evidence_says_so():
    verdict = judge_link(47.0, "rdma", [healthy("spark1"), healthy("spark2")])
    assert not verdict.ok
    assert verdict.summary().startswith("this link gives 47% of line rate")
    assert "no cause shows" in verdict.summary()


def test_negotiated_100g_mtu_and_pcie_offered_only_where_seen():
    a = TwinEnd("spark1", "enP2p1s0f1np1", speed_mbps=100000, mtu=1500, pcie_width=2, pcie_max_width=4)
    verdict = judge_link(47.0, "rdma", [a, healthy("spark2", "enP2p1s0f1np1")])
    keys = [c.key for c in verdict.causes]
    assert set(keys) == {"speed", "mtu", "pcie"}
    # PCIe x2 caps a twin at 50 Gb/s: it explains 47, so it comes first; then the order
    assert keys == ["pcie", "speed", "mtu"]
    assert "spark1 enP2p1s0f1np1" in verdict.causes[0].text
    assert "current_link_width 2 of 4" in verdict.causes[0].evidence


def test_roce_not_in_use_only_for_tcp():
    ends = [healthy("spark1"), healthy("spark2")]
    assert [c.key for c in judge_link(30.0, "tcp", ends, tcp_reason="no RoCE device on spark2").causes] == ["roce"]
    assert judge_link(30.0, "rdma", ends).causes == []


def test_shaper_only_when_the_figure_sits_under_its_rate():
    line = "qdisc tbf 8001: root refcnt 2 rate 500Mbit burst 64Kb lat 50.0ms"
    text, gbps = parse_shaper(line)
    assert gbps == pytest.approx(0.5) and text == line
    shaped = TwinEnd("spark2", "enP2p1s0f1np1", speed_mbps=10000, mtu=9000, shaper=text, shaper_gbps=gbps)
    verdict = judge_link(0.48, "rdma", [healthy("spark1", "enP2p1s0f1np1"), shaped])
    assert [c.key for c in verdict.causes] == ["shaper", "speed"]
    assert "sudo tc qdisc del dev enP2p1s0f1np1 root" in verdict.causes[0].text
    # a kernel shaper the measurement did not feel (RoCE bypasses the kernel) is not a cause
    assert "shaper" not in [c.key for c in judge_link(40.0, "rdma", [healthy("spark1"), shaped]).causes]


@pytest.mark.parametrize("text, gbps", [("rate 1Gbit", 1.0), ("rate 2500Kbit", 0.0025), ("bandwidth 10Gbit", 10.0),
                                        ("qdisc noqueue 0: root refcnt 2", None), ("", None)])
def test_parse_shaper_units(text, gbps):
    found = parse_shaper(text)
    assert (found[1] if found else None) == (pytest.approx(gbps) if gbps is not None else None)


def test_allreduce_socket_fallback_and_hca():
    socket = parse_nccl_log((NCCL / "ib_hca_missing.log").read_text())
    ends = {"spark1": [healthy("spark1"), healthy("spark1", "enP2p1s0f1np1")]}
    verdict = judge_allreduce(3.0, "pair", 2, {"spark1": socket}, ends,
                              {"spark1": ["rocep1s0f1", "roceP2p1s0f1"]})
    assert not verdict.ok and [c.key for c in verdict.causes] == ["roce"]
    assert "NET/IB : No device found" in verdict.causes[0].evidence
    one_twin = parse_nccl_log("h:1:1 [0] NCCL INFO NCCL_IB_HCA set by environment to rocep1s0f1\n"
                              "h:1:1 [0] NCCL INFO NET/IB : Using [0]rocep1s0f1:1/RoCE [RO]; OOB enp1s0f1np1:"
                              "192.168.100.10<0>\nh:1:1 [0] NCCL INFO Using network IB\n")
    verdict = judge_allreduce(11.0, "pair", 2, {"spark1": one_twin}, ends,
                              {"spark1": ["rocep1s0f1", "roceP2p1s0f1"]})
    assert [c.key for c in verdict.causes] == ["hca"]
    assert "roceP2p1s0f1 missing from NCCL_IB_HCA on spark1" in verdict.causes[0].text
    assert judge_allreduce(23.1, "pair", 2, {"spark1": one_twin}, ends, {}).ok


def test_ring_expects_the_ring_figure():
    assert judge_allreduce(10.5, "ring", 3, {}, {}, {}).ok
    assert not judge_allreduce(10.5, "pair", 2, {}, {}, {}).ok
