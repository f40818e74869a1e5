"""The faults seeded on a lab whose netplan NetworkManager renders (DGX OS's renderer), one module's and the doctor
cross-check's."""

from __future__ import annotations

from tests.lab.doctor_kit import Seed

NM_SEEDS = [
    Seed("nm-competing-profile", "nm.competing_profile", "spark2",
         "nmcli connection add type ethernet ifname enP2p1s0f1np1 con-name seeded-competing "
         "connection.autoconnect-priority 5 >/dev/null"),
    Seed("nm-twin-unmanaged", "nm.twin_unmanaged", "spark1", "nmcli device set enp1s0f1np1 managed no"),
    # the case where DGX OS has NetworkManager manage the twin
    Seed("nm-twin-set-down", "fabric.port_down", "spark1", "ip link set enP2p1s0f1np1 down"),
]
