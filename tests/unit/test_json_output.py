"""One CLI language: every command that reports accepts --json, prints one object per line that the published
schema (sparkctl/cli/json_schema.py, docs/events.schema.json) accepts, and ends with a line carrying the exit
status; -v, --limit and -o mean the same everywhere."""

from __future__ import annotations

import json
import re
import socket
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from sparkctl.cli.json_schema import events_json_schema
from sparkctl.cli.main import cli
from sparkctl.cli.report import VERBOSE_HELP
from tests.taskkit import json_lines

REPO = Path(__file__).resolve().parents[2]

#: Commands that do not report: they stream what a node or the server says (logs, chat), print a document
#: (schema), or act on the local lab.
NOT_REPORTS = {"serve logs", "serve chat", "inventory schema", "lab up", "lab down", "lab exec",
               "lab ssh", "lab image"}
#: Commands that pick nodes of an inventory.
PICK_NODES = {"cluster bootstrap", "cluster down", "cluster status", "doctor", "serve logs", "top"}
#: Commands that read an inventory but pick no nodes, and why --limit does not apply to them (README says so too).
NO_LIMIT = {
    "serve rollback": "it puts back what every node ran before: a part of the cluster would be half switched",
    "cluster plan": "offline: it plans the whole cluster and connects to nothing",
    "inventory validate": "offline: it checks the file",
    "serve status": "it asks the endpoint the serving head answers on",
    "serve chat": "it talks to the endpoint the serving head answers on",
    "serve bench": "it measures the endpoint the serving head answers on",
    "serve key": "the key is the endpoint's, and its gateway runs on the serving head alone",
    "serve stop": "it stops mpirun on the serving head, which takes the ranks down on every node of the launch, "
                  "then looks for leftover ranks on every node: stopping part of one TP/PP world is not a thing",
    "fabric bench": "it measures every cable and one all-reduce across every container: a part of the cluster would "
                    "record figures that are not this cluster's, and doctor and status compare with them",
}
#: Commands without -v/-vv: they print a fixed document (schema), or act on the local lab (up, down, image) or hand
#: a lab node the terminal (exec, ssh). Every other command connects or reports, and takes them.
NOT_VERBOSE = {"inventory schema", "lab up", "lab down", "lab image", "lab exec", "lab ssh"}


def commands(group: click.Group = cli, prefix: str = "") -> dict[str, click.Command]:
    """Every command, the lazily imported ones too (not only those an earlier test happened to load)."""
    out = {}
    ctx = click.Context(group)
    for name in group.list_commands(ctx):
        command = group.get_command(ctx, name)
        assert command is not None, name
        full = f"{prefix}{name}"
        if isinstance(command, click.Group):
            out.update(commands(command, full + " "))
        else:
            out[full] = command
    return out


def test_every_command_that_reports_accepts_json():
    missing = [name for name, command in commands().items()
               if name not in NOT_REPORTS and "as_json" not in {p.name for p in command.params}]
    assert missing == []


def test_verbose_and_limit_mean_the_same_everywhere():
    for name, command in commands().items():
        params = {p.name: p for p in command.params}
        assert ("verbose" in params) == (name not in NOT_VERBOSE), name
        if "verbose" in params:
            verbose = params["verbose"]
            assert verbose.count and verbose.opts == ["-v", "--verbose"] and verbose.help == VERBOSE_HELP, name
        if name in PICK_NODES:
            assert "--limit" in params["limit"].opts, name


def test_every_command_that_reads_an_inventory_picks_nodes_with_limit_or_says_why_not():
    for name, command in commands().items():
        params = {p.name for p in command.params}
        if "file" not in params:
            continue
        assert (name in PICK_NODES) != (name in NO_LIMIT), f"{name}: --limit, or the reason it has none"
        assert ("limit" in params) == (name in PICK_NODES), name


def test_the_published_schema_is_the_code_s():
    published = json.loads((REPO / "docs" / "events.schema.json").read_text())
    assert published == events_json_schema(), \
        "regenerate: python -m sparkctl.cli.json_schema > docs/events.schema.json"


@pytest.fixture
def refusing(tmp_path) -> str:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    path = tmp_path / "inv.yaml"
    path.write_text(f"""cluster: {{name: lab}}
user: nvidia
ssh: {{known_hosts: {tmp_path}/kh, use_ssh_config: false, connect_timeout: 2, port: {port}}}
nodes: [{{name: spark1, host: 127.0.0.1}}, {{name: spark2, host: 127.0.0.2}}]
fabric: {{topology: pair}}
serve: {{preset: qwen3-235b-eagle3}}
""")
    yield str(path)
    sock.close()


def run_json(tmp_path, *args: str) -> tuple[int, list[dict]]:
    env = {"HOME": str(tmp_path), "XDG_STATE_HOME": str(tmp_path / "state"), "COLUMNS": "200"}
    result = CliRunner().invoke(cli, [*args, "--json"], env=env, catch_exceptions=False)
    lines = json_lines(result.stdout)
    assert lines, result.output
    assert lines[-1]["exit_status"] == result.exit_code, lines[-1]
    return result.exit_code, lines


@pytest.mark.parametrize("args, code, last", [
    (["inventory", "validate", str(REPO / "inventories" / "two-sparks.yaml")], 0, "report"),
    (["inventory", "validate", str(REPO / "tests" / "fixtures" / "inventories" / "three-problems.yaml")], 2, "error"),
    (["cluster", "plan", str(REPO / "inventories" / "three-sparks-ring.yaml")], 0, "report"),
    (["serve", "presets"], 0, "report"),
    (["doctor", "--list"], 0, "report"),
    (["playbooks"], 0, "report"),
    (["lab", "status", "--dir", "/nonexistent-lab"], 2, "error"),
])
def test_offline_commands_print_schema_lines(tmp_path, args, code, last):
    exit_code, lines = run_json(tmp_path, *args)
    assert exit_code == code and lines[-1]["event"] == last


def test_an_inventory_error_is_an_error_line_with_every_problem(tmp_path):
    _, lines = run_json(tmp_path, "inventory", "validate",
                        str(REPO / "tests" / "fixtures" / "inventories" / "three-problems.yaml"))
    assert lines[-1]["message"] == "3 problems in the inventory; nothing was changed"
    assert len(lines[-1]["details"]) == 3 and all(":" in d for d in lines[-1]["details"])


def test_status_of_unreachable_nodes(tmp_path, refusing):
    code, lines = run_json(tmp_path, "cluster", "status", refusing)
    assert code == 3 and len(lines) == 1
    assert [(n["name"], n["reachable"]) for n in lines[0]["nodes"]] == [("spark1", False), ("spark2", False)]
    code, lines = run_json(tmp_path, "cluster", "status", refusing, "--limit", "spark2")
    assert [n["name"] for n in lines[0]["nodes"]] == ["spark2"]
    code, lines = run_json(tmp_path, "cluster", "status", refusing, "--limit", "nope")
    assert code == 2 and lines[-1]["event"] == "error" and "no node named nope" in lines[-1]["message"]


@pytest.mark.parametrize("args", [["cluster", "bootstrap"], ["cluster", "down"], ["cluster", "bootstrap", "--check"]])
def test_runs_print_run_start_to_recap(tmp_path, refusing, args):
    code, lines = run_json(tmp_path, *args[:2], refusing, *args[2:])
    assert code == 3
    start, recap = lines[0], lines[-1]
    assert start["event"] == "run_start" and start["cluster"] == "lab" and start["sparkctl"]
    assert start["command"] == ("bootstrap" if args[1] == "bootstrap" else "down")
    assert start["unreachable"] == {"spark1": "network", "spark2": "network"}
    unreachable = [line for line in lines if line.get("status") == "unreachable"]
    assert [u["task"] for u in unreachable] == ["connect", "connect"]
    assert recap["event"] == "recap"


def test_doctor_prints_findings_then_its_report(tmp_path, refusing):
    code, lines = run_json(tmp_path, "doctor", refusing)
    assert code == 1
    assert [line["event"] for line in lines] == ["finding", "finding", "report"]
    assert lines[-1]["report"] == "doctor" and lines[-1]["healthy"] is False and lines[-1]["errors"] == 2


def test_serve_status_and_stop_report_or_fail_as_lines(tmp_path, refusing):
    code, lines = run_json(tmp_path, "serve", "status", refusing)
    assert code == 1 and lines[-1]["report"] == "serve status" and lines[-1]["healthy"] is False
    code, lines = run_json(tmp_path, "serve", "stop", refusing)
    assert code == 3 and lines[-1]["event"] == "error" and "cannot stop the server" in lines[-1]["message"]


def test_output_dash_is_stdout_and_a_missing_folder_is_refused(tmp_path):
    result = CliRunner().invoke(cli, ["playbooks", "--markdown", "-o", "-"])
    assert result.exit_code == 0 and result.stdout.startswith("# sparkctl playbooks")
    assert not (Path.cwd() / "-").exists()
    result = CliRunner().invoke(cli, ["playbooks", "-o", str(tmp_path / "no" / "such" / "pb.md")])
    assert result.exit_code == 2 and "does not exist" in result.stderr and not (tmp_path / "no").exists()


def test_playbooks_markdown_is_not_the_plain_text():
    plain = CliRunner().invoke(cli, ["playbooks"], env={"COLUMNS": "100"}).stdout
    markdown = CliRunner().invoke(cli, ["playbooks", "--markdown"]).stdout
    assert plain != markdown and "#### `" in markdown and "####" not in plain
    assert "preflight.node [node]" in plain


@pytest.fixture
def local_inventory(tmp_path) -> str:
    path = tmp_path / "local.yaml"
    path.write_text(f"""cluster: {{name: here}}
user: nvidia
ssh: {{known_hosts: {tmp_path}/kh, use_ssh_config: false}}
nodes: [{{name: spark1, host: 127.0.0.1, local: true}}, {{name: spark2, host: 127.0.0.2}}]
""")
    return str(path)


def test_verbose_shows_the_commands_run_and_vv_their_output(tmp_path, local_inventory):
    """-v as in bootstrap: each command's first line, exit code and time; -vv also what it printed. On stderr:
    stdout stays what the command prints."""
    env = {"HOME": str(tmp_path), "XDG_STATE_HOME": str(tmp_path / "state"), "SPARKCTL_DEBUG": ""}
    plain = CliRunner().invoke(cli, ["serve", "logs", local_inventory], env=env)
    once = CliRunner().invoke(cli, ["serve", "logs", local_inventory, "-v"], env=env)
    twice = CliRunner().invoke(cli, ["serve", "logs", local_inventory, "-vv"], env=env)
    assert plain.exit_code == once.exit_code == twice.exit_code == 0, twice.output
    assert "printf %s" not in plain.stderr
    ran = [line for line in once.stderr.splitlines() if line.startswith("  spark1: ")]
    assert ran and all(re.search(r" -> \d+ \(\d+\.\d\ds\)$", line) for line in ran), once.stderr
    assert "  spark1: | " not in once.stderr
    assert f"  spark1: | {tmp_path}" in twice.stderr  # what `printf %s "$HOME"` printed
    assert once.stdout == plain.stdout == twice.stdout


def test_vv_shows_the_traceback_of_an_internal_error(monkeypatch):
    from sparkctl.cli import inventory_cmd

    def broken(_file, **_kwargs):
        raise RuntimeError("a bug")

    monkeypatch.setattr(inventory_cmd, "load", broken)
    env = {"SPARKCTL_DEBUG": ""}
    once = CliRunner().invoke(cli, ["inventory", "validate", "x.yaml", "-v"], env=env)
    twice = CliRunner().invoke(cli, ["inventory", "validate", "x.yaml", "-vv"], env=env)
    assert once.exit_code == twice.exit_code == 1
    assert "internal error: RuntimeError: a bug" in once.stderr and "Traceback" not in once.stderr
    assert "Traceback" in twice.stderr and "RuntimeError: a bug" in twice.stderr


def test_doctor_list_is_a_line_per_finding_id_then_a_report(tmp_path):
    from sparkctl.doctor.catalog import FINDINGS

    code, lines = run_json(tmp_path, "doctor", "--list")
    assert code == 0 and lines[-1]["report"] == "doctor --list" and lines[-1]["remedies"] == len(FINDINGS)
    remedies = {line["id"]: line for line in lines[:-1]}
    assert [line["event"] for line in lines[:-1]] == ["remedy"] * len(FINDINGS) and set(remedies) == set(FINDINGS)
    for finding_id, remedy in FINDINGS.items():
        assert remedies[finding_id]["about"] == remedy.about
        assert remedies[finding_id]["closed_by"] == remedy.closed_by
        if not remedy.tasks:
            assert remedy.kind in lines[-1]["kinds"]


def test_inventory_init_json_is_one_report_line(tmp_path, monkeypatch):
    from sparkctl.cli import inventory_cmd
    from sparkctl.runs.inventory_init import InitResult

    asked = {}

    def drafted(hosts, **kwargs):
        asked.update(hosts=hosts, **kwargs)
        return InitResult("cluster: {name: sparks}\n", assumptions=["topology pair: two nodes"],
                          seen=["spark1 port 1 -> spark2 port 1"])

    monkeypatch.setattr(inventory_cmd, "draft_inventory", drafted)
    out = tmp_path / "inv.yaml"
    code, lines = run_json(tmp_path, "inventory", "init", "10.0.0.11", "10.0.0.12", "-o", str(out))
    assert code == 0 and len(lines) == 1 and asked["hosts"] == ["10.0.0.11", "10.0.0.12"]
    assert lines[0]["event"] == "report" and lines[0]["report"] == "inventory init"
    assert lines[0]["output"] == str(out) and lines[0]["assumptions"] == ["topology pair: two nodes"]
    assert lines[0]["seen_with_lldp"] == ["spark1 port 1 -> spark2 port 1"]
    assert out.read_text() == "cluster: {name: sparks}\n"


@pytest.fixture
def served(tmp_path):
    from tests.unit.fake_endpoint import FakeEndpoint

    fake = FakeEndpoint()
    path = tmp_path / "served.yaml"
    path.write_text(f"""cluster: {{name: lab}}
user: nvidia
ssh: {{known_hosts: {tmp_path}/kh, use_ssh_config: false}}
nodes: [{{name: spark1, host: 127.0.0.1}}, {{name: spark2, host: 127.0.0.2}}]
serve: {{preset: qwen3-235b-eagle3, port: {fake.port}}}
""")
    yield str(path)
    fake.close()


def test_serve_bench_json_is_one_report_line_and_the_file_holds_the_same(tmp_path, served):
    out = tmp_path / "bench.json"
    code, lines = run_json(tmp_path, "serve", "bench", served, "--concurrency", "1,2", "--requests", "2",
                           "--max-tokens", "8", "-o", str(out))
    assert code == 0 and len(lines) == 1 and lines[0]["report"] == "serve bench"
    report = lines[0]
    assert [level["concurrency"] for level in report["levels"]] == [1, 2]
    assert all(level["failed"] == 0 for level in report["levels"]) and report["output"] == str(out)
    written = json.loads(out.read_text())
    assert written["levels"] == report["levels"] and written["endpoint"] == report["endpoint"]
    result = CliRunner().invoke(cli, ["serve", "bench", served, "-o", "-", "--json"])
    assert result.exit_code == 2 and "both want stdout" in result.stderr


def test_serve_bench_records_with_the_cluster_s_records_and_writes_a_file_only_where_asked(tmp_path, served,
                                                                                            monkeypatch):
    where = tmp_path / "cwd"
    where.mkdir()
    monkeypatch.chdir(where)
    code, lines = run_json(tmp_path, "serve", "bench", served, "--concurrency", "1", "--requests", "1",
                           "--max-tokens", "4")
    assert code == 0 and lines[-1]["output"] is None and list(where.iterdir()) == []
    recorded = Path(lines[-1]["recorded"])
    assert recorded.parent == tmp_path / "state" / "sparkctl" / "serve-bench" / "lab"
    kept = json.loads(recorded.read_text())
    assert kept["levels"] == lines[-1]["levels"] and kept["engine"] == "trtllm" and kept["time"]


BENCH_RESULT = {
    "cluster": "lab", "time": "2026-11-26T19:00:00Z", "topology": "pair", "nodes": ["spark1", "spark2"],
    "unreachable": {}, "nccl": None, "recorded": None,
    "links": [{"key": f"spark1 enp1s0f{i}np{i} -> spark2 enp1s0f{i}np{i}", "method": "rdma",
               "device": f"rocep1s0f{i}", "gbps": 98.7, "latency_us": 1.9, "verdict": {"ok": False},
               "summary": "this link gives 47% of line rate: the far end negotiated 100G, a Spark's port does 200G"}
              for i in (0, 1)],
}


@pytest.fixture
def tables(tmp_path, monkeypatch, served):
    """The commands that print a table, each with what must appear whole in it."""
    from sparkctl.cli import fabric_cmd

    monkeypatch.setattr(fabric_cmd, "fabric_bench", lambda *_args, **_kwargs: BENCH_RESULT)
    return {
        "serve presets": (["serve", "presets"], "nvidia/Qwen3-235B-A22B-FP4"),
        "fabric bench": (["fabric", "bench", str(REPO / "inventories" / "two-sparks.yaml"), "--no-record"],
                         BENCH_RESULT["links"][0]["summary"]),
        "serve bench": (["serve", "bench", served, "--requests", "1", "--concurrency", "1",
                         "-o", str(tmp_path / "b.json")], "decode tok/s/req"),
    }


@pytest.mark.parametrize("name", ["serve presets", "fabric bench", "serve bench"])
def test_tables_fit_columns_and_stay_whole_in_a_pipe(tmp_path, tables, name):
    args, whole = tables[name]
    env = {"HOME": str(tmp_path), "XDG_STATE_HOME": str(tmp_path / "state")}
    narrow = CliRunner().invoke(cli, args, env={**env, "COLUMNS": "70"})
    assert narrow.exit_code in (0, 1), narrow.output
    assert narrow.stdout and max(len(line) for line in narrow.stdout.splitlines()) <= 70, narrow.stdout
    piped = CliRunner().invoke(cli, args, env={**env, "COLUMNS": ""})  # CliRunner's stdout is no terminal
    assert piped.exit_code == narrow.exit_code, piped.output
    assert any(whole in line for line in piped.stdout.splitlines()), piped.stdout
    assert not any(ch in piped.stdout for ch in "│┃━─"), piped.stdout  # plain columns, no box to cut
