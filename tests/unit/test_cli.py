"""The `sparkctl` command through click's CliRunner: exit codes, one line per problem, JSON where promised."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest
from click.testing import CliRunner

from sparkctl import __version__
from sparkctl.cli.main import cli
from sparkctl.exitcodes import ExitStatus
from sparkctl.runs.playbooks import playbooks_markdown

REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "tests" / "fixtures" / "inventories"


@pytest.fixture
def run(tmp_path):
    """Invoke sparkctl with HOME and the journal directory inside tmp_path."""
    env = {"HOME": str(tmp_path), "XDG_STATE_HOME": str(tmp_path / "state"), "SPARKCTL_DEBUG": ""}

    def invoke(*args: str):
        return CliRunner().invoke(cli, list(args), env=env, catch_exceptions=False)

    return invoke


@pytest.fixture
def closed_port():
    """A TCP port nothing listens on: bound (so nobody else takes it) but never listening."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("0.0.0.0", 0))
    yield sock.getsockname()[1]
    sock.close()


@pytest.fixture
def unreachable_inventory(tmp_path, closed_port) -> str:
    path = tmp_path / "unreachable.yaml"
    path.write_text(f"""\
cluster: {{name: nowhere}}
user: nobody
ssh: {{port: {closed_port}, known_hosts: {tmp_path}/known_hosts, use_ssh_config: false, connect_timeout: 3}}
nodes:
  - {{name: spark1, host: 127.0.0.1}}
  - {{name: spark2, host: 127.0.0.2}}
""")
    return str(path)


def test_version(run):
    result = run("--version")
    assert result.exit_code == 0
    assert result.stdout == f"sparkctl, version {__version__}\n"


def test_inventory_validate_ok(run):
    result = run("inventory", "validate", str(REPO / "inventories" / "two-sparks.yaml"))
    assert result.exit_code == 0, result.output
    assert "ok — cluster spark-pair, 2 node(s), topology pair, head spark1, tp_size 2" in result.stdout


def test_inventory_validate_bad_one_line_per_problem(run):
    path = str(FIXTURES / "three-problems.yaml")
    result = run("inventory", "validate", path)
    assert result.exit_code == ExitStatus.BAD_INPUT == 2
    lines = result.stderr.splitlines()
    assert len(lines) == 4
    assert all(line.startswith(f"{path}:") for line in lines[:3])
    assert [line.split(":")[1] for line in lines[:3]] == ["8", "10", "13"]  # file:LINE, in file order
    assert lines[3] == "sparkctl: 3 problems in the inventory; nothing was changed"
    assert "Traceback" not in result.output and result.stdout == ""


@pytest.mark.parametrize("name", ["yaml-syntax-error.yaml", "not-a-mapping.yaml", "does-not-exist.yaml"])
def test_inventory_validate_unreadable_inputs_exit_2_without_traceback(run, name):
    result = run("inventory", "validate", str(FIXTURES / name))
    assert result.exit_code == 2
    assert result.stderr.splitlines()[-1] == "sparkctl: 1 problem in the inventory; nothing was changed"
    assert "Traceback" not in result.output


def test_debug_shows_the_traceback(run):
    result = run("--debug", "inventory", "validate", str(FIXTURES / "not-a-mapping.yaml"))
    assert result.exit_code == 2
    assert "Traceback" in result.stderr and "InventoryError" in result.stderr


def test_inventory_schema_is_json(run):
    result = run("inventory", "schema")
    assert result.exit_code == 0
    schema = json.loads(result.stdout)
    assert schema["type"] == "object" and {"nodes", "user", "fabric"} <= set(schema["properties"])


def test_cluster_plan(run):
    result = run("cluster", "plan", str(REPO / "inventories" / "two-sparks.yaml"))
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith("cluster spark-pair: 2 node(s), topology pair, head spark1\n")
    assert result.stdout.count("--- /etc/netplan/40-cx7.yaml (mode 600)") == 2


@pytest.mark.parametrize("inventory", sorted(p.name for p in (REPO / "inventories").glob("*.yaml")))
def test_cluster_plan_every_example(run, inventory):
    result = run("cluster", "plan", str(REPO / "inventories" / inventory))
    assert result.exit_code == 0, result.output


def test_cluster_plan_bad_inventory_exits_2(run):
    result = run("cluster", "plan", str(FIXTURES / "three-problems.yaml"))
    assert result.exit_code == 2 and result.stdout == ""


def test_playbooks_output_file(run, tmp_path):
    out = tmp_path / "pb.md"
    assert run("playbooks", "--markdown", "-o", str(out)).exit_code == 0
    assert out.read_text() == playbooks_markdown()


def test_bootstrap_unreachable_exits_3_with_a_recap(run, unreachable_inventory, closed_port):
    result = run("cluster", "bootstrap", unreachable_inventory)
    assert result.exit_code == ExitStatus.UNREACHABLE == 3, result.output
    assert "RECAP" in result.stdout
    assert f"spark1 (127.0.0.1): connection refused on port {closed_port}" in result.stdout
    assert "UNREACHABLE" in result.stdout and "Traceback" not in result.output


def test_bootstrap_json_last_line_is_the_recap(run, unreachable_inventory, tmp_path):
    result = run("cluster", "bootstrap", unreachable_inventory, "--json")
    assert result.exit_code == 3
    events = [json.loads(line) for line in result.stdout.splitlines()]
    assert events[0]["event"] == "run_start"
    recap = events[-1]
    assert recap["event"] == "recap" and recap["exit_status"] == 3
    assert recap["nodes"]["spark1"]["unreachable"] == 1 and recap["nodes"]["spark2"]["unreachable"] == 1
    assert sum(e["event"] == "recap" for e in events) == 1
    # the same events reached the run journal
    journals = list((tmp_path / "state" / "sparkctl" / "runs" / "nowhere").glob("*-bootstrap.jsonl"))
    assert len(journals) == 1
    assert json.loads(journals[0].read_text().splitlines()[-1])["event"] == "recap"


def test_a_port_that_closes_connections_is_one_line_per_node_without_traceback(run, tmp_path):
    """A lab that is down behind a gateway: the port accepts and closes. Not a traceback per node, not
    'timed out' for a run that took half a second."""
    servers = []
    for _ in range(3):
        server = socket.socket()
        server.bind(("127.0.0.1", 0))
        server.listen()
        servers.append(server)

    def serve(server):
        while True:
            try:
                server.accept()[0].close()
            except OSError:
                return

    import threading

    for server in servers:
        threading.Thread(target=serve, args=(server,), daemon=True).start()
    path = tmp_path / "closing.yaml"
    ports = [s.getsockname()[1] for s in servers]
    nodes = "\n".join(f"  - {{name: spark{i + 1}, host: 127.0.0.1, port: {p}}}" for i, p in enumerate(ports))
    path.write_text(f"cluster: {{name: down}}\nuser: nobody\nssh: {{known_hosts: {tmp_path}/kh, "
                    f"use_ssh_config: false}}\nfabric: {{topology: ring}}\nnodes:\n{nodes}\n")
    try:
        result = run("cluster", "bootstrap", str(path))
    finally:
        for server in servers:
            server.close()
    assert result.exit_code == ExitStatus.UNREACHABLE, result.output
    assert "Traceback" not in result.output and "protocol banner" not in result.output
    assert "timed out" not in result.output
    lines = [line for line in result.stdout.splitlines() if line.startswith("unreachable")]
    assert len(lines) == 3
    for i, port in enumerate(ports):
        assert (f"port {port} on spark{i + 1} (127.0.0.1) accepted and closed the connection: "
                "is it an SSH server, is the lab down?") in result.stdout


@pytest.mark.parametrize("args, expected", [
    (["--only", "netwrk"], "unknown task or phase 'netwrk' (did you mean 'network'?)"),
    (["--check", "--skip", "ssh.mesx"], "unknown task or phase 'ssh.mesx' (did you mean 'ssh.mesh'?)"),
    (["--check", "--only", "preflight,network.netplna"], "(did you mean 'network.netplan'?)"),
    (["--limit", "spark9"], "--limit: no node named spark9 in the inventory"),
])
def test_bootstrap_unknown_selection_exits_2_with_did_you_mean(run, unreachable_inventory, args, expected):
    result = run("cluster", "bootstrap", unreachable_inventory, *args)
    assert result.exit_code == 2, result.output
    assert result.stderr.startswith("sparkctl: error: ") and expected in result.stderr
    assert "RECAP" not in result.stdout  # refused before connecting to anything


def test_a_known_hosts_file_in_a_missing_folder_is_refused_not_created(run, tmp_path):
    path = tmp_path / "inv.yaml"
    path.write_text(f"user: nvidia\nssh: {{known_hosts: {tmp_path}/typo/known_hosts}}\n"
                    "nodes: [{name: spark1, host: 127.0.0.1}, {name: spark2, host: 127.0.0.2}]\n")
    result = run("cluster", "status", str(path))
    assert result.exit_code == 2, result.output
    assert f"inv.yaml:2: ssh.known_hosts {tmp_path}/typo/known_hosts: the folder {tmp_path}/typo does not exist" \
        in result.stderr
    assert not (tmp_path / "typo").exists()


def test_only_a_later_phase_brings_back_the_fabric_the_containers_use(run, unreachable_inventory):
    """After `cluster down --network` (or a drift of the fabric), `--only serve` must not run the container mesh
    against fabric addresses that are not there: the containers' sshd listens on them, the mesh connects over
    them (in a ring through the neighbours' forwarding)."""
    from sparkctl.runs.playbooks import bootstrap_graph

    graph = bootstrap_graph()
    for task in ("container.run", "container.ssh", "mpi.hostfile", "serve.launch", "verify.fabric"):
        assert "network.netplan" in graph.needs_closure(task), task
    for task in ("container.ssh", "verify.fabric"):
        assert "network.forwarding" in graph.needs_closure(task), task
    assert {"network.netplan", "network.forwarding"} <= set(graph.select({"serve"}).added)
    result = run("cluster", "bootstrap", unreachable_inventory, "--only", "serve", "--json")
    start = json.loads(result.stdout.splitlines()[0])
    assert {"network.netplan", "network.forwarding"} <= set(start["added_needs"])
    result = run("cluster", "bootstrap", unreachable_inventory, "--only", "serve")
    said = next(line for line in result.stdout.splitlines() if line.startswith("also running what"))
    assert "network" in said


@pytest.mark.parametrize("args", [["serve", "presets"], ["doctor", "--list"], ["playbooks"],
                                  ["doctor", "INV", "--json"], ["doctor", "INV"], ["cluster", "status", "INV"]])
def test_a_reader_that_goes_away_is_not_a_crash(tmp_path, unreachable_inventory, args):
    """`sparkctl ... | head -1`: the rest has nowhere to go. Quiet, with a shell's code for SIGPIPE, never
    'internal error: BrokenPipeError' (exit 1, the code of a failed task)."""
    import os
    import subprocess
    import sys

    read, write = os.pipe()
    os.close(read)  # the reader is gone before the first line: every write meets EPIPE
    env = {**os.environ, "HOME": str(tmp_path), "XDG_STATE_HOME": str(tmp_path / "state"),
           "PYTHONPATH": str(REPO), "SPARKCTL_DEBUG": ""}
    env.pop("COLUMNS", None)
    argv = [unreachable_inventory if a == "INV" else a for a in args]
    try:
        done = subprocess.run([sys.executable, "-c", "from sparkctl.cli.main import main; main()", *argv],
                              stdout=write, stderr=subprocess.PIPE, text=True, env=env, timeout=120)
    finally:
        os.close(write)
    assert done.returncode == ExitStatus.BROKEN_PIPE == 141, done.stderr
    assert done.stderr == ""


@pytest.mark.parametrize("as_json", [True, False], ids=["--json", "console"])
def test_a_run_printing_json_does_not_load_rich(tmp_path, unreachable_inventory, as_json):
    """--json's view is apart from the console's: a run that prints JSON loads no rich (about 30 ms of its start);
    one that prints to the console does, with its broken-pipe handler."""
    import os
    import subprocess
    import sys

    env = {**os.environ, "HOME": str(tmp_path), "XDG_STATE_HOME": str(tmp_path / "state"),
           "PYTHONPATH": str(REPO), "SPARKCTL_DEBUG": ""}
    argv = ["cluster", "bootstrap", unreachable_inventory, *(["--json"] if as_json else [])]
    done = subprocess.run([sys.executable, "-X", "importtime", "-c", "from sparkctl.cli.main import main; main()",
                           *argv], capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == ExitStatus.UNREACHABLE, done.stderr[-2000:]
    imported = {line.rsplit("|", 1)[1].strip() for line in done.stderr.splitlines() if line.startswith("import time:")}
    assert ("rich.console" in imported) is not as_json
    assert ("sparkctl.cli.console" in imported) is not as_json
