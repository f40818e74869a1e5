"""Secrets NetworkManager writes into netplan files never reach a diff (events, the journal)."""

from __future__ import annotations

from sparkctl.rules.netplan import conflicting_stanzas, without_stanzas
from sparkctl.secrets import MASK
from sparkctl.taskgraph.diff import unified_diff

NM_FILE = """network:
  version: 2
  wifis:
    wlP9s9:
      access-points:
        "home":
          auth:
            key-management: psk
            password: "correct-horse battery"
  ethernets:
    enp1s0f1np1:
      addresses: [192.168.100.10/24]
"""


class File:
    def __init__(self, path, content):
        self.path, self.content, self.mode = path, content, 0o600


def test_moving_a_stanza_out_shows_no_wifi_password():
    files = [File("/etc/netplan/90-NM-home.yaml", NM_FILE)]
    assert conflicting_stanzas(files, "/etc/netplan/40-cx7.yaml", ["enp1s0f1np1"]) == {
        "/etc/netplan/90-NM-home.yaml": ["enp1s0f1np1"]}
    after = without_stanzas(NM_FILE, ["enp1s0f1np1"])
    assert "correct-horse battery" in after  # the file itself keeps the Wi-Fi working
    diff = unified_diff("/etc/netplan/90-NM-home.yaml", NM_FILE, after)
    assert "-    enp1s0f1np1:" in diff
    assert "correct-horse" not in diff and MASK in diff
    assert "key-management: psk" in diff
