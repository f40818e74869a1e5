"""`cluster status`: one row per node, with the container's spec match and hostfile match."""

from __future__ import annotations

from rich.console import Console

from sparkctl.cli.status_view import status_table
from sparkctl.facts import ContainerInfo
from sparkctl.plan import plan_cluster
from sparkctl.runs.status import container_hostfile as read_container_hostfile
from sparkctl.transport.base import CommandResult
from tests.taskkit import inventory_from_yaml, spark_facts

PAIR = """
user: nvidia
nodes: [{name: spark1, host: 10.0.0.11}, {name: spark2, host: 10.0.0.12}]
"""


class ExecOnly:
    def __init__(self, stdout: str, code: int = 0):
        self.stdout, self.code, self.calls = stdout, code, []

    def exec_in(self, container, cmd, timeout=60.0, input=None, env=None):
        self.calls.append((container, cmd))
        return CommandResult(cmd, self.code, self.stdout, "")


def render(table) -> str:
    console = Console(record=True, width=250, force_terminal=False)
    console.print(table)
    return console.export_text()


def test_rows_show_spec_and_hostfile_match_per_node(tmp_path):
    inv = inventory_from_yaml(PAIR, tmp_path)
    facts = {n: spark_facts(n) for n in ("spark1", "spark2")}
    plan = plan_cluster(inv, facts)
    hashes = {n: p.container.spec_hash() for n, p in plan.nodes.items()}
    facts["spark1"].containers["trtllm-multinode"] = ContainerInfo(
        name="trtllm-multinode", exists=True, running=True, status="running",
        labels={"sparkctl.spec": hashes["spark1"]})
    facts["spark2"].containers["trtllm-multinode"] = ContainerInfo(
        name="trtllm-multinode", exists=True, running=True, status="running", labels={"sparkctl.spec": "stale"})
    facts["spark1"].container_hostfile = plan.hostfile
    facts["spark2"].container_hostfile = "192.168.100.99\n"
    text = render(status_table(inv, facts, {}, hashes, plan.hostfile))
    spark1 = next(line for line in text.splitlines() if "spark1" in line)
    spark2 = next(line for line in text.splitlines() if "spark2" in line)
    assert "spec ok" in spark1 and "matches" in spark1
    assert "spec differs" in spark2 and "differs" in spark2.replace("spec differs", "")


def test_an_unreachable_node_has_its_reason(tmp_path):
    inv = inventory_from_yaml(PAIR, tmp_path)
    text = render(status_table(inv, {"spark1": spark_facts("spark1")}, {"spark2": "connection refused"}, {}))
    assert "connection refused" in next(line for line in text.splitlines() if "spark2" in line)


def test_hostfile_is_read_only_from_a_running_container(tmp_path):
    inv = inventory_from_yaml(PAIR, tmp_path)
    read = read_container_hostfile(inv)
    facts = spark_facts("spark1")
    transport = ExecOnly("192.168.100.10\n")
    read(transport, facts)
    assert facts.container_hostfile is None and transport.calls == []
    facts.containers["trtllm-multinode"] = ContainerInfo(name="trtllm-multinode", exists=True, running=True)
    read(transport, facts)
    assert facts.container_hostfile == "192.168.100.10\n"
    read(ExecOnly("", code=1), facts)
    assert facts.container_hostfile == ""
