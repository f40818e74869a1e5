"""PURE plan of fabric bench: which links, in which rounds, and the command lines (quoted)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from sparkctl.plan import plan_cluster
from sparkctl.plan.bench import (
    BenchLink,
    all_reduce_script,
    bench_links,
    gid_of,
    parse_probe,
    perftest_line,
    probe_script,
    rounds,
)
from tests.taskkit import inventory

STANDINS = Path(__file__).resolve().parents[2] / "sparkctl" / "lab" / "standins"


def links_of(name: str) -> list[BenchLink]:
    inv = inventory(name)
    return bench_links(inv, plan_cluster(inv).fabric)


def test_pair_both_twins():
    links = links_of("two-sparks.yaml")
    assert [(lk.client, lk.client_if, lk.server, lk.server_if) for lk in links] == [
        ("spark1", "enp1s0f1np1", "spark2", "enp1s0f1np1"), ("spark1", "enP2p1s0f1np1", "spark2", "enP2p1s0f1np1")]
    # the twins of one port share it: two rounds
    assert [len(r) for r in rounds(links)] == [1, 1]


def test_ring_each_cable_and_disjoint_cables_in_parallel():
    links = links_of("three-sparks-ring.yaml")
    assert len(links) == 6
    for link in links:
        assert link.client_if.endswith("np0") and link.server_if.endswith("np1")  # port 0 to the next node's port 1
    assert max(len(r) for r in rounds(links)) >= 2
    for members in rounds(links):
        used = [p for link in members for p in link.ports()]
        assert len(used) == len(set(used))


def test_switch_head_and_a_ring_of_peers():
    links = links_of("four-sparks-switch.yaml")
    names = [n.name for n in inventory("four-sparks-switch.yaml").nodes]
    head = names[0]
    pairs = {(lk.client, lk.server) for lk in links}
    assert {(head, n) for n in names[1:]} <= pairs
    assert (names[1], names[2]) in pairs and (names[2], names[3]) in pairs
    assert len(pairs) == 5 and len(links) == 10
    assert all(len({p for link in r for p in link.ports()}) == 2 * len(r) for r in rounds(links))


def test_gid_and_probe():
    assert gid_of("192.168.100.10") == "0000:0000:0000:0000:0000:ffff:c0a8:640a"
    script = probe_script({"enp1s0f1np1": "192.168.100.10"})
    assert "gid_attrs/types" in script and "RoCE v2" in script and "c0a8:640a" in script
    probe = parse_probe("tool ib_write_bw\ntool iperf3\nenp1s0f1np1 width 2\nenp1s0f1np1 maxwidth 4\n"
                        "enp1s0f1np1 qdisc qdisc tbf 8001: root refcnt 2 rate 1Gbit burst 32Kb lat 50ms;\n"
                        "enp1s0f1np1 gid 3\nenP2p1s0f1np1 width \n")
    assert probe.tools == {"ib_write_bw", "iperf3"}
    assert (probe.width, probe.max_width, probe.gid) == ({"enp1s0f1np1": 2}, {"enp1s0f1np1": 4}, {"enp1s0f1np1": 3})
    assert "rate 1Gbit" in probe.qdisc["enp1s0f1np1"]


def test_command_lines():
    assert perftest_line("ib_write_bw", "rocep1s0f1", 3, 18515, "192.168.100.11") == \
        "ib_write_bw -d rocep1s0f1 -x 3 -p 18515 -F --report_gbits -D 2 192.168.100.11"
    assert perftest_line("ib_write_lat", "rocep1s0f1", None, 18516) == "ib_write_lat -d rocep1s0f1 -R -p 18516 -F"
    assert "'dev; rm -rf /'" in perftest_line("ib_write_bw", "dev; rm -rf /", None, 1)
    script = all_reduce_script(2, "1M", "8M")
    assert "-x NCCL_DEBUG=INFO" in script and "--map-by ppr:1:node" in script and "-b 1M -e 8M" in script


@pytest.mark.parametrize("argv, message", [
    (["--bogus"], "unrecognized option '--bogus'"),
    (["-d", "rocep9s9f9"], "IB device rocep9s9f9 not found"),
    (["-d"], "option requires an argument"),
    (["-p", "x", "-d", "rocep1s0f1"], "Invalid Command or flag"),
])
def test_the_perftest_standin_refuses_what_perftest_refuses(tmp_path, argv, message):
    (tmp_path / "class" / "net" / "enp1s0f1np1").mkdir(parents=True)
    result = subprocess.run(["python3", str(STANDINS / "node-bin" / "ib_write_bw"), *argv], capture_output=True,
                            text=True, env={"SPARKCTL_LAB_SYSFS": str(tmp_path), "PATH": "/usr/bin:/bin"}, timeout=30)
    assert result.returncode != 0 and message in result.stderr


def test_the_all_reduce_standin_refuses_an_unknown_option():
    result = subprocess.run(["python3", str(STANDINS / "image-bin" / "all_reduce_perf"), "-Q", "1"],
                            capture_output=True, text=True, timeout=30)
    assert result.returncode != 0 and "invalid option" in result.stdout
