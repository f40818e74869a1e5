"""Recorded fabric benches: kept per cluster (the first for good), and a drop against the first or the last one is
a doctor finding naming the node, the link, then and now."""

from __future__ import annotations

from sparkctl.doctor.diagnose import run_checks
from sparkctl.knowledge.bench_history import regressions
from sparkctl.runs import bench_records
from tests.unit.test_doctor_checks import healthy_snapshot

LINK = "spark1 enP2p1s0f1np1 -> spark2 enP2p1s0f1np1"


def bench(time: str, gbps: float, busbw: float = 22.0) -> dict:
    return {"time": time, "nodes": ["spark1", "spark2"],
            "links": [{"key": LINK, "client": "spark1", "gbps": gbps, "summary": f"{gbps} Gb/s"},
                      {"key": "spark1 enp1s0f1np1 -> spark2 enp1s0f1np1", "client": "spark1", "gbps": 93.0}],
            "nccl": {"busbw": busbw, "summary": "ok"}}


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
