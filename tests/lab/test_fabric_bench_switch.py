"""sparkctl fabric bench on a bootstrapped switch of four: each node to the head and a ring of peers, both twins,
links that share a port measured in different rounds, and an NCCL all-reduce over four ranks."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner
from rich.console import Console

from sparkctl.cli.fabric_cmd import bench_table, nccl_lines
from sparkctl.cli.json_schema import validate_line
from sparkctl.cli.main import cli

pytestmark = pytest.mark.lab


@pytest.fixture(scope="module")
def report(lab_factory, tmp_path_factory):
    lab = lab_factory(4, "switch", port=1)
    result = CliRunner().invoke(cli, ["cluster", "bootstrap", str(lab.inventory_path)], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    state = str(tmp_path_factory.mktemp("bench-state"))
    result = CliRunner().invoke(cli, ["fabric", "bench", str(lab.inventory_path), "--json", "--nccl-max", "2M"],
                                env={"XDG_STATE_HOME": state}, catch_exceptions=False)
    assert result.exit_code in (0, 1), result.output
    report = json.loads(result.stdout.splitlines()[-1])  # JSON Lines: the report is the last line
    validate_line(report)
    assert report["report"] == "fabric bench"
    return report


def test_head_and_ring_of_peers_both_twins(report):
    pairs = {(link["client"], link["server"]) for link in report["links"]}
    assert pairs == {("spark1", "spark2"), ("spark1", "spark3"), ("spark1", "spark4"), ("spark2", "spark3"),
                     ("spark3", "spark4")}
    assert len(report["links"]) == 10
    for link in report["links"]:
        assert link["client_if"] == link["server_if"]
        assert link["method"] == "rdma" and link["gbps"] > 0 and link["latency_us"] > 0, link
        assert link["summary"]


def test_nccl_over_four_ranks_with_the_transport_of_each(report):
    nccl = report["nccl"]
    assert nccl["ranks"] == 4 and nccl["busbw"] is not None and nccl["busbw"] > 0, nccl
    assert set(nccl["transport"]) == {"spark1", "spark2", "spark3", "spark4"}
    for used in nccl["transport"].values():
        assert used["network"] == "IB" and used["ib_devices"] == ["rocep1s0f1:1", "roceP2p1s0f1:1"], used
    assert nccl["verdict"]["expected"] == 21.875
    assert "NVIDIA publishes none for 4 nodes" in nccl["verdict"]["basis"]


def test_the_table_shows_every_link_and_the_nccl_figure(report):
    console = Console(record=True, width=220)
    console.print(bench_table(report))
    for line in nccl_lines(report["nccl"]):
        console.print(line)
    text = console.export_text()
    assert "spark3 enP2p1s0f1np1 -> spark4 enP2p1s0f1np1" in text
    assert "NCCL all-reduce (4 ranks): bus bandwidth" in text
    assert "spark4: NET/IB with rocep1s0f1:1, roceP2p1s0f1:1" in text
