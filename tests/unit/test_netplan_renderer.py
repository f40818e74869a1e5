"""Which daemon netplan renders an interface with: rules.netplan.renderer_of, checked case by case against the
real `netplan generate --root-dir` (netplan.io, installed by scripts/test; skipped where it is absent)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from sparkctl.facts import NetplanFile
from sparkctl.rules.netplan import renderer_of

DGX_OS = "# Let NetworkManager manage all devices on this system\nnetwork:\n  version: 2\n  renderer: NetworkManager\n"
FABRIC = """\
network:
  version: 2
  ethernets:
    enp1s0f1np1:
      dhcp4: no
      link-local: []
      mtu: 9000
      addresses: [192.168.100.10/24]
"""
LAB_MGMT_NETWORKD = """\
network:
  version: 2
  renderer: networkd
  ethernets:
    enP7s7:
      addresses: [10.1.1.11/24]
"""

CASES = {
    # DGX OS: the fabric file has no renderer of its own; 01-network-manager-all.yaml's global one applies
    "dgx-os": ({"01-network-manager-all.yaml": DGX_OS, "40-cx7.yaml": FABRIC}, "NetworkManager"),
    # an earlier file's global renderer loses to a later file's, wherever the stanza is
    "later-global-wins": ({"00-lab-mgmt.yaml": LAB_MGMT_NETWORKD, "01-network-manager-all.yaml": DGX_OS,
                           "40-cx7.yaml": FABRIC}, "NetworkManager"),
    "a-later-networkd-global-wins": ({"01-network-manager-all.yaml": DGX_OS, "40-cx7.yaml": FABRIC,
                                      "99-late.yaml": "network:\n  version: 2\n  renderer: networkd\n"}, "networkd"),
    "no-renderer-anywhere": ({"40-cx7.yaml": FABRIC}, "networkd"),
    "stanza-renderer-beats-the-global": (
        {"01-network-manager-all.yaml": DGX_OS,
         "40-cx7.yaml": FABRIC.replace("      dhcp4: no\n", "      renderer: networkd\n      dhcp4: no\n")},
        "networkd"),
    "ethernets-block-renderer": (
        {"01-network-manager-all.yaml": DGX_OS,
         "40-cx7.yaml": FABRIC.replace("  ethernets:\n", "  ethernets:\n    renderer: networkd\n")}, "networkd"),
    # NM-0d2f is another definition of the same device (conflicting_stanzas moves it out); the fabric stanza
    # itself keeps the global default
    "another-stanza-matching-the-device": (
        {"40-cx7.yaml": FABRIC,
         "90-NM-0d2f.yaml": "network:\n  version: 2\n  ethernets:\n    NM-0d2f:\n      renderer: NetworkManager\n"
                            "      match:\n        name: enp1s0f1np1\n      addresses: [192.168.77.5/24]\n"},
        "networkd"),
    "a-later-file-revisits-the-stanza-without-a-renderer": (
        {"40-cx7.yaml": FABRIC.replace("      dhcp4: no\n", "      renderer: NetworkManager\n      dhcp4: no\n"),
         "50-more.yaml": "network:\n  version: 2\n  ethernets:\n    enp1s0f1np1:\n      mtu: 9000\n"},
        "NetworkManager"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_renderer_of_the_fabric_twin(case):
    files, expected = CASES[case]
    netplan = [NetplanFile(f"/etc/netplan/{name}", content, 0o600) for name, content in files.items()]
    assert renderer_of(netplan, "enp1s0f1np1") == expected


@pytest.mark.skipif(shutil.which("netplan") is None, reason="netplan.io is not installed")
@pytest.mark.parametrize("case", list(CASES))
def test_real_netplan_renders_the_twin_as_renderer_of_says(case, tmp_path):
    files, expected = CASES[case]
    etc = tmp_path / "etc" / "netplan"
    etc.mkdir(parents=True)
    for name, content in files.items():
        (etc / name).write_text(content)
        (etc / name).chmod(0o600)
    subprocess.run(["netplan", "generate", "--root-dir", str(tmp_path)], check=True, capture_output=True)
    run = Path(tmp_path, "run")
    # what netplan wrote for the definition named enp1s0f1np1
    nm = (run / "NetworkManager/system-connections/netplan-enp1s0f1np1.nmconnection").exists()
    networkd = (run / "systemd/network/10-netplan-enp1s0f1np1.network").exists()
    assert (nm, networkd) == ((True, False) if expected == "NetworkManager" else (False, True))
