"""`cluster bootstrap --only preflight,network,ssh` on a pair, a ring of 3 and a switch of 4; drift repaired exactly."""

from __future__ import annotations

import copy
import ipaddress
import subprocess

import pytest

from sparkctl.inventory import load_inventory
from sparkctl.plan import plan_cluster
from sparkctl.tasks.network.safe_apply import NETPLAN_APPLY
from tests.lab.conftest import poll
from tests.lab.network_kit import bootstrap, fabric_of, snapshot

pytestmark = pytest.mark.lab

TOPOLOGIES = {"pair": (2, "pair"), "ring3": (3, "ring"), "switch4": (4, "switch")}


@pytest.fixture(scope="module")
def converged(lab_factory):
    """One lab per topology, bootstrapped once: (lab, first run)."""
    labs: dict[str, tuple] = {}

    def get(key: str):
        if key not in labs:
            nodes, topology = TOPOLOGIES[key]
            lab = lab_factory(nodes, topology, port=1)
            labs[key] = (lab, bootstrap(lab))
        return labs[key]

    return get


def planned_addresses(lab) -> dict[str, dict[str, str]]:
    plan = plan_cluster(load_inventory(lab.inventory_path))
    return {node: {i: str(a) for i, a in ifaces.items()} for node, ifaces in plan.fabric.addresses.items()}


# --- convergence, per topology ---------------------------------------------------------------------------
@pytest.mark.parametrize("key", list(TOPOLOGIES))
def test_bootstrap_converges_and_a_second_run_changes_nothing(converged, key):
    lab, first = converged(key)
    assert first.exit_code == 0, first.describe()
    assert first.recap["exit_status"] == 0
    assert first.changed_total > 0
    assert ("network.netplan", "spark1") in first.changed() and ("ssh.mesh", None) in first.changed()

    second = bootstrap(lab)
    assert second.exit_code == 0, second.describe()
    assert second.changed_total == 0, second.changed()
    assert not second.results("failed")


@pytest.mark.parametrize("key", list(TOPOLOGIES))
def test_nodes_have_the_planned_addresses_and_mtu_9000(converged, key):
    lab, first = converged(key)
    assert first.exit_code == 0, first.describe()
    planned = planned_addresses(lab)
    subnets_in_use: dict[ipaddress.IPv4Network, set[str]] = {}
    for n in lab.nodes:
        live = fabric_of(lab, n.name)
        wanted = planned[n.name]
        assert wanted, f"no plan for {n.name}"
        for iface, addr in wanted.items():
            assert live[iface]["inet"] == [addr], (n.name, iface, live[iface])
            assert live[iface]["mtu"] == 9000, (n.name, iface)
        nets = [ipaddress.ip_interface(a).network for a in wanted.values()]
        assert len(nets) == len(set(nets)), f"{n.name}: two twins share a subnet: {wanted}"
        for net in nets:
            subnets_in_use.setdefault(net, set()).add(n.name)
    # every subnet links the two ends of a cable (or all switch ports), never a node alone
    assert all(len(nodes) >= 2 for nodes in subnets_in_use.values()), subnets_in_use
    if key == "pair":  # the playbook's own numbers (nvidia/connect-two-sparks/README.md, Step 3)
        assert planned["spark1"] == {"enp1s0f1np1": "192.168.100.10/24", "enP2p1s0f1np1": "192.168.101.10/24"}
        assert planned["spark2"] == {"enp1s0f1np1": "192.168.100.11/24", "enP2p1s0f1np1": "192.168.101.11/24"}
    if key == "ring3":
        assert all(len(planned[n.name]) == 4 for n in lab.nodes), planned


# --- drift on the pair: repaired exactly, nothing else touched ------------------------------------------
@pytest.fixture
def pair(converged):
    lab, first = converged("pair")
    assert first.exit_code == 0, first.describe()
    before = snapshot(lab)
    yield lab, before
    # whatever a test did, leave the pair converged for the next one
    if snapshot(lab) != before:
        bootstrap(lab)


def repair(lab, before: dict, expected_changes: set):
    run = bootstrap(lab)
    assert run.exit_code == 0, run.describe()
    assert run.changed() == expected_changes, run.describe()
    assert snapshot(lab) == before
    return run


def test_a_removed_twin_address_is_restored(pair):
    lab, before = pair
    lab.exec("spark1", ["ip", "addr", "del", "192.168.101.10/24", "dev", "enP2p1s0f1np1"], check=True)
    assert fabric_of(lab, "spark1")["enP2p1s0f1np1"]["inet"] == []
    run = repair(lab, before, {("network.netplan", "spark1")})
    assert any("enP2p1s0f1np1 lacks 192.168.101.10/24" in s for s in run.change_summaries("network.netplan"))


def test_mtu_1500_on_one_end_is_set_back_to_9000(pair):
    lab, before = pair
    lab.exec("spark2", ["ip", "link", "set", "dev", "enp1s0f1np1", "mtu", "1500"], check=True)
    run = repair(lab, before, {("network.netplan", "spark2")})
    assert any("enp1s0f1np1 mtu 1500, want 9000" in s for s in run.change_summaries("network.netplan"))


NM_FILE = "/etc/netplan/90-NM-foo.yaml"
NM_CONFLICT = """\
network:
  version: 2
  ethernets:
    enp1s0f1np1:
      addresses: [192.168.77.5/24]
    enx0a1b2c3d4e5f:
      dhcp4: false
      addresses: [192.168.78.5/24]
"""


def test_a_conflicting_stanza_in_another_netplan_file_is_moved_out(pair):
    lab, before = pair
    lab.exec("spark1", f"umask 077; cat > {NM_FILE} && {NETPLAN_APPLY}", input=NM_CONFLICT, check=True)
    # the seeded address appears a moment after `netplan apply` returns
    assert poll(lambda: "192.168.77.5/24" in fabric_of(lab, "spark1")["enp1s0f1np1"]["inet"])
    after = copy.deepcopy(before)
    try:
        run = bootstrap(lab)
        assert run.exit_code == 0, run.describe()
        assert run.changed() == {("network.netplan", "spark1")}, run.describe()
        assert any(NM_FILE in s for s in run.change_summaries("network.netplan"))
        now = snapshot(lab)
        mode, content = now["spark1"]["netplan"].pop("90-NM-foo.yaml")
        assert mode == "0o600"
        assert "enp1s0f1np1" not in content and "192.168.78.5/24" in content  # the other stanza stays
        assert now == after
    finally:
        lab.exec("spark1", f"rm -f {NM_FILE}", check=True)


def test_a_deleted_authorized_key_is_added_back_once(pair):
    lab, before = pair
    cluster = lab.names.cluster_name
    keys = "/home/nvidia/.ssh/authorized_keys"
    assert f"sparkctl-{cluster}@spark1" in before["spark2"]["ssh"]["authorized_keys"][1]
    lab.exec("spark2", ["sed", "-i", f"/sparkctl-{cluster}@spark1$/d", keys], check=True)
    run = repair(lab, before, {("ssh.mesh", None)})
    assert run.change_summaries("ssh.mesh") == ["spark2: update ~/.ssh/authorized_keys"]
    assert snapshot(lab)["spark2"]["ssh"]["authorized_keys"][1].count(f"sparkctl-{cluster}@spark1") == 1


def test_a_known_hosts_entry_with_a_wrong_key_is_replaced(pair, tmp_path):
    lab, before = pair
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(tmp_path / "wrong")], check=True)
    wrong = " ".join((tmp_path / "wrong.pub").read_text().split()[:2])
    known = before["spark1"]["ssh"]["known_hosts"][1]
    peer_mgmt = lab.state.node("spark2").mgmt_ip
    lines = known.splitlines()
    index = next(i for i, line in enumerate(lines) if peer_mgmt in line.split()[0].split(","))
    names, *_rest = lines[index].split()
    lines[index] = f"{names} {wrong}"
    lab.exec("spark1", "cat > /home/nvidia/.ssh/known_hosts", input="\n".join(lines) + "\n", check=True)
    run = repair(lab, before, {("ssh.mesh", None)})
    assert run.change_summaries("ssh.mesh") == ["spark1: update ~/.ssh/known_hosts"]
    assert wrong.split()[1] not in snapshot(lab)["spark1"]["ssh"]["known_hosts"][1]
