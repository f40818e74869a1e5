"""DGX OS's NetworkManager as the tests see it: its netplan file, nmcli's answers from the fixtures."""

from __future__ import annotations

from pathlib import Path

from sparkctl.facts import NetplanFile
from sparkctl.facts.networkmanager import parse_nmcli

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "nmcli"
DGX_OS = NetplanFile("/etc/netplan/01-network-manager-all.yaml",
                     "# Let NetworkManager manage all devices on this system\nnetwork:\n  version: 2\n"
                     "  renderer: NetworkManager\n", 0o600)
# the MAC of spark2's enp1s0f1np1 in mac-bound-unbound-unmanaged.txt
BOUND_MAC = "6e:11:59:53:e8:36"


def nmcli(name: str):
    return parse_nmcli((FIXTURES / name).read_text())
