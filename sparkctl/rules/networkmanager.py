"""PURE: what NetworkManager does to the fabric twins besides rendering netplan's profiles.

On DGX OS NetworkManager renders netplan, and it keeps profiles of its own: the "Wired connection N" it
auto-creates on every ethernet device nothing configures, and whatever a user made with nmcli (on DGX OS those
are written as /etc/netplan/90-NM-*.yaml, which conflicting_stanzas already moves out; elsewhere as keyfiles).
When several profiles may take one device, NetworkManager activates the one with the highest
connection.autoconnect-priority, the most recently used among equals, and never replaces an active one by itself.

One judgement for `network.netplan` (which removes what competes, backed up) and doctor (which reports it).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

from sparkctl.facts import Facts, NmProfile
from sparkctl.facts.model import NM_NETPLAN_PREFIX
from sparkctl.rules.netplan import NETWORKMANAGER, renderer_of

#: what netplan gives the profiles it renders (it writes no autoconnect-priority: NetworkManager's default)
NETPLAN_PRIORITY = 0
#: where NetworkManager's keyfile plugin keeps profiles: on disk, and in memory (auto-created ones live there)
KEYFILE_DIRS = ("/etc/NetworkManager/system-connections/", "/run/NetworkManager/system-connections/")


def is_uuid(text: str) -> bool:
    """NetworkManager's profile ids are UUIDs: nothing else is used as a file name or a command word."""
    return re.fullmatch(r"[0-9A-Fa-f]{8}(-[0-9A-Fa-f]{4}){3}-[0-9A-Fa-f]{12}", text) is not None


def is_keyfile(path: str) -> bool:
    """A profile sparkctl can back up and put back: a keyfile in one of NetworkManager's own directories."""
    return (path.startswith(KEYFILE_DIRS) and path.endswith(".nmconnection") and "/../" not in path
            and not path.startswith(NM_NETPLAN_PREFIX))


@dataclass(frozen=True)
class CompetingProfile:
    """A profile that is not netplan's and can take a planned fabric twin from it."""

    profile: NmProfile
    interface: str
    why: str  # in words, for a change summary or a finding's evidence


def _bound_to(profile: NmProfile, facts: Facts, names: Iterable[str]) -> str | None:
    """The first of `names` the profile is bound to, by interface name or by MAC address."""
    for name in names:
        nic = facts.interfaces.get(name)
        if profile.interface_name == name or (profile.mac and nic and nic.mac and profile.mac == nic.mac.lower()):
            return name
    return None


def competing_profiles(facts: Facts, interfaces: Iterable[str], management: Iterable[str]) -> list[CompetingProfile]:
    """Non-netplan ethernet profiles that would take a planned twin from netplan's profile the next time
    NetworkManager chooses (`netplan apply` disconnects the twin and restarts NetworkManager, which then
    autoconnects): autoconnect on, a priority at least netplan's, and bound to the twin (by name or MAC) or,
    unbound, active on it. Never one active on, or bound to, a management interface (that is the management's
    connection). An active profile that cannot win (autoconnect off, or a lower priority like the auto-created
    "Wired connection" at -999) is displaced by the apply itself and left alone."""
    nm = facts.nm
    if nm is None or not nm.running:
        return []
    twins, management = list(interfaces), set(management)
    out = []
    for p in nm.profiles:
        if not p.ethernet or p.from_netplan or not p.autoconnect:
            continue
        if p.device in management or _bound_to(p, facts, sorted(management)):
            continue
        twin = _bound_to(p, facts, twins)
        unbound_here = not p.interface_name and not p.mac and p.device in twins
        if twin is None and not unbound_here:
            continue
        twin = twin or p.device
        netplan = nm.netplan_profile(twin)
        floor = netplan.priority if netplan else NETPLAN_PRIORITY
        if p.priority < floor:
            continue
        how = "unbound" if unbound_here else "bound by name" if p.interface_name == twin else "bound by MAC"
        state = "active" if p.device == twin else "inactive"
        out.append(CompetingProfile(p, twin, f"{state}, {how}, autoconnect priority {p.priority} >= netplan's "
                                             f"{floor}"))
    return out


def unmanaged_twins(facts: Facts, interfaces: Iterable[str], files: list | None = None) -> list[str]:
    """Planned twins netplan renders through NetworkManager (judged on `files`, the node's netplan files by
    default) that NetworkManager does not manage: their netplan profile can never activate."""
    nm = facts.nm
    if nm is None or not nm.running:
        return []
    files = facts.netplan_files if files is None else files
    return [name for name in interfaces
            if (device := nm.device(name)) is not None and not device.managed
            and renderer_of(files, name) == NETWORKMANAGER]


def nm_renders(files: list, interfaces: Iterable[str]) -> bool:
    """Whether netplan renders any of these stanzas through NetworkManager."""
    return any(renderer_of(files, name) == NETWORKMANAGER for name in interfaces)


def netplan_stanzas_of(facts: Facts, interfaces: Iterable[str]) -> set[str]:
    """Names of netplan stanzas whose NetworkManager profile is bound to a planned twin under another name: what
    DGX OS's NetworkManager writes for a profile made with nmcli (/etc/netplan/90-NM-<uuid>.yaml, stanza
    NM-<uuid>), however the YAML binds it."""
    nm = facts.nm
    if nm is None:
        return set()
    twins = list(interfaces)
    out = set()
    for p in nm.profiles:
        if not p.from_netplan or not p.filename.endswith(".nmconnection"):
            continue
        stanza = p.filename[len(NM_NETPLAN_PREFIX):-len(".nmconnection")]
        if stanza not in twins and _bound_to(p, facts, twins):
            out.add(stanza)
    return out
