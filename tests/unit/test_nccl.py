"""The NCCL log parser on real NCCL 2.28.9 logs, plus IB lines in the form NCCL's
documentation quotes (docs.nvidia.com/deeplearning/nccl, Environment Variables and Troubleshooting)."""

from __future__ import annotations

from pathlib import Path

import pytest

from sparkctl.knowledge.nccl import (
    IbDevice,
    match_ib_hca,
    match_ifname,
    parse_ib_hca,
    parse_nccl_list,
    parse_nccl_log,
)

# Real NCCL 2.28.9 debug logs (the release DGX OS ships), copied from the team's shared fixtures.
LOGS = Path(__file__).resolve().parents[1] / "fixtures" / "nccl-2.28.9"


def log(name: str):
    path = LOGS / name
    if not path.exists():
        pytest.skip(f"{path} is not here")
    return parse_nccl_log(path.read_text())


def test_socket_lo_healthy_socket_run():
    r = log("socket_lo.log")
    assert r.nccl_version == "2.28.9+cuda13.0"
    assert r.env["NCCL_SOCKET_IFNAME"] == "lo" and r.env["NCCL_IB_DISABLE"] == "1"
    assert r.env["NCCL_P2P_DISABLE"] == "1" and r.env["NCCL_SHM_DISABLE"] == "1"
    assert r.socket_interfaces == [("lo", "127.0.0.1")]
    assert r.network == "Socket" and not r.uses_ib
    assert r.transports == {"NET/Socket/0": 8}  # 2 ranks x 2 channels x send+receive
    assert r.busbw_gbps == pytest.approx(4.03)
    assert r.warnings == [] and r.bootstrap_error is None
    assert not r.ib_no_device and not r.silent_tcp_fallback


def test_socket_exact_form():
    r = log("socket_exact.log")
    assert r.env["NCCL_SOCKET_IFNAME"] == "=lo"
    assert r.socket_interfaces == [("lo", "127.0.0.1")] and r.network == "Socket"
    assert match_ifname(r.env["NCCL_SOCKET_IFNAME"], ["lo", "lo2", "eth0"]) == ["lo"]


def test_socket_missing_interface_is_a_bootstrap_failure():
    r = log("socket_missing_if.log")
    assert r.env["NCCL_SOCKET_IFNAME"] == "enp1s0f1np1,enP2p1s0f1np1"
    assert r.bootstrap_error == "Bootstrap : no socket interface found"
    assert r.warnings == ["Bootstrap : no socket interface found"]
    assert r.network is None and r.socket_interfaces == [] and r.busbw_gbps is None
    assert match_ifname(r.env["NCCL_SOCKET_IFNAME"], ["lo", "eth0"]) == []


def test_ib_hca_missing_is_a_silent_tcp_fallback():
    r = log("ib_hca_missing.log")
    assert r.env["NCCL_IB_HCA"] == "rocep1s0f1,roceP2p1s0f1"
    assert r.ib_no_device and r.ib_devices == [] and r.ib_oob == ("lo", "127.0.0.1")
    assert r.network == "Socket" and r.silent_tcp_fallback
    assert r.warnings == []  # NCCL does not warn: that is the trap
    assert r.busbw_gbps == pytest.approx(3.93)


def test_default_p2p_uses_p2p_not_the_network():
    r = log("default_p2p.log")
    assert not r.silent_tcp_fallback  # no HCA asked for
    assert r.ib_no_device and r.network == "Socket"
    assert set(r.transports) == {"P2P/CUMEM"}
    assert r.busbw_gbps == pytest.approx(299.39)


SPARK_IB = """\
spark1:2101:2101 [0] NCCL INFO NCCL version 2.28.9+cuda13.0
spark1:2101:2101 [0] NCCL INFO NCCL_SOCKET_IFNAME set by environment to enp1s0f1np1,enP2p1s0f1np1
spark1:2101:2101 [0] NCCL INFO NCCL_IB_HCA set to rocep1s0f1,roceP2p1s0f1
spark1:2101:2101 [0] NCCL INFO NET/IB : Using [0]rocep1s0f1:1/RoCE [1]roceP2p1s0f1:1/RoCE [RO]; \
OOB enp1s0f1np1:192.168.100.10<0>
spark1:2101:2101 [0] NCCL INFO Using network IB
spark1:2101:2101 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[0] [send] via NET/IB/0
spark1:2101:2101 [0] NCCL INFO Channel 01/0 : 0[0] -> 1[0] [send] via NET/IB/1
spark1:2101:2101 [0] misc/socket.cc:50 NCCL WARN Net : Call to recv from 192.168.100.11<40211> failed
#  Avg bus bandwidth    : 21.9423
"""


def test_spark_ib_lines_in_the_quoted_form():
    r = parse_nccl_log(SPARK_IB)
    assert r.ib_devices == [IbDevice("rocep1s0f1", 1, "RoCE"), IbDevice("roceP2p1s0f1", 1, "RoCE")]
    assert r.ib_device_names == ["rocep1s0f1", "roceP2p1s0f1"]
    assert r.ib_oob == ("enp1s0f1np1", "192.168.100.10")
    assert r.network == "IB" and r.uses_ib and not r.silent_tcp_fallback
    assert r.transports == {"NET/IB/0": 1, "NET/IB/1": 1}
    assert r.warnings == ["Net : Call to recv from 192.168.100.11<40211> failed"]
    assert r.busbw_gbps == pytest.approx(21.9423)


def test_ib_disabled_is_not_a_fallback():
    r = parse_nccl_log("x [0] NCCL INFO NCCL_IB_HCA set to mlx5_0\nx [0] NCCL INFO NCCL_IB_DISABLE set by "
                       "environment to 1.\nx [0] NCCL INFO NET/IB : No device found.\n"
                       "x [0] NCCL INFO Using network Socket\n")
    assert r.env["NCCL_IB_DISABLE"] == "1" and not r.silent_tcp_fallback


SPARK_IFS = ["lo", "enP7s7", "enp1s0f0np0", "enP2p1s0f0np0", "enp1s0f1np1", "enP2p1s0f1np1", "docker0"]


@pytest.mark.parametrize(("spec", "selected"), [
    ("enp1s0f1np1,enP2p1s0f1np1", ["enp1s0f1np1", "enP2p1s0f1np1"]),
    ("enp", ["enp1s0f0np0", "enp1s0f1np1"]),  # prefixes, case-sensitive
    ("en", ["enP7s7", "enp1s0f0np0", "enP2p1s0f0np0", "enp1s0f1np1", "enP2p1s0f1np1"]),
    ("=enp1s0f1", []),  # exact: a prefix is not enough
    ("=enp1s0f1np1", ["enp1s0f1np1"]),
    ("^lo,docker,enP7", ["enp1s0f0np0", "enP2p1s0f0np0", "enp1s0f1np1", "enP2p1s0f1np1"]),
    ("^=enp1s0f1np1", ["lo", "enP7s7", "enp1s0f0np0", "enP2p1s0f0np0", "enP2p1s0f1np1", "docker0"]),
    ("=^lo", []),  # `^` only counts first, as in NCCL
    ("enp1s0f1np1,", ["enp1s0f1np1"]),  # an empty entry selects nothing extra
    ("", SPARK_IFS),
])
def test_match_ifname_nccl_semantics(spec, selected):
    assert match_ifname(spec, SPARK_IFS) == selected


def test_parse_ib_hca_and_matching_with_ports():
    assert parse_ib_hca("rocep1s0f1:1,roceP2p1s0f1") == [("rocep1s0f1", 1), ("roceP2p1s0f1", None)]
    assert parse_ib_hca("^=rocep1s0f0") == [("rocep1s0f0", None)]
    spec = parse_nccl_list("^=rocep1s0f0")
    assert spec.exclude and spec.exact
    devices = [("rocep1s0f0", 1), ("roceP2p1s0f0", 1), ("rocep1s0f1", 1), ("roceP2p1s0f1", 1)]
    assert match_ib_hca("rocep1s0f1,roceP2p1s0f1", devices) == [("rocep1s0f1", 1), ("roceP2p1s0f1", 1)]
    assert match_ib_hca("rocep1s0f1:2", devices) == []  # wrong port
    assert match_ib_hca("rocep1s0f1", devices) == [("rocep1s0f1", 1)]  # prefix, not roceP2...
    assert match_ib_hca("^rocep1s0f0,roceP2p1s0f0", devices) == [("rocep1s0f1", 1), ("roceP2p1s0f1", 1)]
    assert match_ib_hca("=rocep1s0f", devices) == []
    assert match_ib_hca("mlx5_0", devices) == []  # what makes NCCL fall back to TCP


def test_one_rank_on_sockets_is_the_world_s_network_whichever_rank_printed_first():
    """Each rank says which network it uses; one rank that fell back to sockets (its RoCE device not ready when it
    started) holds every all-reduce to socket speed, so the world is judged by that rank even when another rank's
    line comes first. The log is the real 2-rank one, the first rank's line given NCCL's IB spelling."""
    text = (LOGS / "socket_lo.log").read_text()
    first = next(line for line in text.splitlines() if "NCCL INFO Using network Socket" in line)
    mixed = text.replace(first, first.replace("Using network Socket", "Using network IB"))
    r = parse_nccl_log(mixed)
    assert r.networks == ["IB", "Socket"] and r.network == "Socket" and r.socket_ranks == 1
    assert parse_nccl_log(mixed.replace("Using network Socket", "Using network IB")).network == "IB"
