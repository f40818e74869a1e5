"""`sparkctl fabric bench` refuses bad input with one line and exit 2, before connecting to anything; a node that
does not answer is exit 3, as for the other commands."""

from __future__ import annotations

from click.testing import CliRunner

from sparkctl.cli.fabric_cmd import bench_status
from sparkctl.cli.main import cli
from sparkctl.exitcodes import ExitStatus
from sparkctl.runs import fabric_bench
from tests.taskkit import REPO


def run(*args: str):
    return CliRunner().invoke(cli, ["fabric", "bench", *args])


def test_a_single_spark_has_no_link():
    result = run(str(REPO / "inventories" / "single-spark.yaml"))
    assert result.exit_code == 2
    assert "fabric bench needs two or more nodes" in result.output and "Traceback" not in result.output


def test_bad_sizes_and_paths():
    pair = str(REPO / "inventories" / "two-sparks.yaml")
    assert run(pair, "--nccl-max", "lots").exit_code == 2
    result = run(pair, "--all-reduce-perf", "relative/all_reduce_perf")
    assert result.exit_code == 2 and "absolute path" in result.output
    assert run(pair, "--all-reduce-perf", "/opt/$(reboot)").exit_code == 2


class NobodyAnswers:
    def __init__(self, inventory, forks=32):
        self.unreachable = {n.name: f"{n.name}: no answer on port 22 within 5s" for n in inventory.nodes}
        self.unreachable_kinds = {n.name: "network" for n in inventory.nodes}

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return None

    def gather(self):
        return {}


def test_no_node_answering_is_exit_3_naming_each_node(monkeypatch):
    monkeypatch.setattr(fabric_bench, "Session", NobodyAnswers)
    result = run(str(REPO / "inventories" / "two-sparks.yaml"), "--no-record")
    assert result.exit_code == 3, result.output
    assert "answered: nothing measured" in result.output and "Traceback" not in result.output
    assert "spark1: no answer on port 22" in result.output and "spark2: no answer on port 22" in result.output


def test_a_node_unreachable_is_exit_3_unless_something_measured_failed():
    ok = {"verdict": {"ok": True}}
    skipped = {"error": "spark2 did not answer", "unreachable": ["spark2"], "busbw": None}
    assert bench_status({"links": [ok], "nccl": ok, "unreachable": {}}) == ExitStatus.SUCCESS
    assert bench_status({"links": [ok], "nccl": skipped, "unreachable": {"spark2": "x"}}) == ExitStatus.UNREACHABLE
    assert bench_status({"links": [], "nccl": None, "unreachable": {"spark2": "x"}}) == ExitStatus.UNREACHABLE
    slow = {"verdict": {"ok": False}}
    assert bench_status({"links": [slow], "nccl": skipped, "unreachable": {"spark2": "x"}}) == ExitStatus.TASK_FAILED


def test_the_all_reduce_is_not_run_on_fewer_nodes_than_the_cluster():
    from sparkctl.cli.options import load

    inventory = load(str(REPO / "inventories" / "two-sparks.yaml"))
    said = []
    run_ = fabric_bench.BenchRun(inventory, None, {"spark1": object()}, None, fabric_bench.BenchRequest(), said.append)
    out = run_.all_reduce()
    assert out["busbw"] is None and out["unreachable"] == ["spark2"]
    assert "spark2 did not answer: the all-reduce needs every node" in out["error"] and said
