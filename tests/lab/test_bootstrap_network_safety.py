"""Safety of bootstrap's first phases on a lab: the node-side netplan revert, `--check --diff` changing
nothing, `cluster down --network` restoring the nodes, and a node lost in the middle of a run."""

from __future__ import annotations

import time

import pytest

from sparkctl.errors import Unreachable
from sparkctl.exitcodes import ExitStatus
from sparkctl.inventory import load_inventory
from sparkctl.plan.paths import network_state_dir
from sparkctl.runs.playbooks import bootstrap_graph
from sparkctl.runs.session import RunRequest, run_playbook
from sparkctl.tasks.network import safe_apply as safe
from tests.lab.conftest import poll, ssh
from tests.lab.network_kit import (
    bootstrap,
    fabric_of,
    mgmt_addresses,
    node_context,
    port_open,
    snapshot,
    snapshot_node,
    sparkctl,
    state_files,
)

pytestmark = pytest.mark.lab

MGMT_FILE = "/etc/netplan/00-lab-mgmt.yaml"
EXTRA_FILE = "/etc/netplan/45-sparkctl-test.yaml"
EXTRA_NETPLAN = """\
network:
  version: 2
  ethernets:
    enx0a1b2c3d4e5f:
      dhcp4: false
      addresses: [192.168.79.1/24]
"""


# --- the node-side revert, driven directly, under both renderers ----------------------------------------------
@pytest.fixture(scope="module", params=["networkd", "networkmanager"])
def revert_lab(lab_factory, request):
    """Under NetworkManager (DGX OS) `netplan apply` disconnects every device netplan renders, management port
    included, and restarts NetworkManager: the guard must restore the path all the same."""
    lab = lab_factory(2, "pair", renderer=request.param)
    return lab


def test_a_netplan_change_that_cuts_management_is_reverted_by_the_node(revert_lab):
    lab, node, timeout = revert_lab, "spark1", 15
    before = snapshot_node(lab, node)["netplan"]
    mgmt_before = mgmt_addresses(lab, node)
    mgmt_ip = lab.state.node(node).mgmt_ip
    moved = mgmt_ip.rsplit(".", 1)[0] + ".250"
    ctx = node_context(lab, node, confirm_timeout=timeout, connect_timeout=3)
    try:
        run_id = safe.arm_revert(ctx, [MGMT_FILE, EXTRA_FILE], timeout)
        armed = time.monotonic()
        ctx.transport.put(MGMT_FILE, before["00-lab-mgmt.yaml"][1].replace(mgmt_ip, moved), mode=0o600,
                          owner="root:root", sudo=True)
        ctx.transport.put(EXTRA_FILE, EXTRA_NETPLAN, mode=0o600, owner="root:root", sudo=True)
    finally:
        ctx.transport.close()
    # applied from inside, as safe.netplan_apply applies: the session's own connection is what this change cuts
    assert lab.exec(node, ["sh", "-c", safe.NETPLAN_APPLY]).returncode == 0
    # what safe.netplan_apply does after the apply: the guard's confirm window starts now
    lab.exec(node, ["touch", f"{network_state_dir(lab.names.cluster_name)}/applied-{run_id}"], check=True)
    assert poll(lambda: mgmt_addresses(lab, node) == [f"{moved}/24"], timeout=5), mgmt_addresses(lab, node)
    assert not port_open(mgmt_ip)
    with pytest.raises(Unreachable, match="could not be reached over a new management connection") as lost:
        safe.confirm(ctx, run_id)
    assert lost.value.node == node  # the node out of the run: a cut cable and a cutting change look the same
    assert time.monotonic() - armed < timeout, "too slow to observe the cut before the revert"

    assert poll(lambda: port_open(mgmt_ip), timeout=timeout + 20, interval=0.2)
    assert ssh(lab, node, "true", timeout=20).returncode == 0
    assert time.monotonic() - armed < timeout + 15
    assert snapshot_node(lab, node)["netplan"] == before  # the file restored, the new one removed
    assert poll(lambda: mgmt_addresses(lab, node) == mgmt_before, timeout=5), mgmt_addresses(lab, node)
    cluster = lab.names.cluster_name
    assert f"reverted-{run_id}" in state_files(lab, node, cluster)
    assert f"confirmed-{run_id}" not in state_files(lab, node, cluster)


def test_a_confirmed_netplan_change_is_kept(revert_lab):
    # a short window keeps the test short; the confirm keeps trying for half of it while the management address
    # comes back (under NetworkManager the apply disconnects the management port too)
    lab, node, timeout = revert_lab, "spark2", 6
    ctx = node_context(lab, node, confirm_timeout=timeout)
    try:
        run_id = safe.arm_revert(ctx, [EXTRA_FILE], timeout)
        ctx.transport.put(EXTRA_FILE, EXTRA_NETPLAN, mode=0o600, owner="root:root", sudo=True)
        applied_at = safe.netplan_apply(ctx, run_id)
        safe.confirm(ctx, run_id, applied_at)
        # the guard ends once its window is over (kept or reverted): wait for that, not for a guess of it
        pidfile = f"{network_state_dir(lab.names.cluster_name)}/guard-{run_id}.pid"
        assert poll(lambda: lab.exec(node, f"test -s {pidfile} && ! kill -0 $(cat {pidfile})").returncode == 0,
                    timeout=timeout + 60, interval=0.5)
        files = state_files(lab, node, lab.names.cluster_name)
        assert f"confirmed-{run_id}" in files and f"reverted-{run_id}" not in files
        kept = snapshot_node(lab, node)["netplan"]
        assert kept["45-sparkctl-test.yaml"] == ["0o600", EXTRA_NETPLAN]
    finally:
        ctx.transport.close()
        lab.exec(node, f"rm -f {EXTRA_FILE} && {safe.NETPLAN_APPLY}")


# --- --check --diff, then bootstrap and `down --network`, on one fresh pair ------------------------------
@pytest.fixture(scope="module")
def fresh_pair(lab_factory):
    lab = lab_factory(2, "pair")
    return lab


def test_check_diff_shows_the_netplan_diff_and_key_lines_and_changes_nothing(fresh_pair):
    lab = fresh_pair
    cluster = lab.names.cluster_name
    before = snapshot(lab)
    run = bootstrap(lab, "--check", "--diff", json_events=False)
    out = run.output
    assert run.exit_code == ExitStatus.CHANGES_PENDING, out
    assert "+++ /etc/netplan/40-cx7.yaml (planned)" in out
    assert "+        - 192.168.100.10/24" in out and "+        - 192.168.101.11/24" in out
    assert f"+ssh-ed25519 <new-cluster-key-of-spark2> sparkctl-{cluster}@spark2" in out
    spark2_hostkey = " ".join(lab.exec("spark2", ["cat", "/etc/ssh/ssh_host_ed25519_key.pub"]).stdout.split()[:2])
    spark2_mgmt = lab.state.node("spark2").mgmt_ip
    assert f"+{spark2_mgmt},192.168.100.11,192.168.101.11 {spark2_hostkey} sparkctl:{cluster}" in out
    assert "failed" not in out.split("RECAP")[0].replace("0 failed", "")
    assert snapshot(lab) == before
    for n in lab.nodes:
        assert lab.exec(n.name, ["ls", "-A", "/var/lib/sparkctl"]).stdout == "", "check mode left a record"


def test_check_diff_of_the_whole_playbook_answers_every_task_and_exits_4(fresh_pair):
    """On bare nodes every task answers: what it would change, or that it cannot know until a need is
    applied; nothing fails, nothing changes, exit 4."""
    lab = fresh_pair
    before = snapshot(lab)
    run = sparkctl(lab, "cluster", "bootstrap", str(lab.inventory_path), "--check", "--diff")
    assert run.exit_code == ExitStatus.CHANGES_PENDING, run.describe()
    assert not run.results("failed") and not run.results("unreachable"), run.describe()
    answered = {(e["task"], e.get("node")) for e in run.results()}
    for task in bootstrap_graph().ordered():
        for node in [None] if task.scope.value == "cluster" else [n.name for n in lab.nodes]:
            assert (task.name, node) in answered, f"{task.name} on {node or 'the cluster'} did not answer"
    pending = run.results("skipped")
    assert {e["task"] for e in pending} >= {"ssh.verify", "container.ssh", "verify.fabric"}
    assert all(e["reason"] == "pending" and e["message"].startswith(f"cannot know until {e['pending_on']} is "
                                                                    "applied") for e in pending)
    assert ("container.run", "spark1") in run.changed() and ("mpi.hostfile", None) in run.changed()
    assert run.recap["pending"] == len(pending)
    assert snapshot(lab) == before
    for n in lab.nodes:
        assert lab.exec(n.name, ["sh", "-c", "docker ps -aq"]).stdout.strip() == ""


NM_FILE = "/etc/netplan/90-NM-foo.yaml"
NM_STANZA = """\
network:
  version: 2
  ethernets:
    enp1s0f1np1:
      addresses: [192.168.77.6/24]
"""
USER_SSH_CONFIG = "Host gitserver\n    User git\n"


def test_down_network_leaves_the_nodes_as_they_were_before_bootstrap(fresh_pair):
    lab = fresh_pair
    # the user's own state, which bootstrap must move aside and down must give back
    lab.exec("spark2", f"umask 077; cat > {NM_FILE} && {safe.NETPLAN_APPLY}", input=NM_STANZA, check=True)
    assert poll(lambda: "192.168.77.6/24" in fabric_of(lab, "spark2")["enp1s0f1np1"]["inet"])
    lab.exec("spark2", "cd /home/nvidia/.ssh && echo 'gitserver ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIGl0IG1hdHRlcnM'"
                       " > known_hosts && cat > config && chown nvidia: known_hosts config && chmod 600 config",
             input=USER_SSH_CONFIG, check=True)
    before = snapshot(lab)

    up = bootstrap(lab)
    assert up.exit_code == 0, up.describe()
    assert snapshot(lab) != before
    assert "192.168.77.6/24" not in fabric_of(lab, "spark2")["enp1s0f1np1"]["inet"]

    down = sparkctl(lab, "cluster", "down", str(lab.inventory_path), "--network")
    assert down.exit_code == 0, down.describe()
    after = snapshot(lab)
    for n in lab.nodes:
        assert after[n.name] == before[n.name], n.name
    again = sparkctl(lab, "cluster", "down", str(lab.inventory_path), "--network")
    assert again.exit_code == 0 and again.changed_total == 0, again.describe()


# --- a node lost in the middle of a run ------------------------------------------------------------------
def test_a_node_lost_before_the_ssh_phase_is_unreachable_and_a_rerun_converges(lab_factory):
    lab = lab_factory(2, "pair")
    inventory = load_inventory(lab.inventory_path)
    events = []

    def emit(event):
        events.append(event)
        # deterministic: the runner emits this result before it starts the ssh phase
        if event.event == "task_result" and event.task == "network.verify":
            lab.exec("spark2", "systemctl stop ssh.service && loginctl terminate-user nvidia", check=True)

    try:
        result = run_playbook(inventory, bootstrap_graph(), RunRequest(only={"preflight", "network", "ssh"}), emit)
        assert result.exit_status() == ExitStatus.UNREACHABLE, [(o.task, o.node, o.status, o.message, o.details)
                                                                for o in result.outcomes]
        recap = events[-1]
        assert recap.event == "recap" and recap.exit_status == 3
        assert recap.nodes["spark2"]["unreachable"] == 1 and recap.nodes["spark1"]["unreachable"] == 0
        assert result.outcome("network.netplan", "spark2").status.value == "changed"
        assert result.outcome("ssh.keys", "spark1").status.value == "changed"  # the other node finished
        assert result.outcome("ssh.keys", "spark2").status.value == "unreachable"
        assert "spark2" in result.outcome("ssh.keys", "spark2").message
        mesh = result.outcome("ssh.mesh")
        assert mesh.status.value == "skipped" and "spark2 unreachable" in mesh.message
    finally:
        lab.exec("spark2", "systemctl start ssh.service", check=True)
    assert poll(lambda: ssh(lab, "spark2", "true", timeout=10).returncode == 0, timeout=15)

    rerun = bootstrap(lab)
    assert rerun.exit_code == 0, rerun.describe()
    assert ("ssh.keys", "spark2") in rerun.changed() and ("ssh.keys", "spark1") not in rerun.changed()
    assert bootstrap(lab).changed_total == 0

