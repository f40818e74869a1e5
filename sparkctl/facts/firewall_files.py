"""Where sparkctl's firewall lives on a node (sparkctl/plan/firewall.py plans it; the facts read it back)."""

import posixpath

#: sparkctl's own nftables table, family inet
TABLE = "sparkctl"
FIREWALL_DIR = "/etc/sparkctl"
RULES_PATH = posixpath.join(FIREWALL_DIR, "firewall.nft")
#: the sha256 of the table's listing right after sparkctl loaded it: a listing that differs later is drift
LISTED_PATH = posixpath.join(FIREWALL_DIR, "firewall.listed")
UNIT_NAME = "sparkctl-firewall.service"
UNIT_PATH = posixpath.join("/etc/systemd/system", UNIT_NAME)
#: the target the unit's [Install] names, and the link `systemctl enable` makes for it there
INSTALL_TARGET = "sysinit.target"
WANTS_PATH = posixpath.join("/etc/systemd/system", f"{INSTALL_TARGET}.wants", UNIT_NAME)
