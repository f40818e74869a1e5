"""The lab's pure parts: naming, addressing, cabling, state, init script, inventory (no root needed)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
import yaml

from sparkctl.lab import inventory_writer, naming, node, systemd
from sparkctl.lab.naming import LabNames, cabled_twins, cables
from sparkctl.lab.renderer import renderer_spec
from sparkctl.lab.state import LabState, NodeRecord, Resource, process_is_alive, process_starttime


def test_every_name_fits_a_linux_interface_and_two_labs_never_share_one():
    a, b = LabNames("00a1"), LabNames("ffff")
    links = [a.bridge, a.mgmt_host_veth(64), naming.unplugged_peer_name(64, "enP2p1s0f1np1"),
             naming.switch_port_name(64, "enp1s0f0np0"), naming.switch_bridge_name("enP2p1s0f0np0")]
    assert all(len(name) <= 15 for name in links + list(naming.ALL_TWINS))
    assert a.bridge != b.bridge and a.node_netns("spark1") != b.node_netns("spark1")
    assert a.mgmt_subnet != b.mgmt_subnet


def test_management_addresses_follow_the_node_number():
    names = LabNames("0001")
    assert names.mgmt_subnet == "10.201.0.0/24"
    addresses = (names.bridge_ip, names.mgmt_ip(1), names.mgmt_ip(16))
    assert addresses == ("10.201.0.1", "10.201.0.11", "10.201.0.26")
    with pytest.raises(ValueError):
        names.mgmt_ip(0)


def test_lab_id_is_validated():
    with pytest.raises(ValueError):
        LabNames("../x")
    assert len(naming.new_lab_id()) == 4


def test_pair_cables_the_chosen_port_on_both_nodes():
    assert cables("pair", 2, 0) == [naming.Cable(1, 0, 2, 0)]
    assert naming.Cable(1, 1, 2, 1).twin_pairs() == [("enp1s0f1np1", "enp1s0f1np1"),
                                                     ("enP2p1s0f1np1", "enP2p1s0f1np1")]
    assert cabled_twins("pair", 2, 1) == {1: {"enp1s0f1np1", "enP2p1s0f1np1"},
                                          2: {"enp1s0f1np1", "enP2p1s0f1np1"}}


def test_ring_cables_port_0_to_the_next_nodes_port_1_and_wraps():
    Cable = naming.Cable
    assert cables("ring", 3, 1) == [Cable(1, 0, 2, 1), Cable(2, 0, 3, 1), Cable(3, 0, 1, 1)]
    assert all(twins == set(naming.ALL_TWINS) for twins in cabled_twins("ring", 3, 1).values())


def test_switch_and_single_have_no_direct_cables():
    assert cables("switch", 4, 1) == [] and cables("single", 1, 1) == []
    assert cabled_twins("switch", 4, 0)[4] == set(naming.PORT_TWINS[0])
    assert cabled_twins("single", 1, 1) == {1: set()}


@pytest.mark.parametrize("topology,nodes,port", [("pair", 3, 1), ("ring", 2, 1), ("single", 2, 1),
                                                 ("mesh", 2, 1), ("pair", 2, 2)])
def test_impossible_topologies_are_refused(topology, nodes, port):
    with pytest.raises(ValueError):
        naming.validate_topology(topology, nodes, port)


def test_state_is_recorded_before_use_and_round_trips(tmp_path):
    state = LabState(lab_id="abcd", dir=str(tmp_path), topology="pair", port=1)
    state.nodes.append(NodeRecord("spark1", 1, "10.1.1.11"))
    state.record(Resource(kind="netns", name="slabcd-spark1"))
    loaded = LabState.load(tmp_path)
    assert loaded.of_kind("netns")[0].name == "slabcd-spark1"
    assert loaded.node("spark1").mgmt_ip == "10.1.1.11"
    with pytest.raises(KeyError, match="spark1"):
        loaded.node("spark9")


def test_a_reused_pid_is_not_our_process():
    child = subprocess.Popen(["sleep", "5"])
    try:
        start = process_starttime(child.pid)
        assert process_is_alive(child.pid, start)
        assert not process_is_alive(child.pid, start + 1)
    finally:
        child.kill()
        child.wait()
    assert not process_is_alive(child.pid, start)


MOUNTINFO = """\
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 / /sys/fs/cgroup/cpu,cpuacct rw,relatime - cgroup cgroup rw,cpu,cpuacct
40 31 0:37 / /sys/fs/cgroup/systemd rw,relatime - cgroup cgroup rw,xattr,name=systemd
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw,nsdelegate
"""


def test_cgroup_hierarchies_are_mounted_in_nodes_as_on_the_machine():
    assert node.machine_cgroup_mounts(MOUNTINFO) == [
        node.CgroupMount("cpu,cpuacct", "cgroup", "cpu,cpuacct"),
        node.CgroupMount("systemd", "cgroup", "xattr,name=systemd"),
        node.CgroupMount("unified", "cgroup2", "nsdelegate"),
    ]
    assert node.machine_cgroup_mounts(MOUNTINFO.replace("xattr,", ""))[1].options == "none,name=systemd"


def test_init_script_mounts_the_node_view_and_execs_systemd(tmp_path):
    paths = node.NodePaths(tmp_path / "it's a dir")
    script = node.render_init_script(paths, "spark3", node.machine_cgroup_mounts(MOUNTINFO), "systemd")
    assert "mount --bind '" in script and "it'\"'\"'s a dir" in script
    assert "mount -o remount,ro /sys" in script and "hostname spark3" in script
    assert script.rstrip().endswith("/lib/systemd/systemd")
    assert "/var/lib/NetworkManager" in script  # the default renderer keeps its state in the node's own dir
    fallback = node.render_init_script(paths, "spark3", [], "shell", renderer_spec("networkd"))
    assert "systemd-networkd &" in fallback and "/lib/systemd/systemd\n" not in fallback
    assert "NetworkManager" not in fallback
    nm_fallback = node.render_init_script(paths, "spark3", [], "shell", renderer_spec("networkmanager"))
    assert "/usr/sbin/NetworkManager --no-daemon &" in nm_fallback
    assert "mount --bind /var/lib/sparkctl-lab/node-root/var-lib/NetworkManager /var/lib/NetworkManager" in nm_fallback
    for text in (script, fallback, nm_fallback):
        assert subprocess.run(["sh", "-n"], input=text, text=True).returncode == 0


def test_node_paths_map_node_files_to_overlay_uppers(tmp_path):
    paths = node.NodePaths(tmp_path)
    assert paths.upper_for("/etc/netplan/40-cx7.yaml") == tmp_path / "etc-upper/netplan/40-cx7.yaml"
    assert paths.upper_for("/home/nvidia/.ssh") == tmp_path / "home-upper/nvidia/.ssh"
    assert paths.upper_for("/etcetera") is None


def test_the_machines_enabled_units_are_masked_except_what_a_node_needs(tmp_path):
    for wants, unit in [("multi-user.target.wants", "postgresql.service"),
                        ("multi-user.target.wants", "ssh.service"),
                        ("getty.target.wants", "getty@tty1.service"),
                        ("timers.target.wants", "apt-daily.timer")]:
        (tmp_path / wants).mkdir(exist_ok=True)
        (tmp_path / wants / unit).symlink_to(f"/lib/systemd/system/{unit}")
    (tmp_path / "multi-user.target.wants" / "NetworkManager.service").symlink_to("/lib/systemd/system/x")
    networkd = renderer_spec("networkd")
    masked = systemd.units_to_mask(systemd.enabled_units(tmp_path), networkd)
    assert {"postgresql.service", "getty@.service", "apt-daily.timer", "console-getty.service",
            "NetworkManager.service", "systemd-networkd-wait-online.service"} <= set(masked)
    assert "ssh.service" not in masked
    upper = tmp_path / "upper"
    systemd.write_unit_config(upper, masked, networkd)
    assert os.readlink(upper / "systemd/system/postgresql.service") == "/dev/null"
    assert (upper / "systemd/system/multi-user.target.wants/systemd-networkd.service").is_symlink()
    assert not (upper / "systemd/system/multi-user.target.wants/NetworkManager.service").is_symlink()


def test_a_networkmanager_node_runs_networkmanager_and_leaves_networkd_disabled(tmp_path):
    (tmp_path / "multi-user.target.wants").mkdir()
    (tmp_path / "multi-user.target.wants" / "NetworkManager.service").symlink_to("/lib/systemd/system/x")
    nm = renderer_spec("networkmanager")
    masked = systemd.units_to_mask(systemd.enabled_units(tmp_path), nm)
    assert "NetworkManager.service" not in masked
    assert {"NetworkManager-wait-online.service", "systemd-networkd-wait-online.service"} <= set(masked)
    # netplan apply falls back to `systemctl restart systemd-networkd`: never masked, never enabled
    assert not any(u.startswith("systemd-networkd.") for u in masked)
    upper = tmp_path / "upper"
    systemd.write_unit_config(upper, masked, nm)
    wants = upper / "systemd/system/multi-user.target.wants"
    assert os.readlink(wants / "NetworkManager.service") == "/lib/systemd/system/NetworkManager.service"
    assert not (wants / "systemd-networkd.service").exists()


def test_the_renderers_netplan_files_are_dgx_os_or_networkd():
    nm = renderer_spec("networkmanager").netplan_files("10.1.2.11")
    assert nm["01-network-manager-all.yaml"] == (
        "# Let NetworkManager manage all devices on this system\n"
        "network:\n  version: 2\n  renderer: NetworkManager\n")
    assert "renderer" not in nm["00-lab-mgmt.yaml"].split("network:")[1]
    assert "enP7s7:\n      addresses: [10.1.2.11/24]" in nm["00-lab-mgmt.yaml"]
    networkd = renderer_spec("networkd").netplan_files("10.1.2.11")
    assert list(networkd) == ["00-lab-mgmt.yaml"] and "renderer: networkd" in networkd["00-lab-mgmt.yaml"]
    with pytest.raises(ValueError, match="unknown renderer 'ifupdown'"):
        renderer_spec("ifupdown")


def test_inventory_follows_the_schema(tmp_path):
    doc = inventory_writer.inventory_document(tmp_path, "lab-abcd", [("spark1", "10.1.1.11")], "pair", 1,
                                              "localhost/sparkctl-lab-trtllm-0123456789ab:1.3.0rc12")
    path = tmp_path / "inventory.yaml"
    inventory_writer.write_inventory(path, doc)
    loaded = yaml.safe_load(path.read_text())
    assert loaded["ssh"] == {"identity_file": str(tmp_path / "id_ed25519"), "port": 22,
                             "known_hosts": str(tmp_path / "known_hosts"), "use_ssh_config": False}
    assert loaded["nodes"] == [{"name": "spark1", "host": "10.1.1.11"}]
    assert loaded["fabric"] == {"topology": "pair", "port": 1} and loaded["user"] == "nvidia"
    assert "serve" not in loaded


def test_known_hosts_lines_carry_each_host_key(tmp_path):
    (tmp_path / "ssh_host_ed25519_key.pub").write_text("ssh-ed25519 AAAAkey root@machine\n")
    assert inventory_writer.known_hosts_lines("10.1.1.11", tmp_path) == ["10.1.1.11 ssh-ed25519 AAAAkey"]


def test_secrets_are_written_0600(tmp_path):
    inventory_writer.write_secret(tmp_path / "sudo-password", "s3cret")
    assert (tmp_path / "sudo-password").stat().st_mode & 0o777 == 0o600
    assert Path(tmp_path / "sudo-password").read_text() == "s3cret\n"


def test_a_ring_can_be_cabled_out_of_the_inventorys_order():
    from sparkctl.lab.naming import parse_ring_order

    order = parse_ring_order("1,3,2", "ring", 3)
    assert order == (1, 3, 2)
    # node 1's port 0 goes to node 3's port 1: the inventory (1, 2, 3) wants it on node 2
    assert cables("ring", 3, 1, order) == [naming.Cable(1, 0, 3, 1), naming.Cable(3, 0, 2, 1), naming.Cable(2, 0, 1, 1)]
    assert parse_ring_order(None, "ring", 3) is None


@pytest.mark.parametrize("text,topology,nodes", [("1,2", "ring", 3), ("1,1,2", "ring", 3), ("1,3,2", "pair", 2),
                                                 ("a,b,c", "ring", 3), ("0,1,2", "ring", 3)])
def test_a_ring_order_that_is_not_a_permutation_of_the_nodes_is_refused(text, topology, nodes):
    from sparkctl.lab.naming import parse_ring_order

    with pytest.raises(ValueError, match="ring-order"):
        parse_ring_order(text, topology, nodes)
