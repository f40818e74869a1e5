"""ssh.keys, ssh.mesh, ssh.verify and the pure ssh_files helpers, on recorded ~/.ssh contents.

ssh.mesh fixtures (tests/fixtures/tasks/ssh.mesh/) give what each node's read script prints and the exact
desired files; applying the desired state and reading it back must be a fixed point.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
import re
import subprocess

import pytest

from sparkctl.rules.mesh import prelude
from sparkctl.taskgraph.task import TaskFailed
from sparkctl.tasks.context import RunOptions
from sparkctl.tasks.ssh.files import (
    block_markers,
    known_hosts_lines,
    merge_authorized_keys,
    merge_config_block,
    merge_known_hosts,
    remove_config_block,
)
from sparkctl.tasks.ssh.keys import SshKeyTask
from sparkctl.tasks.ssh.mesh import SshMeshTask, parse_ssh_files, read_ssh_files
from sparkctl.tasks.ssh.verify import SshVerify
from sparkctl.transport.framing import Framing
from sparkctl.transport.hostkeys import host_key_name
from tests.taskkit import inventory, make_kit, nonce_of, spark_facts, ssh_read_output, task_cases

CASES = task_cases("ssh.mesh")
FABRIC = {"spark1": {"enp1s0f1np1": ["192.168.100.10/24"], "enP2p1s0f1np1": ["192.168.101.10/24"]},
          "spark2": {"enp1s0f1np1": ["192.168.100.11/24"], "enP2p1s0f1np1": ["192.168.101.11/24"]}}


def mesh_kit(files: dict[str, dict], options: RunOptions | None = None):
    """Two converged nodes whose read script prints `files`; puts update what the next read returns."""
    kit = make_kit(inventory(), {n: spark_facts(n, addresses=FABRIC[n], mtu=9000) for n in files},
                   options)
    for node, node_files in files.items():
        state = dict(node_files)
        transport = kit.transport(node)
        transport.on_put.append(lambda call, state=state: state.__setitem__(call.target.rsplit("/", 1)[1],
                                                                            call.content))
        transport.respond(r":begin pub@@", ssh_read_output(state))
    return kit


def hashed(host: str, salt: bytes = bytes(range(20))) -> str:
    mac = hmac.new(salt, host.encode(), hashlib.sha1).digest()
    return f"|1|{base64.b64encode(salt).decode()}|{base64.b64encode(mac).decode()}"


# --- desired state from fixtures ------------------------------------------------------------------------------

@pytest.mark.parametrize("case", [c for _, c in CASES], ids=[n for n, _ in CASES])
def test_mesh_case(case):
    kit = mesh_kit(case["files"])
    task = SshMeshTask()
    files = read_ssh_files(kit.cluster)
    assert task.desired(kit.cluster, files) == case["expect"]
    changes = task.check(kit.cluster)
    assert [c.summary for c in changes] == case["changes"]
    task.apply(kit.cluster, changes)
    for node in case["files"]:
        puts = {p.target: p for p in kit.transport(node).puts}
        for name, content in case["expect"][node].items():
            put = puts[f"/home/nvidia/.ssh/{name}"]
            assert put.content == content and put.mode == 0o600 and not put.sudo
    assert task.check(kit.cluster) == [], "applying the desired state must be a fixed point"


def test_authorized_keys_hold_each_peer_key_exactly_once():
    (case,) = [c for n, c in CASES if n == "user-content"]
    auth = case["expect"]["spark1"]["authorized_keys"]
    assert auth.count("AAAAC2TWO") == 1
    assert "AAAAOLDKEY" not in auth  # this cluster's stale key for spark2
    assert "AAAAOTHER sparkctl-other-cluster@spark2" in auth  # another cluster's line is not ours to touch
    assert "AAAAC1ONE" not in auth  # a node does not authorize itself


def test_known_hosts_replaces_hashed_and_plain_entries_for_peer_names():
    (case,) = [c for n, c in CASES if n == "user-content"]
    known = case["expect"]["spark1"]["known_hosts"].splitlines()
    assert hashed("spark-2.local") + " ssh-ed25519 AAAAOLDHOST" not in known
    assert not any("AAAAOLDECDSA" in line for line in known)
    assert hashed("spark-1.local") + " ssh-ed25519 AAAASELF" in known  # not a peer name: kept
    assert known[-1] == "spark-2.local,192.168.100.11,192.168.101.11 ssh-ed25519 AAAAH2TWO sparkctl:spark-pair"


def test_config_block_comes_first_and_replaces_the_old_one():
    (case,) = [c for n, c in CASES if n == "user-content"]
    config = case["expect"]["spark1"]["config"]
    begin, end = block_markers("spark-pair")
    assert config.startswith(begin + "\n") and config.count(begin) == 1 and "10.9.9.9" not in config
    assert config.index(end) < config.index("Host *")


def test_desired_of_desired_is_itself():
    for _, case in CASES:
        kit = mesh_kit(case["files"])
        first = SshMeshTask().desired(kit.cluster, read_ssh_files(kit.cluster))
        again = {n: {**case["files"][n], **first[n], "home": "/home/nvidia"} for n in first}
        assert SshMeshTask().desired(kit.cluster, again) == first


def test_missing_cluster_key_fails_except_in_check_mode():
    files = {"spark1": {"hostkey": "ssh-ed25519 H1"},
             "spark2": {"pub": "ssh-ed25519 K2 c", "hostkey": "ssh-ed25519 H2"}}
    with pytest.raises(TaskFailed, match="spark1: cluster key or ssh host key missing"):
        SshMeshTask().check(mesh_kit(files).cluster)
    changes = SshMeshTask().check(mesh_kit(files, RunOptions(check=True)).cluster)
    assert any("<new-cluster-key-of-spark1>" in (c.diff or "") for c in changes)


# --- the read script, for real ------------------------------------------------------------------------------

def test_read_script_round_trip_in_a_temp_home(tmp_path):
    """The script as sparkctl sends it, run by bash against a temp HOME; files without a final newline included."""
    kit = make_kit(inventory(), {n: spark_facts(n) for n in ("spark1", "spark2")})
    read_ssh_files(kit.cluster)  # records the script (the canned empty answer reads as no files)
    script = kit.transport("spark1").commands[0]
    ssh = tmp_path / ".ssh"
    ssh.mkdir()
    (ssh / "authorized_keys").write_text("ssh-ed25519 AAAAUSER me@laptop")  # no final newline
    (ssh / "known_hosts").write_text("github.com ssh-ed25519 AAAAGITHUB\n")
    (ssh / "sparkctl-spark-pair_ed25519.pub").write_text("ssh-ed25519 AAAAC1ONE sparkctl-spark-pair@spark1\n")
    out = subprocess.run(["bash", "-c", script], env={"HOME": str(tmp_path), "PATH": os.environ["PATH"]},
                         capture_output=True, text=True, timeout=10).stdout
    files = parse_ssh_files(out, Framing(nonce_of(script)))
    assert files["authorized_keys"] == "ssh-ed25519 AAAAUSER me@laptop\n"
    assert files["known_hosts"] == "github.com ssh-ed25519 AAAAGITHUB\n"
    assert files["pub"] == "ssh-ed25519 AAAAC1ONE sparkctl-spark-pair@spark1\n"
    assert files["config"] is None and files["home"] == str(tmp_path)


# --- ssh.keys ----------------------------------------------------------------------------------------------

def test_ssh_keys_generates_a_key_for_real_in_a_temp_home(tmp_path):
    kit = make_kit(inventory(), {"spark1": spark_facts("spark1")})
    ctx = kit.node("spark1")
    transport = kit.transport("spark1")
    env = {"HOME": str(tmp_path), "PATH": os.environ["PATH"]}

    def shell(cmd: str) -> int:
        return subprocess.run(["bash", "-c", cmd], env=env, capture_output=True, timeout=30).returncode

    def run_here(script: str) -> str:  # the node is this machine, its home the temp dir
        return subprocess.run(["bash", "-c", script], env=env, capture_output=True, text=True, timeout=30).stdout

    run_here.wants_script = True
    transport.respond("begin key@@", run_here)
    changes = SshKeyTask().check(ctx)
    assert [c.summary for c in changes] == ["generate the cluster key ~/.ssh/sparkctl-spark-pair_ed25519"]
    SshKeyTask().apply(ctx, changes)
    assert shell(transport.commands[1]) == 0
    assert SshKeyTask().check(ctx) == []
    pub = (tmp_path / ".ssh" / "sparkctl-spark-pair_ed25519.pub").read_text()
    assert pub.startswith("ssh-ed25519 ") and pub.rstrip().endswith(" sparkctl-spark-pair@spark1")
    assert oct((tmp_path / ".ssh").stat().st_mode & 0o777) == "0o700"


def framed_key_missing(script: str) -> str:
    """ssh.keys' read answered: no key on the node."""
    nonce = nonce_of(script)
    return f"@@sparkctl:{nonce}:begin key@@\n\n@@sparkctl:{nonce}:end key 1@@\n"


framed_key_missing.wants_script = True  # type: ignore[attr-defined]


def test_ssh_keys_quotes_a_hostile_cluster_name(tmp_path):
    inv = inventory()
    inv.cluster.name = "x'; touch pwned; '"
    kit = make_kit(inv, {"spark1": spark_facts("spark1")})
    kit.transport("spark1").respond("begin key@@", framed_key_missing)
    ctx = kit.node("spark1")
    SshKeyTask().apply(ctx, SshKeyTask().check(ctx))
    for cmd in kit.transport("spark1").commands:
        subprocess.run(["bash", "-c", cmd], cwd=tmp_path, env={"HOME": str(tmp_path), "PATH": os.environ["PATH"]},
                       capture_output=True, timeout=30)
    assert not (tmp_path / "pwned").exists()
    assert (tmp_path / ".ssh" / "sparkctl-x'; touch pwned; '_ed25519").exists()


# --- ssh.verify ---------------------------------------------------------------------------------------------

def test_verify_reports_each_failed_connection():
    kit = mesh_kit({n: {} for n in ("spark1", "spark2")})
    kit.transport("spark1").rules.clear()
    kit.transport("spark1").respond("ssh -N -o BatchMode",
                                    "fail spark2 192.168.100.11 Permission denied (publickey).\n")
    kit.transport("spark2").rules.clear()
    kit.transport("spark2").respond("ssh -N -o BatchMode", "ok spark1 192.168.100.10\n")
    with pytest.raises(TaskFailed) as err:
        SshVerify().check(kit.cluster)
    assert err.value.message == "1 node-to-node ssh connection(s) failed"
    assert err.value.details == ["spark1 -> spark2 (192.168.100.11): Permission denied (publickey)."]
    script = kit.transport("spark1").commands[-1]
    assert ("_try spark2 192.168.100.11 ssh -N -o BatchMode=yes -o ConnectTimeout=5 -o ControlMaster=no "
            "-o ControlPath=none -o PermitLocalCommand=yes "
            '-o "LocalCommand=echo sparkctl-mesh-authenticated >&2; kill \\$PPID" '
            '${_K:+"$_K"} 192.168.100.11 &') in script
    assert subprocess.run(["bash", "-n"], input=script, text=True).returncode == 0


# --- pure helpers -------------------------------------------------------------------------------------------

def test_known_host_name_and_lines():
    assert host_key_name("spark-1.local", 22) == "spark-1.local"
    assert host_key_name("10.0.0.1", 2222) == "[10.0.0.1]:2222"
    assert known_hosts_lines([(["a", "10.0.0.2"], "ssh-ed25519 K")], "c") == ["a,10.0.0.2 ssh-ed25519 K sparkctl:c"]


def test_merge_known_hosts_hashed_marker_and_port_forms():
    current = "\n".join([
        f"{hashed('[10.0.0.2]:2222')} ssh-ed25519 OLD",   # hashed with a port: replaced
        "@cert-authority *.lan ssh-ed25519 CA",             # markers are kept
        "10.0.0.2 ssh-ed25519 OTHERPORT",                   # same host, port 22: another name, kept
        "old ssh-ed25519 K sparkctl:c",                     # our own old line: dropped
        "",
    ])
    merged = merge_known_hosts(current, ["[10.0.0.2]:2222 ssh-ed25519 NEW sparkctl:c"], {"[10.0.0.2]:2222"}, "c")
    assert merged == ("@cert-authority *.lan ssh-ed25519 CA\n10.0.0.2 ssh-ed25519 OTHERPORT\n"
                      "[10.0.0.2]:2222 ssh-ed25519 NEW sparkctl:c\n")
    assert merge_known_hosts(merged, ["[10.0.0.2]:2222 ssh-ed25519 NEW sparkctl:c"], {"[10.0.0.2]:2222"}, "c") \
        == merged


def test_merge_authorized_keys_is_idempotent_and_keeps_options_lines():
    current = 'command="/bin/true",no-pty ssh-ed25519 AAAAOPT ops\nssh-ed25519 AAAAK2 sparkctl-c@spark2\n'
    once = merge_authorized_keys(current, ["ssh-ed25519 AAAAK2 sparkctl-c@spark2"], "c")
    assert once == current
    assert merge_authorized_keys(once, ["ssh-ed25519 AAAAK2 sparkctl-c@spark2"], "c") == once
    assert merge_authorized_keys("", [], "c") == "\n"


def test_config_block_merge_and_remove():
    block = "Host 10.0.0.2\n    User nvidia\n"
    merged = merge_config_block("Host *\n    ForwardAgent no\n", block, "c")
    ours = "# BEGIN sparkctl c\nHost 10.0.0.2\n    User nvidia\n# END sparkctl c\n"
    assert merged == ours + "\nHost *\n    ForwardAgent no\n"
    assert merge_config_block(merged, block, "c") == merged
    assert merge_config_block("", block, "c") == ours
    assert remove_config_block(merged, "c") == "Host *\n    ForwardAgent no\n"
    assert remove_config_block(merge_config_block("", block, "c"), "c") == ""
    other = merge_config_block(merged, "Host x\n", "d")  # another cluster's block is left alone
    assert remove_config_block(other, "c").startswith("# BEGIN sparkctl d\n")


def test_each_node_runs_every_nodes_steps_and_raises_a_failure_after_all_finished():
    kit = mesh_kit({n: {} for n in ("spark1", "spark2")})
    done = []

    def fails():
        raise TaskFailed("spark1 broke")

    with pytest.raises(TaskFailed, match="spark1 broke"):
        kit.cluster.each_node({"spark1": fails, "spark2": lambda: done.append("spark2")})
    assert done == ["spark2"]


def test_a_noop_ssh_phase_is_one_round_trip_per_node():
    """ssh.keys' read carries ssh.mesh's files and this node's half of ssh.verify's mesh; on a no-op the phase
    costs one round trip per node. A pair that was not ok there is tried again by ssh.verify, which decides."""
    pubs = {n: f"ssh-ed25519 K{n[-1]} sparkctl-spark-pair@{n}" for n in ("spark1", "spark2")}
    files = {n: {"pub": pubs[n], "hostkey": f"ssh-ed25519 H{n[-1]}"} for n in ("spark1", "spark2")}
    kit = mesh_kit(files)
    converged = SshMeshTask().desired(kit.cluster, read_ssh_files(kit.cluster))
    peer = {"spark1": ("spark2", "192.168.100.11"), "spark2": ("spark1", "192.168.100.10")}
    for first_try in ("ok", "unknown"):
        kit = make_kit(inventory(), {n: spark_facts(n, addresses=FABRIC[n], mtu=9000) for n in files})
        for node in files:
            state = dict(files[node], **converged[node])
            read = ssh_read_output(state)
            verdict = f"{first_try} {peer[node][0]} {peer[node][1]} kex_exchange_identification: reset\n"

            def answer_keys(script, read=read, verdict=verdict):
                nonce = nonce_of(script)
                return (f"@@sparkctl:{nonce}:begin key@@\n\n@@sparkctl:{nonce}:end key 0@@\n" + read(script)
                        + f"@@sparkctl:{nonce}:begin mesh@@\n{verdict}@@sparkctl:{nonce}:end mesh 0@@\n")

            answer_keys.wants_script = True
            kit.transport(node).respond(r"begin key@@", answer_keys)
            kit.transport(node).respond(rf"\A{re.escape(prelude())}", f"ok {peer[node][0]} {peer[node][1]}\n")
        for node in files:
            assert SshKeyTask().check(kit.node(node)) == []
        assert SshMeshTask().check(kit.cluster) == []
        assert SshVerify().check(kit.cluster) == []
        trips = [kit.transport(n).round_trips for n in files]
        assert trips == ([1, 1] if first_try == "ok" else [2, 2]), first_try
