"""sparkctl fabric bench on a bootstrapped pair: a per-link table (both twins, RDMA stand-ins over the veths, TCP
with real iperf3) and the NCCL all-reduce with the transport each rank used; a twin slowed with `tc ... tbf` in the
node's namespace is named with its cause, and doctor then reports the regression against the first bench."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from sparkctl.cli.json_schema import validate_line
from sparkctl.cli.main import cli
from tests.taskkit import doctor_report

pytestmark = pytest.mark.lab

SLOW_TWIN = "enP2p1s0f1np1"


@pytest.fixture(scope="module")
def lab(lab_factory, tmp_path_factory):
    lab = lab_factory(2, "pair", port=1)
    result = CliRunner().invoke(cli, ["cluster", "bootstrap", str(lab.inventory_path)], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    lab.state_home = str(tmp_path_factory.mktemp("bench-state"))  # the records of this module only
    return lab


def run(lab, *args: str):
    return CliRunner().invoke(cli, ["fabric", "bench", str(lab.inventory_path), *args],
                              env={"XDG_STATE_HOME": lab.state_home}, catch_exceptions=False)


def bench(lab, *args: str) -> dict:
    result = run(lab, "--json", *args)
    assert result.exit_code in (0, 1), result.output
    report = json.loads(result.stdout.splitlines()[-1])  # JSON Lines: the report is the last line
    validate_line(report)
    assert report["report"] == "fabric bench"
    return report


def test_table_and_nccl_figure_with_verdicts(lab):
    result = run(lab, "--nccl-max", "4M")
    assert result.exit_code in (0, 1), result.output
    out = result.stdout
    for twin in ("enp1s0f1np1", SLOW_TWIN):
        assert f"spark1 {twin} -> spark2 {twin}" in out
    assert "RDMA rocep1s0f1" in out and "RDMA roceP2p1s0f1" in out
    assert "NCCL all-reduce (2 ranks): bus bandwidth" in out
    assert "spark1: NET/IB with rocep1s0f1:1, roceP2p1s0f1:1" in out
    report = bench(lab, "--no-nccl")
    links = {link["key"]: link for link in report["links"]}
    assert len(links) == 2
    for link in links.values():
        assert link["method"] == "rdma" and link["gbps"] > 0 and link["latency_us"] > 0, link
        assert link["verdict"]["expected"] == 100.0 and "percent" in link["verdict"]
        # the lab's veths report 10000 Mb/s: the verdict says so, from the node's own figure
        assert "shaper" not in [c["cause"] for c in link["verdict"]["causes"]]


def test_tcp_with_real_iperf3(lab):
    report = bench(lab, "--no-nccl", "--tcp")
    assert {link["method"] for link in report["links"]} == {"tcp"}
    for link in report["links"]:
        assert link["gbps"] > 0 and link["why_not_rdma"] == "--tcp asked for TCP"
        assert "RoCE not in use" in link["summary"] or link["verdict"]["ok"]


def test_a_slowed_twin_is_named_with_its_cause_and_doctor_sees_the_regression(lab):
    spark1 = lab.nodes[0].name
    bench(lab, "--no-nccl")  # a healthy record to fall from (the module's other tests may have made some too)
    shaped = lab.exec(spark1, f"tc qdisc add dev {SLOW_TWIN} root tbf rate 200mbit burst 64kb latency 50ms")
    assert shaped.returncode == 0, shaped.stderr
    try:
        report = bench(lab, "--no-nccl")
        links = {link["client_if"]: link for link in report["links"]}
        slow, healthy = links[SLOW_TWIN], links["enp1s0f1np1"]
        assert slow["gbps"] < 0.3 < healthy["gbps"]
        assert not slow["verdict"]["ok"]
        first = slow["verdict"]["causes"][0]
        assert first["cause"] == "shaper" and f"spark1 {SLOW_TWIN}" in first["text"], slow["verdict"]
        assert "tbf" in first["evidence"] and "rate 200Mbit" in first["evidence"]
        assert slow["summary"].startswith("this link gives ")
        assert ("% of line rate (100 Gb/s per twin): a traffic shaper limits "
                f"spark1 {SLOW_TWIN} to 0.2 Gb/s") in slow["summary"]
        assert "shaper" not in [c["cause"] for c in healthy["verdict"]["causes"]]
        doctor = CliRunner().invoke(cli, ["doctor", str(lab.inventory_path), "--json"],
                                    env={"XDG_STATE_HOME": lab.state_home}, catch_exceptions=False)
        # the other twin's figure moves with the machine's load (the stand-in moves real bytes): only the shaped
        # twin's finding is certain
        findings = [f for f in doctor_report(doctor.stdout)["findings"] if f["id"] == "fabric.bandwidth_regression"
                    and f"spark1 {SLOW_TWIN} -> spark2 {SLOW_TWIN}" in f["summary"]]
        assert [f["node"] for f in findings] == ["spark1"], findings
        assert "a traffic shaper limits" in findings[0]["evidence"]
    finally:
        lab.exec(spark1, f"tc qdisc del dev {SLOW_TWIN} root")


def test_all_reduce_perf_missing_from_an_image_without_a_compiler_is_said_with_that_cause(lab):
    """NVIDIA's TensorRT-LLM images ship no nccl-tests: the bench builds it in the containers, and the lab image (no
    git, make, nvcc or MPI headers) cannot, which it says, naming what is missing, instead of crashing."""
    hide = "docker exec trtllm-multinode mv /usr/local/bin/all_reduce_perf /usr/local/bin/all_reduce_perf.hidden"
    for node in lab.nodes:
        assert lab.exec(node.name, hide).returncode == 0
    try:
        result = run(lab, "--no-links", "--no-record", "--json")
        assert result.exit_code == 1, result.output
        assert "Traceback" not in result.output
        report = json.loads(result.stdout.splitlines()[-1])
        error = report["nccl"]["error"]
        assert error.startswith("all_reduce_perf is not in the image, and "), error
        for node in lab.nodes:
            assert f"{node.name}: cannot build nccl-tests" in error, error
        assert "missing git, make, nvcc(" in error and "--all-reduce-perf PATH" in error
    finally:
        for node in lab.nodes:
            lab.exec(node.name, hide.replace("mv /usr/local/bin/all_reduce_perf /usr/local/bin/all_reduce_perf.hidden",
                                             "mv /usr/local/bin/all_reduce_perf.hidden /usr/local/bin/all_reduce_perf"))
