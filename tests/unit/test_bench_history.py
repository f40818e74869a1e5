"""Recorded fabric benches: kept per cluster (the first for good), and a drop against the first or the last one is
a doctor finding naming the node, the link, then and now."""

from __future__ import annotations

from sparkctl.doctor.diagnose import run_checks
from sparkctl.knowledge.bench_history import incomparable, regressions
from sparkctl.plan.bench import nccl_settings
from sparkctl.runs import bench_records
from tests.unit.bench_kit import LINK, bench
from tests.unit.doctor_snapshot_kit import healthy_snapshot


def test_no_regression_within_noise_or_without_history():
    assert regressions([bench("t2", 90.0)]) == []
    assert regressions([bench("t2", 85.0), bench("t1", 93.0)]) == []


def test_a_link_slower_than_at_the_first_bench():
    found = regressions([bench("t3", 45.0), bench("t2", 60.0), bench("t1", 93.0)])
    assert [(r.subject, r.node, r.reference, r.then_time) for r in found] == [(LINK, "spark1", "first bench", "t1")]
    assert found[0].percent_lower == 52
    assert "45 Gb/s now, 93 Gb/s at the first bench (t1): 52% slower" in found[0].line()


def test_the_nccl_figure_too():
    found = regressions([bench("t2", 93.0, busbw=3.0), bench("t1", 93.0, busbw=22.0)])
    assert [(r.subject, r.unit) for r in found] == [("NCCL all-reduce", "GB/s")]


def test_doctor_reports_it_on_the_client_node():
    s = healthy_snapshot()
    s.bench_history = [bench("t2", 40.0), bench("t1", 93.0)]
    found = [f for f in run_checks(s).findings if f.id == "fabric.bandwidth_regression"]
    assert [(f.node, f.severity) for f in found] == [("spark1", "warning")]
    assert LINK in found[0].summary and "57% slower than at the first bench (t1)" in found[0].summary
    assert "40 Gb/s" in found[0].evidence and "93 Gb/s" in found[0].evidence
    assert "sparkctl fabric bench" in found[0].fix
    s.bench_history = [bench("t2", 92.0), bench("t1", 93.0)]
    assert not [f for f in run_checks(s).findings if f.id == "fabric.bandwidth_regression"]


def test_records_keep_the_first_and_the_newest(tmp_path, monkeypatch):
    monkeypatch.setattr(bench_records, "KEEP", 3)
    for i in range(6):
        bench_records.record_bench("lab-x", {"time": f"t{i}"}, base=tmp_path)
    history = bench_records.bench_history("lab-x", base=tmp_path)
    assert [h["time"] for h in history] == ["t5", "t4", "t3", "t0"]
    assert bench_records.bench_history("other", base=tmp_path) == []
    assert oct((tmp_path / "lab-x").stat().st_mode & 0o777) == "0o700"


def test_status_lines():
    from sparkctl.cli.status_view import bench_lines

    assert bench_lines([])[0].startswith("fabric bench: never run")
    lines = bench_lines([bench("t2", 40.0), bench("t1", 93.0)])
    assert lines[0].startswith("fabric bench t2: 2 link(s)")
    assert lines[1] == (f"slower than at the first bench: {LINK}: 40 Gb/s now, 93 Gb/s at the first bench (t1): "
                        "57% slower")
    assert bench_lines([bench("t2", 92.0), bench("t1", 93.0)])[-1].endswith("no slower than at the first bench")


def test_a_tcp_run_is_not_compared_with_an_rdma_one():
    # iperf3 over the same cable gives far less than ib_write_bw: that is the method, not a regression
    history = [bench("t2", 34.0, method="tcp"), bench("t1", 93.0)]
    assert regressions(history) == []
    unlike = incomparable(history)
    assert len(unlike) == 2 and unlike[0].startswith(f"{LINK}: no earlier bench measured it the same way")
    assert "now: tcp, seconds 3, tool iperf3" in unlike[0] and "before: rdma, seconds 2, tool ib_write_bw" in unlike[0]


def test_the_baseline_is_the_first_comparable_record():
    history = [bench("t4", 20.0, method="tcp"), bench("t3", 93.0), bench("t2", 34.0, method="tcp"),
               bench("t1", 92.0)]
    found = regressions(history)
    assert [(r.subject, r.reference, r.then_time, r.then) for r in found] == [(LINK, "first bench", "t2", 34.0)]
    assert "tcp" in found[0].how
    # and the last comparable one, when it is the further fall
    history = [bench("t4", 40.0), bench("t3", 90.0, method="tcp"), bench("t2", 93.0), bench("t1", 60.0)]
    assert [(r.reference, r.then_time) for r in regressions(history)] == [("last bench", "t2")]


def test_nccl_over_other_message_sizes_is_not_compared():
    history = [bench("t2", 93.0, busbw=8.0, nccl_max=2 << 20), bench("t1", 93.0, busbw=22.0)]
    assert regressions(history) == []
    assert [line.split(":")[0] for line in incomparable(history)] == ["NCCL all-reduce"]
    history = [bench("t3", 93.0, busbw=8.0, nccl_max=2 << 20), bench("t2", 93.0, busbw=22.0),
               bench("t1", 93.0, busbw=15.0, nccl_max=2 << 20)]
    assert [(r.subject, r.then_time) for r in regressions(history)] == [("NCCL all-reduce", "t1")]
    assert nccl_settings("1M", "2M", ["a"]) == nccl_settings("1048576", "2097152", ["a"])


def test_records_that_do_not_say_how_they_measured_compare_with_nothing():
    legacy = {"time": "t1", "nodes": ["spark1", "spark2"],
              "links": [{"key": LINK, "client": "spark1", "gbps": 93.0, "method": "rdma"}], "nccl": {"busbw": 22.0}}
    history = [bench("t2", 30.0), legacy]
    assert regressions(history) == []
    assert any("before: not recorded" in line for line in incomparable(history))


def test_records_keep_the_first_of_each_way_of_measuring(tmp_path, monkeypatch):
    monkeypatch.setattr(bench_records, "KEEP", 2)
    for i, method in enumerate(["rdma", "rdma", "tcp", "rdma", "tcp", "rdma", "rdma"]):
        bench_records.record_bench("lab-y", bench(f"t{i}", 90.0, method=method), base=tmp_path)
    history = bench_records.bench_history("lab-y", base=tmp_path)
    assert [h["time"] for h in history] == ["t6", "t5", "t2", "t0"]


def test_status_says_when_nothing_is_comparable():
    from sparkctl.cli.status_view import bench_lines

    lines = bench_lines([bench("t2", 34.0, method="tcp", nccl_max=2 << 20), bench("t1", 93.0)])
    assert "no slower" not in lines[0] and "slower than" not in " ".join(lines)
    assert lines[1].startswith(f"nothing to compare with: {LINK}: no earlier bench measured it the same way")
    assert lines[-1].startswith("nothing to compare with: NCCL all-reduce: ")
