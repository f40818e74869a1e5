"""`lldpcli show neighbors -f json` -> Lldp.

The shape of lldpcli's JSON depends on how many things there are (lldpd src/client/json_writer.c,
json_element_cleanup): a list of one element becomes that element (one neighbour: `"interface": {...}`, several:
`"interface": [{...}, {...}]`; one management address: a string, two: a list), an object whose only key is
`value` becomes that string, and an object with a `name` string becomes `{name: the rest}` (the chassis is keyed
by the system name when the neighbour sends one, and is the bare object when it does not). Real captures of each
case: tests/fixtures/lldp/.
"""

from __future__ import annotations

import json
from typing import Any

from sparkctl.facts.model import Lldp, LldpNeighbor

#: The gather section prints this instead of running lldpcli when the node has none.
ABSENT = "#absent"
#: lldpcli's words when lldpd is not running (lldpd 1.0.16: "unable to connect to socket /run/lldpd.socket").
_STOPPED = "unable to connect to socket"
_DENIED = ("Permission denied", "a password is required", "a terminal is required")


def _many(value: Any) -> list[Any]:
    """A member that is a list when there are several and the thing itself when there is one."""
    if value is None:
        return []
    return value if isinstance(value, list) else [value]


def _text(value: Any) -> str:
    if isinstance(value, dict):
        value = value.get("value", "")
    return "" if value is None or isinstance(value, (dict, list)) else str(value)


def _unnamed(value: Any) -> tuple[str, dict]:
    """(name, object) of an element lldpcli keyed by its name, or ("", object) when it had none."""
    if not isinstance(value, dict):
        return "", {}
    if len(value) == 1:
        (key, inner), = value.items()
        if isinstance(inner, dict) and key not in ("id", "descr", "ttl"):
            return key, inner
    return "", value


def _id(value: Any) -> tuple[str, str]:
    """(type, value) of a chassis or port id: `{"type": "mac", "value": "..."}`."""
    if isinstance(value, dict):
        return str(value.get("type", "")), _text(value)
    return "", _text(value)


def _neighbor(interface: str, body: dict) -> LldpNeighbor:
    system: str = ""
    chassis: dict[str, Any] = {}
    for entry in _many(body.get("chassis")):
        system, chassis = _unnamed(entry)
        break
    _ctype, chassis_id = _id(chassis.get("id"))
    found = body.get("port")
    port: dict[str, Any] = found if isinstance(found, dict) else {}
    port_type, port_id = _id(port.get("id"))
    return LldpNeighbor(interface=interface, system=system, chassis_id=chassis_id, port_id=port_id,
                        port_id_type=port_type, port_descr=_text(port.get("descr")),
                        mgmt_ips=[_text(ip) for ip in _many(chassis.get("mgmt-ip")) if _text(ip)])


def parse_neighbors_json(text: str) -> list[LldpNeighbor]:
    """Neighbours from `lldpcli show neighbors -f json` (warnings on stderr before the JSON are skipped)."""
    start = text.find("{")
    if start < 0:
        raise ValueError("no JSON in lldpcli's output")
    document, _ = json.JSONDecoder().raw_decode(text[start:])
    lldp = document.get("lldp") if isinstance(document, dict) else None
    if not isinstance(lldp, dict):
        raise ValueError("lldpcli's JSON has no lldp object")
    out = []
    for entry in _many(lldp.get("interface")):
        interface, body = _unnamed(entry)
        if interface:
            out.append(_neighbor(interface, body))
    return out


def parse_lldp(text: str) -> Lldp:
    """The gather section's output: lldpcli's JSON, its complaint, or ABSENT."""
    stripped = text.strip()
    if stripped == ABSENT:
        return Lldp("absent", "lldpcli is not installed")
    if _STOPPED in text:
        return Lldp("stopped", "lldpd is not running (" + _last_line(text) + ")")
    if any(word in text for word in _DENIED) and "{" not in text:
        return Lldp("denied", _last_line(text))
    try:
        return Lldp("ok", neighbors=parse_neighbors_json(text))
    except ValueError as exc:
        return Lldp("error", f"{exc}: {_last_line(text)[:200]}")


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else ""
