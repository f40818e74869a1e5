"""Getting in: `sparkctl inventory init` against a lab, and sudo with a password (-K / --become-password-file)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from sparkctl.inventory import load_inventory
from tests.lab.network_kit import bootstrap, snapshot, sparkctl

pytestmark = pytest.mark.lab


@pytest.fixture(scope="module")
def sudo_lab(lab_factory):
    """A pair cabled on port 0 whose user needs a password for sudo."""
    lab = lab_factory(2, "pair", port=0, sudo_password=True)
    return lab


def init_inventory(lab, out: Path):
    known_hosts = out.parent / "known_hosts"
    shutil.copyfile(lab.known_hosts_path, known_hosts)
    hosts = [n.mgmt_ip for n in lab.nodes]
    return sparkctl(lab, "inventory", "init", *hosts, "-o", str(out), "--user", "nvidia",
                    "--identity-file", str(lab.key_path), "--known-hosts", str(known_hosts), "--name", "initlab",
                    json_events=False)


def test_inventory_init_detects_a_pair_on_port_0(sudo_lab, tmp_path):
    out = tmp_path / "inventory.yaml"
    run = init_inventory(sudo_lab, out)
    assert run.exit_code == 0, run.output
    inventory = load_inventory(out)
    assert (inventory.topology, inventory.fabric.port) == ("pair", 0)
    assert [str(n.host) for n in inventory.nodes] == [n.mgmt_ip for n in sudo_lab.nodes]
    assert [n.name for n in inventory.nodes] == ["spark1", "spark2"]  # from the nodes' hostnames
    assert inventory.user == "nvidia" and inventory.cluster.name == "initlab"
    assert "assumed" not in out.read_text()
    validate = sparkctl(sudo_lab, "inventory", "validate", str(out), json_events=False)
    assert validate.exit_code == 0 and "topology pair" in validate.output


def test_inventory_init_says_it_assumed_a_switch(lab_factory, tmp_path):
    lab = lab_factory(3, "switch", port=1)
    out = tmp_path / "inventory.yaml"
    run = init_inventory(lab, out)
    assert run.exit_code == 0, run.output
    inventory = load_inventory(out)
    assert (inventory.topology, inventory.fabric.port) == ("switch", 1)
    assert "assumed: 3 nodes with one port Up each: assumed they meet at a switch" in run.output
    assert "# assumed: 3 nodes with one port Up each" in out.read_text()


def test_sudo_with_a_password_fails_clearly_without_it_and_converges_with_it(sudo_lab):
    lab = sudo_lab
    password = (lab.dir / "sudo-password").read_text().strip()
    before = snapshot(lab)
    without = bootstrap(lab)
    assert without.exit_code == 1, without.describe()
    failed = without.results("failed")
    assert {(e["task"], e.get("node")) for e in failed} == {("preflight.node", "spark1"), ("preflight.node", "spark2")}
    assert all(any("sudo needs a password for nvidia (rerun with --ask-become-pass" in d for d in e["details"])
               for e in failed), failed
    assert not without.changed()
    assert snapshot(lab) == before

    with_password = bootstrap(lab, "--become-password-file", str(lab.dir / "sudo-password"))
    assert with_password.exit_code == 0, with_password.describe()
    assert ("network.netplan", "spark1") in with_password.changed()
    assert bootstrap(lab, "--become-password-file", str(lab.dir / "sudo-password")).changed_total == 0

    assert password not in without.output + with_password.output
    journals = list((lab.dir / "xdg-state").rglob("*"))
    assert any(p.is_file() for p in journals), "no run journal written"
    for path in journals:
        if path.is_file():
            assert password not in path.read_text(errors="replace"), f"the sudo password is in {path}"
