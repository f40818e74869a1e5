"""The doctor's probes of the node's own software, riding in the one probe round trip (doctor/probes.py): kernel,
GPU driver and CUDA, the RoCE devices (`ibv_devinfo`, the GID table as `show_gids` prints it), settings that
override sparkctl's (NCCL/UCX lines in shell startup files, /etc/nccl.conf in the container, sshd drop-ins), and
their parsers. Only reads.

Formats: `ibv_devinfo` as rdma-core's libibverbs/examples/devinfo.c prints it (`hca_id:<TAB><dev>`,
`<TAB>fw_ver:<TAB>...`, `<TAB><TAB><TAB>state:<TAB><TAB><TAB>PORT_ACTIVE (4)`); `show_gids` as Mellanox/mlnx-tools
sbin/show_gids prints it (a header, one tab-separated row per GID: DEV PORT INDEX GID [IPv4] VER DEV, then
`n_gids_found=N`).
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass, field

from sparkctl.rules.sshd import SSHD_KEYS, keyword
from sparkctl.transport.base import q

ABSENT = "#absent"
#: The variables whose settings sparkctl owns or NCCL/UCX/Open MPI read.
OVERRIDE_PREFIXES = ("NCCL_", "UCX_", "OMPI_MCA_")
_VAR = r"(NCCL|UCX|OMPI_MCA)_[A-Za-z0-9_]*"  # POSIX ERE (grep -E) and Python alike


@dataclass
class Hca:
    """One RoCE device as ibv_devinfo shows it (port 1: a CX-7 netdev has one)."""

    device: str
    fw: str = ""
    state: str = ""  # PORT_ACTIVE | PORT_DOWN | PORT_INIT | PORT_ARMED
    link_layer: str = ""


@dataclass
class Gid:
    device: str
    port: int
    index: int
    gid: str
    version: str  # "v1" | "v2"
    netdev: str

    @property
    def ipv4(self) -> str | None:
        """The IPv4 address of an IPv4-mapped GID (::ffff:a.b.c.d), else None."""
        try:
            address = ipaddress.IPv6Address(self.gid)
        except ValueError:
            return None
        mapped = address.ipv4_mapped
        return str(mapped) if mapped else None


@dataclass
class Setting:
    """One line that sets a variable: where, and what."""

    path: str
    line: int
    name: str
    value: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.name}={self.value}"


@dataclass(slots=True)
class SystemProbe:
    kernel: str = ""
    driver: str = ""
    cuda: str = ""  # the CUDA version the driver supports (nvidia-smi's header)
    hcas: dict[str, Hca] | None = None  # None: ibv_devinfo not on the node
    gids: list[Gid] | None = None  # None: no GID table could be read
    host_settings: list[Setting] = field(default_factory=list)
    container_settings: list[Setting] = field(default_factory=list)
    #: sshd drop-in lines: (path, keyword, value), in the order sshd reads them
    sshd_dropins: list[tuple[str, str, str]] = field(default_factory=list)


# --- scripts ---------------------------------------------------------------------------------------------------

VERSIONS = "probe_versions"
IBV_DEVINFO = f"if _has ibv_devinfo; then ibv_devinfo 2>&1; else echo '{ABSENT}'; fi"
GIDS = f"probe_gids '{ABSENT}'"


def _grep_settings(files: str) -> str:
    return (f"for f in {files}; do [ -r \"$f\" ] || continue; "
            f"grep -nE '^[[:space:]]*(export[[:space:]]+)?{_VAR}=' \"$f\" 2>/dev/null | sed \"s|^|$f:|\"; done")


HOST_SETTINGS = _grep_settings('"$HOME/.bashrc" "$HOME/.profile" "$HOME/.bash_profile" /etc/environment '
                               '/etc/profile.d/*.sh')
#: inside the container: NCCL reads ~/.nccl.conf and /etc/nccl.conf (NCCL docs, "Environment Variables")
CONTAINER_SETTINGS = _grep_settings("/etc/nccl.conf /root/.nccl.conf /root/.bashrc /etc/environment")

SSHD_DROPINS = "probe_sshd_dropins " + q("|".join(SSHD_KEYS))


# --- parsers ---------------------------------------------------------------------------------------------------

def parse_versions(text: str) -> dict[str, str]:
    out = {}
    for line in text.splitlines():
        key, _, value = line.strip().partition(" ")
        if key in ("kernel", "driver", "cuda") and value.strip():
            out[key] = value.strip()
    return out


_HCA = re.compile(r"^hca_id:\s*(\S+)")
_FIELD = re.compile(r"^\s+(fw_ver|state|link_layer):\s*(\S+)")


def parse_ibv_devinfo(text: str) -> dict[str, Hca] | None:
    if text.strip() == ABSENT:
        return None
    hcas: dict[str, Hca] = {}
    current: Hca | None = None
    for line in text.splitlines():
        m = _HCA.match(line)
        if m:
            current = hcas.setdefault(m.group(1), Hca(m.group(1)))
            continue
        m = _FIELD.match(line)
        if m and current is not None:
            key, value = m.groups()
            if key == "fw_ver":
                current.fw = value
            elif key == "state" and not current.state:  # port 1 (a CX-7 twin has one port)
                current.state = value
            elif key == "link_layer" and not current.link_layer:
                current.link_layer = value
    return hcas


def parse_gids(text: str) -> list[Gid] | None:
    if text.strip() == ABSENT or not text.strip():
        return None
    gids = []
    for line in text.splitlines():
        fields = line.split("\t")
        if len(fields) < 6 or not fields[1].strip().isdigit() or not fields[2].strip().isdigit():
            continue  # the header, its underline, n_gids_found=N
        version = re.search(r"v\d", fields[-2].strip(), re.I)
        gids.append(Gid(fields[0].strip(), int(fields[1]), int(fields[2]), fields[3].strip(),
                        version.group(0).lower() if version else "", fields[-1].strip()))
    return gids


_SETTING = re.compile(r"^(?P<path>[^:]+):(?P<line>\d+):\s*(?:export\s+)?(?P<name>" + _VAR + r")=(?P<value>.*)$")


def parse_settings(text: str) -> list[Setting]:
    out = []
    for raw in text.splitlines():
        m = _SETTING.match(raw.strip())
        if m:
            value = m["value"].strip()
            if len(value) >= 2 and value[0] == value[-1] and value[0] in "\"'":
                value = value[1:-1]
            out.append(Setting(m["path"], int(m["line"]), m["name"], value))
    return out


def parse_sshd_dropins(text: str) -> list[tuple[str, str, str]]:
    out = []
    for raw in text.splitlines():
        path, sep, rest = raw.partition(":")
        if not sep:
            continue
        parts = re.split(r"[\s=]+", rest.strip(), maxsplit=1)
        if len(parts) == 2:
            key = keyword(parts[0])
            out.append((path, key, parts[1].strip()))
    return out
