"""Which network daemon renders netplan on a lab node: NetworkManager, as DGX OS ships, or systemd-networkd.

DGX OS is Ubuntu-desktop based: `/etc/netplan/01-network-manager-all.yaml` sets `renderer: NetworkManager`
(the file Ubuntu's desktop installer writes; docs/architecture.md), NetworkManager runs under systemd with
its D-Bus, and systemd-networkd is installed but disabled. So every netplan stanza without its own renderer,
sparkctl's fabric file included, becomes a NetworkManager profile, and NetworkManager auto-creates a
"Wired connection N" profile on every ethernet device nothing else configures (the fabric twins before
bootstrap). The lab's default is that renderer: a lab node should be a Spark where the product meets it.

What NetworkManager needs in a lab node, and why each measure is lab-only:
- udev: none in a network namespace. NetworkManager's platform uses udev only in the initial network namespace
  with a writable /sys (`nm_linux_platform_new()` in NetworkManager's src/libnm-platform/nm-linux-platform.c:
  `nmp_netns_is_initial() && path_is_read_only_fs("/sys") == FALSE`). The node remounts /sys read-only (the
  same measure that puts networkd in container mode), so NetworkManager takes every link as initialised
  without waiting for udev. The price: udev rules never reach it. The lab's twins are veths, which the real
  85-nm-unmanaged.rules would mark unmanaged (a Spark's CX-7 twins are mlx5 netdevs NetworkManager manages);
  netplan's own 90-netplan.rules (NM_UNMANAGED=1 for networkd-rendered devices) does not reach it either, so a
  NetworkManager node renders everything through NetworkManager, management link included, as DGX OS does.
- /var/lib/NetworkManager (secret_key, timestamps, no-auto-default.state, DHCP leases) is the machine's
  directory in a node that shares the machine's /var/lib: each node binds its own (a Spark has its own disk).
- NetworkManager-wait-online is masked: nothing in a lab node waits for network-online.target, and boot stays
  at about a second.
"""

from __future__ import annotations

from dataclasses import dataclass

from sparkctl.lab.naming import MGMT_IFACE

NETWORKMANAGER = "networkmanager"
NETWORKD = "networkd"
RENDERERS = (NETWORKMANAGER, NETWORKD)
DEFAULT_RENDERER = NETWORKMANAGER

#: DGX OS's file, as Ubuntu's desktop installer writes it (netplan.io, "NetworkManager" renderer; docs/architecture.md).
DGX_OS_NETPLAN_NAME = "01-network-manager-all.yaml"
DGX_OS_NETPLAN = """\
# Let NetworkManager manage all devices on this system
network:
  version: 2
  renderer: NetworkManager
"""
MGMT_NETPLAN_NAME = "00-lab-mgmt.yaml"

_MGMT_HEAD = "# The lab's management link: static, no default route, so nothing a node sends leaves the machine.\n"
_MGMT_BODY = """\
  ethernets:
    {iface}:
      addresses: [{address}/24]
      dhcp4: false
      dhcp6: false
      link-local: []
"""


@dataclass(frozen=True)
class Renderer:
    name: str
    #: prefixes of the machine's enabled units a node keeps (everything else the machine enables is masked)
    keep_prefixes: tuple[str, ...]
    #: units enabled in every node: wants directory -> unit
    enable: tuple[tuple[str, str], ...]
    #: units masked in every node besides the machine's
    masked: tuple[str, ...]
    #: directories under /var/lib the node gets its own copy of
    own_var_lib: tuple[str, ...]
    #: the daemon the fallback shell init starts by hand (no systemd)
    fallback_daemon: str

    def netplan_files(self, mgmt_address: str) -> dict[str, str]:
        """The node's /etc/netplan at first boot: name -> content (each written mode 600)."""
        body = _MGMT_BODY.format(iface=MGMT_IFACE, address=mgmt_address)
        if self.name == NETWORKD:
            return {MGMT_NETPLAN_NAME: _MGMT_HEAD + "network:\n  version: 2\n  renderer: networkd\n" + body}
        # no renderer of its own: NetworkManager renders it through DGX OS's file, like any stanza on a Spark
        return {MGMT_NETPLAN_NAME: _MGMT_HEAD + "# Rendered by NetworkManager (01-network-manager-all.yaml).\n"
                                   "network:\n  version: 2\n" + body,
                DGX_OS_NETPLAN_NAME: DGX_OS_NETPLAN}


RENDERER_SPECS = {
    NETWORKD: Renderer(
        name=NETWORKD, keep_prefixes=("systemd-networkd",),
        enable=(("multi-user.target.wants", "systemd-networkd.service"),
                ("sockets.target.wants", "systemd-networkd.socket")),
        masked=("systemd-networkd-wait-online.service",), own_var_lib=(),
        fallback_daemon="/lib/systemd/systemd-networkd"),
    # systemd-networkd is not enabled here, nor masked: the machine's choice stands (disabled on DGX OS).
    # `netplan apply` falls back to `systemctl restart systemd-networkd` when `networkctl reload` finds no
    # networkd (netplan writes .link files for NetworkManager-rendered devices too), as on a Spark; a masked
    # unit would fail the apply.
    NETWORKMANAGER: Renderer(
        name=NETWORKMANAGER,
        keep_prefixes=("systemd-networkd", "NetworkManager.service", "NetworkManager-dispatcher"),
        enable=(("multi-user.target.wants", "NetworkManager.service"),),
        masked=("NetworkManager-wait-online.service", "systemd-networkd-wait-online.service"),
        own_var_lib=("NetworkManager",),
        fallback_daemon="/usr/sbin/NetworkManager --no-daemon"),
}


def renderer_spec(name: str) -> Renderer:
    try:
        return RENDERER_SPECS[name]
    except KeyError:
        raise ValueError(f"unknown renderer {name!r} (one of: {', '.join(RENDERERS)})") from None
