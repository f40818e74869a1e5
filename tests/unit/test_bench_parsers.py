"""perftest, iperf3 and nccl-tests parsers on real captured outputs (tests/fixtures/*/README.md names each)."""

from __future__ import annotations

from pathlib import Path

import pytest

from sparkctl.knowledge.iperf3 import parse_iperf3_json
from sparkctl.knowledge.nccl_tests import parse_nccl_tests
from sparkctl.knowledge.perftest import parse_perftest

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"


def fixture(kind: str, name: str) -> str:
    return (FIXTURES / kind / name).read_text()


def test_roce_header_gid_and_link_type():
    report = parse_perftest(fixture("perftest", "write_bw_roce_gid3_server_header.txt"))
    assert report.test == "RDMA_Write BW"
    assert (report.device, report.link_type, report.gid_index, report.mtu, report.rdma_cm) == \
        ("mlx5_0", "Ethernet", 3, 4096, False)
    assert report.unit == "MB/sec"
    assert report.bw_rows == [] and report.bw_gbps is None  # the excerpt stops before the row


def test_gbits_row_with_tabs():
    report = parse_perftest(fixture("perftest", "write_bw_postlist_gbits.txt"))
    assert report.test == "RDMA_Write BW"
    assert report.unit == "Gb/sec"
    assert len(report.bw_rows) == 1
    row = report.bw_rows[0]
    assert (row.bytes, row.iterations, row.peak, row.average, row.msg_rate_mpps) == (8, 224958464, 0.0, 0.48, 7.498617)
    assert report.bw_gbps == pytest.approx(0.48)


def test_gbits_sweep_largest_size_wins():
    report = parse_perftest(fixture("perftest", "write_bw_ib_gbits_sweep.txt"))
    assert [r.bytes for r in report.bw_rows] == [2, 4, 8]
    assert report.bw_gbps == pytest.approx(0.17)
    assert report.link_type == "IB" and report.gid_index is None


def test_mb_per_sec_converted_and_latency_read():
    text = fixture("perftest", "write_bw_lat_mlx4_session.txt")
    bw_text, lat_text = text.split("ib_write_lat -a", 1)
    bw = parse_perftest(bw_text)
    assert bw.unit == "MB/sec" and len(bw.bw_rows) == 23
    assert bw.bw_gbps == pytest.approx(3662.02 * 8 / 1000)
    lat = parse_perftest(lat_text)
    assert lat.test is None or lat.test == "RDMA_Write Latency"
    assert len(lat.lat_rows) == 23
    first = lat.lat_rows[0]
    assert (first.bytes, first.iterations, first.t_min, first.t_typical, first.t_avg, first.p99, first.p999) == \
        (2, 20000, 0.88, 0.98, 1.03, 1.21, 5.42)
    assert lat.latency_us == pytest.approx(0.98)


def test_whole_session_keeps_both_tables():
    report = parse_perftest(fixture("perftest", "write_bw_lat_mlx4_session.txt"))
    assert len(report.bw_rows) == 23 and len(report.lat_rows) == 23
    assert report.device == "mlx4_0"


def test_latency_rows_with_tabs_and_blank_lines():
    report = parse_perftest(fixture("perftest", "write_lat_softroce_loopback_rows.txt"))
    assert [r.bytes for r in report.lat_rows] == [2, 4, 8]
    assert report.lat_rows[0].t_typical == pytest.approx(1.84)
    assert report.lat_rows[0].p999 == pytest.approx(9.65)


@pytest.mark.parametrize("name, error", [
    ("refused_no_device.txt", "Unable to find the Infiniband/RoCE device"),
    ("refused_unknown_option.txt", "Invalid Command or flag"),
])
def test_refusals_are_errors(name, error):
    report = parse_perftest(fixture("perftest", name))
    assert any(error in e for e in report.errors)
    assert report.bw_gbps is None


def test_iperf3_client_report():
    report = parse_iperf3_json(fixture("iperf3", "loopback_client.json"))
    assert report.error is None
    assert report.version == "iperf 3.12"
    assert report.received_gbps and report.received_gbps > 1
    assert report.gbps == report.received_gbps
    assert report.local == "127.0.0.1" and report.remote == "127.0.0.1"
    assert report.retransmits is not None


def test_iperf3_refused_and_garbage():
    report = parse_iperf3_json(fixture("iperf3", "refused_client.json"))
    assert report.error == "unable to connect to server: Connection refused"
    assert report.gbps is None
    broken = parse_iperf3_json("iperf3: error - unable to start listener for connections: Address already in use")
    assert broken.error and "Address already in use" in broken.error


def test_all_reduce_two_sparks():
    report = parse_nccl_tests(fixture("nccl-tests", "all_reduce_two_sparks_rows.txt"))
    assert report.version == "2.20.0" and report.collective == "all_reduce_perf"
    assert [(r.rank, r.host, r.name) for r in report.ranks] == [(0, "spark-d708", "NVIDIA GB10"),
                                                                 (1, "spark-dbf4", "NVIDIA GB10")]
    assert [r.size for r in report.rows] == [8192, 16384, 32768, 65536]
    assert report.rows[-1].oop_busbw == pytest.approx(0.96) and report.rows[-1].ip_busbw == pytest.approx(1.01)
    assert report.peak_busbw == pytest.approx(1.01)
    assert not report.completed  # no footer in the excerpt


def test_all_gather_two_sparks_16g():
    report = parse_nccl_tests(fixture("nccl-tests", "all_gather_two_sparks_16g.txt"))
    assert report.rows[0].size == 17179869184 and report.rows[0].redop == "none"
    assert report.peak_busbw == pytest.approx(20.95)
    assert report.out_of_bounds == 0
    assert report.ranks[0].host == "spark"


def test_footer_average_bus_bandwidth():
    report = parse_nccl_tests(fixture("nccl-tests", "broadcast_footer_rccl.txt"))
    assert report.avg_busbw == pytest.approx(3.41227) and report.completed
    assert report.peak_busbw == pytest.approx(7.18)


def test_older_layout_rows():
    report = parse_nccl_tests(fixture("nccl-tests", "all_reduce_tree_two_nodes.txt"))
    assert len(report.rows) == 5 and report.peak_busbw == pytest.approx(41.52)
