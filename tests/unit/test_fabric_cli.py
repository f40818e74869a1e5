"""`sparkctl fabric bench` refuses bad input with one line and exit 2, before connecting to anything."""

from __future__ import annotations

from click.testing import CliRunner

from sparkctl.cli.main import cli
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
