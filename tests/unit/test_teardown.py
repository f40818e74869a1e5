"""`cluster down --network` on recorded facts: down.network restores exactly what was recorded before sparkctl's
first change; down.ssh removes exactly sparkctl's own keys and lines."""

from __future__ import annotations

import base64
import json
import subprocess

from sparkctl.plan.paths import network_state_dir
from sparkctl.runs.playbooks import down_graph
from sparkctl.tasks.network.down import NetworkDown
from sparkctl.tasks.ssh.down import SshDown
from tests.taskkit import inventory, make_kit, spark_facts

ORIGINAL_NETPLAN = "network:\n  version: 2\n  ethernets:\n    enp1s0f1np1: {dhcp4: true}\n"
RECORDED_INTERFACES = {"enp1s0f1np1": {"mtu": 1500, "addresses": ["10.9.0.5/24"]},
                       "enP2p1s0f1np1": {"mtu": 1500, "addresses": []}}
AFTER_BOOTSTRAP = {"enp1s0f1np1": ["192.168.100.10/24"], "enP2p1s0f1np1": ["192.168.101.10/24"]}


def b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def record_listing(files: dict[str, str]) -> str:
    """What _read_originals' script prints: one `<b64 name> <b64 content>` line per recorded file."""
    return "".join(f"{b64(name)} {b64(content)}\n" for name, content in files.items())


def down_kit(recorded: dict[str, str] | None):
    kit = make_kit(inventory(), {"spark1": spark_facts("spark1", addresses=AFTER_BOOTSTRAP, mtu=9000)})
    if recorded is not None:
        kit.transport("spark1").respond(r"network/original", record_listing(recorded))
    return kit


RECORD = {"40-cx7.yaml.absent": "", "50-installer.yaml": ORIGINAL_NETPLAN,
          "interfaces.json": json.dumps(RECORDED_INTERFACES)}


def test_nothing_recorded_means_nothing_to_restore():
    kit = down_kit(None)
    assert NetworkDown().check(kit.node("spark1")) == []


def test_the_record_is_listed_file_by_file():
    kit = down_kit(RECORD)
    (change,) = NetworkDown().check(kit.node("spark1"))
    assert change.summary == ("restore the network as it was before bootstrap: remove /etc/netplan/40-cx7.yaml, "
                              "restore /etc/netplan/50-installer.yaml")


def test_restore_puts_files_back_under_the_revert_guard_then_the_addresses_and_mtu():
    kit = down_kit(RECORD)
    ctx = kit.node("spark1")
    task = NetworkDown()
    task.apply(ctx, task.check(ctx))
    transport = kit.transport("spark1")
    (put,) = transport.puts
    assert (put.target, put.content, put.mode, put.owner, put.sudo) == (
        "/etc/netplan/50-installer.yaml", ORIGINAL_NETPLAN, 0o600, "root:root", True)
    commands = transport.commands
    arm = next(i for i, c in enumerate(commands) if "setsid nohup" in c)
    remove = commands.index("rm -f /etc/netplan/40-cx7.yaml")
    apply_ = next(i for i, c in enumerate(commands) if c.startswith("netplan apply"))
    assert arm < remove < apply_, "the guard is armed before any file changes, the apply comes last"
    assert kit.fresh and kit.fresh[0].closed, "the management path was proven over a new connection"
    restore = commands[-1]
    assert "ip addr del 192.168.100.10/24 dev enp1s0f1np1" in restore
    assert "ip addr add 10.9.0.5/24 dev enp1s0f1np1" in restore
    assert "ip addr del 192.168.101.10/24 dev enP2p1s0f1np1" in restore
    assert "ip link set dev enp1s0f1np1 mtu 1500" in restore and "ip link set dev enP2p1s0f1np1 mtu 1500" in restore
    assert restore.endswith(f"rm -rf {network_state_dir('spark-pair')}")


def test_the_record_script_reads_names_and_contents_exactly(tmp_path):
    """The read script as sparkctl sends it, run for real against a record with awkward names and contents."""
    kit = down_kit(None)
    ctx = kit.node("spark1")
    NetworkDown().check(ctx)
    script = kit.transport("spark1").commands[0]
    original = tmp_path / "original"
    original.mkdir()
    (original / "40 cx7.yaml").write_text("a: 1\n")
    (original / "x.yaml.absent").write_text("")
    script = script.replace(f"{network_state_dir('spark-pair')}/original", str(original))
    out = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=10, check=True).stdout
    kit.transport("spark1").respond(r"original", out)
    (change,) = NetworkDown().check(ctx)
    assert change.payload == {"40 cx7.yaml": "a: 1\n", "x.yaml.absent": ""}


USER_AUTH = "ssh-ed25519 AAAAUSER me@laptop\n"
OURS = "ssh-ed25519 AAAAPEER sparkctl-spark-pair@spark2\n"
OTHER_CLUSTER = "ssh-ed25519 AAAAOTHER sparkctl-other@spark9\n"
KNOWN = "github.com ssh-ed25519 AAAAGH\n192.168.100.11 ssh-ed25519 AAAAH2 sparkctl:spark-pair\n"
CONFIG = "# BEGIN sparkctl spark-pair\nHost 192.168.100.11\n    IdentityFile x\n# END sparkctl spark-pair\nHost *\n"


def ssh_kit(key_exists: bool = True):
    kit = make_kit(inventory(), {"spark1": spark_facts("spark1")})
    transport = kit.transport("spark1")
    transport.respond(r'printf %s "\$HOME"', "/home/nvidia")
    transport.respond(r"^test -e", exit_code=0 if key_exists else 1)
    transport.files.update({"/home/nvidia/.ssh/authorized_keys": USER_AUTH + OURS + OTHER_CLUSTER,
                            "/home/nvidia/.ssh/known_hosts": KNOWN,
                            "/home/nvidia/.ssh/config": CONFIG})
    return kit


def test_ssh_down_removes_only_sparkctls_lines_and_key():
    kit = ssh_kit()
    ctx = kit.node("spark1")
    changes = SshDown().check(ctx)
    assert sorted(c.summary for c in changes) == [
        "remove sparkctl's lines from /home/nvidia/.ssh/authorized_keys",
        "remove sparkctl's lines from /home/nvidia/.ssh/config",
        "remove sparkctl's lines from /home/nvidia/.ssh/known_hosts",
        "remove the cluster key /home/nvidia/.ssh/sparkctl-spark-pair_ed25519",
    ]
    SshDown().apply(ctx, changes)
    files = kit.transport("spark1").files
    assert files["/home/nvidia/.ssh/authorized_keys"] == USER_AUTH + OTHER_CLUSTER
    assert files["/home/nvidia/.ssh/known_hosts"] == "github.com ssh-ed25519 AAAAGH\n"
    assert files["/home/nvidia/.ssh/config"] == "Host *\n"
    assert any(c.startswith("rm -f /home/nvidia/.ssh/sparkctl-spark-pair_ed25519 ")
               for c in kit.transport("spark1").commands)


def test_ssh_down_removes_a_file_that_held_only_sparkctls_lines_and_is_then_done():
    kit = ssh_kit(key_exists=False)
    kit.transport("spark1").files["/home/nvidia/.ssh/known_hosts"] = KNOWN.splitlines(keepends=True)[1]
    ctx = kit.node("spark1")
    changes = SshDown().check(ctx)
    assert "remove /home/nvidia/.ssh/known_hosts (only sparkctl's lines were in it)" in [c.summary for c in changes]
    SshDown().apply(ctx, changes)
    assert "rm -f /home/nvidia/.ssh/known_hosts" in kit.transport("spark1").commands


def test_down_undoes_the_network_only_when_asked():
    # the unit first: its stop reaches the server inside the container
    # sparkctl's firewall goes with every `cluster down` (its own table only: the node's rules stay)
    assert [t.name for t in down_graph().ordered()] == ["serve.unit_remove", "serve.gateway_remove", "container.remove",
                                                        "network.firewall_remove"]
    assert [t.name for t in down_graph(network_too=True).ordered()] == [
        "serve.unit_remove", "serve.gateway_remove", "container.remove", "down.ssh", "down.network",
        "network.firewall_remove"]
