"""The live figures `sparkctl top` reads on a node, parsed from the formats the kernel and nvidia-smi print."""

from __future__ import annotations

import pytest

from sparkctl.knowledge.node_metrics import (
    CpuTimes,
    LinkCounters,
    link_rate,
    parse_gpu_query,
    parse_link_lines,
    parse_meminfo,
    parse_proc_stat,
)


def test_a_sparks_gpu_line_has_no_memory_figures():
    # nvidia-smi --query-gpu=utilization.gpu,memory.used,memory.total,temperature.gpu,power.draw
    #   --format=csv,noheader,nounits on a GB10 (unified memory: NVML has no framebuffer figures)
    sample = parse_gpu_query("87, [N/A], [N/A], 61, 48.32")
    assert sample is not None and (sample.util_pct, sample.temp_c, sample.power_w) == (87.0, 61.0, 48.32)
    assert sample.mem_used_mib is None and sample.mem_total_mib is None
    assert parse_gpu_query("12, 1024, 81920, 40, [Not Supported]").power_w is None
    assert parse_gpu_query("No devices were found") is None


def test_cpu_busy_share_between_two_readings_of_proc_stat():
    # proc(5): user nice system idle iowait irq softirq steal guest guest_nice (guest is inside user)
    before = parse_proc_stat("cpu  100 0 50 800 50 0 0 0 30 0\ncpu0 50 0 25 400 25 0 0 0 15 0\n")
    after = parse_proc_stat("cpu  250 0 100 900 50 0 0 0 90 0\n")
    assert before == CpuTimes(busy=150, total=1000) and after == CpuTimes(busy=350, total=1300)
    assert after.percent_since(before) == pytest.approx(200 / 300 * 100)
    assert before.percent_since(before) is None


def test_unified_memory_from_meminfo():
    mem = parse_meminfo("MemTotal:       124592388 kB\nMemFree:         1000000 kB\nMemAvailable:   100000000 kB\n")
    assert mem is not None and mem.used_kib == 24592388
    assert parse_meminfo("MemTotal: 1 kB\n") is None


def test_a_twin_with_a_roce_device_counts_its_port_words_and_others_their_netdev_bytes():
    text = ("netdev enp1s0f1np1 1000 2000 1 2 3 4\n"
            "netdev enP2p1s0f1np1 5000 6000 0 0 0 0\n"
            "roce enp1s0f1np1 250000 500000\n"   # port_rcv_data / port_xmit_data: 4-octet words
            "garbage line\n")
    links = parse_link_lines(text)
    assert links["enp1s0f1np1"] == LinkCounters(1_000_000, 2_000_000, errors=3, dropped=7, rdma=True)
    assert links["enP2p1s0f1np1"] == LinkCounters(5000, 6000, 0, 0, rdma=False)


def test_rates_in_gbps_and_new_errors_and_a_restarted_counter_is_no_rate():
    before = LinkCounters(0, 0, errors=1, dropped=0, rdma=True)
    now = LinkCounters(25_000_000_000, 12_500_000_000, errors=4, dropped=2, rdma=True)
    rate = link_rate(before, now, 2.0)
    assert rate is not None and (rate.rx_gbps, rate.tx_gbps, rate.new_errors, rate.new_drops) == (100.0, 50.0, 3, 2)
    assert link_rate(now, before, 2.0) is None and link_rate(before, now, 0) is None
