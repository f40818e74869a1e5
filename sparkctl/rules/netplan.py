"""PURE: which netplan files configure which interfaces (netplan merges them: addresses pile up), and moving
a conflicting stanza out."""

from __future__ import annotations

import yaml


def interfaces_in(content: str | None) -> dict[str, str]:
    """{key or match name: key} for every ethernet stanza of a netplan document ({} if unparsable)."""
    try:
        doc = yaml.safe_load(content or "") or {}
    except yaml.YAMLError:
        return {}
    ethernets = ((doc.get("network") or {}).get("ethernets") or {}) if isinstance(doc, dict) else {}
    found: dict[str, str] = {}
    for key, body in ethernets.items():
        found[str(key)] = str(key)
        match = (body or {}).get("match") or {} if isinstance(body, dict) else {}
        if isinstance(match, dict) and match.get("name"):
            found[str(match["name"])] = str(key)
    return found


def conflicting_stanzas(files: list, own_path: str, interfaces: list[str]) -> dict[str, list[str]]:
    """{other file: [stanza keys]} that configure any of our interfaces (netplan would merge their addresses)."""
    out: dict[str, list[str]] = {}
    for f in files:
        if f.path == own_path or f.content is None:
            continue
        keys = sorted({key for name, key in interfaces_in(f.content).items() if name in interfaces})
        if keys:
            out[f.path] = keys
    return out


def without_stanzas(content: str, keys: list[str]) -> str:
    """The document with those ethernet stanzas removed (comments are lost: the original is backed up)."""
    doc = yaml.safe_load(content) or {}
    ethernets = doc.get("network", {}).get("ethernets", {})
    for key in keys:
        ethernets.pop(key, None)
    if not ethernets:
        doc["network"].pop("ethernets", None)
    return yaml.safe_dump(doc, sort_keys=False, default_flow_style=False)
