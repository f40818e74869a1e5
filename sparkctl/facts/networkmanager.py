"""Parse the gather script's `nm` section: nmcli's terse answers, in the C locale, into a NetworkManagerView.

The section prints `#devices`, `#connections` and `#settings` blocks (only `#devices` with nmcli's error when
NetworkManager is not running; `#absent` without nmcli).
Terse lists (`nmcli -t`) escape `:` and `\\` inside values with a backslash; terse details (`connection show
<uuid>`) print `field:value` with the value as is. Real outputs of NetworkManager 1.42 are in
tests/fixtures/nmcli/.
"""

from __future__ import annotations

from sparkctl.facts.model import NetworkManagerView, NmDevice, NmProfile

NOT_RUNNING = "NetworkManager is not running"


def split_terse(line: str) -> list[str]:
    """One `nmcli -t` line into its fields: `:` separates, `\\:` and `\\\\` are a literal colon and backslash."""
    fields, current, escaped = [], [], False
    for ch in line:
        if escaped:
            current.append(ch)
            escaped = False
        elif ch == "\\":
            escaped = True
        elif ch == ":":
            fields.append("".join(current))
            current = []
        else:
            current.append(ch)
    fields.append("".join(current))
    return fields


def _blocks(text: str) -> dict[str, list[str]]:
    blocks: dict[str, list[str]] = {}
    current: list[str] | None = None
    for line in text.splitlines():
        if line in ("#absent", "#devices", "#connections", "#settings"):
            current = blocks.setdefault(line[1:], [])
        elif current is not None:
            current.append(line)
    return blocks


def _errors(lines: list[str]) -> str:
    return next((line[len("Error: "):] for line in lines if line.startswith("Error: ")), "")


def parse_devices(lines: list[str]) -> list[NmDevice]:
    devices = []
    for line in lines:
        fields = split_terse(line)
        if len(fields) == 4 and fields[0]:
            devices.append(NmDevice(name=fields[0], type=fields[1], state=fields[2], connection=fields[3]))
    return devices


def parse_profiles(lines: list[str]) -> list[NmProfile]:
    """UUID,NAME,TYPE,DEVICE,ACTIVE,AUTOCONNECT,AUTOCONNECT-PRIORITY,FILENAME lines."""
    profiles = []
    for line in lines:
        fields = split_terse(line)
        if len(fields) != 8 or not fields[0]:
            continue
        uuid, name, kind, device, active, autoconnect, priority, filename = fields
        profiles.append(NmProfile(name=name, uuid=uuid, type=kind, device=device if active == "yes" else "",
                                  autoconnect=autoconnect == "yes", priority=_int(priority), filename=filename))
    return profiles


def parse_settings(lines: list[str]) -> dict[str, dict[str, str]]:
    """`connection show <uuid>...` in terse detail: blocks of `field:value`, each opening with connection.uuid."""
    by_uuid: dict[str, dict[str, str]] = {}
    current: dict[str, str] | None = None
    for line in lines:
        field, sep, value = line.partition(":")
        if not sep:
            continue
        if field == "connection.uuid":
            current = by_uuid.setdefault(value, {})
        elif current is not None:
            current[field] = value
    return by_uuid


def parse_nmcli(text: str) -> NetworkManagerView | None:
    """The section's text into a view; None when the node has no nmcli."""
    blocks = _blocks(text)
    if "absent" in blocks:
        return None
    lines = blocks.get("devices", [])
    error = _errors(lines)
    if error:
        status = "stopped" if NOT_RUNNING in error else "error"
        return NetworkManagerView(status=status, detail=error, raw=text)
    devices = parse_devices(lines)
    if not devices or "connections" not in blocks:
        return NetworkManagerView(status="error", detail=" ".join(lines).strip() or "no answer", raw=text)
    profiles = parse_profiles(blocks.get("connections", []))
    settings = parse_settings(blocks.get("settings", []))
    for profile in profiles:
        values = settings.get(profile.uuid, {})
        profile.interface_name = values.get("connection.interface-name", "")
        profile.mac = values.get("802-3-ethernet.mac-address", "").lower()
    return NetworkManagerView(status="running", devices=devices, profiles=profiles, raw=text)


def _int(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        return 0
