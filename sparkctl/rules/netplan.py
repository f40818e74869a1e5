"""PURE: which netplan files configure which interfaces (netplan merges them: addresses pile up), moving a
conflicting stanza out, and which daemon netplan renders an interface with."""

from __future__ import annotations

import posixpath

import yaml

NETWORKMANAGER = "NetworkManager"
NETWORKD = "networkd"


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


def conflicting_stanzas(files: list, own_path: str, interfaces: list[str],
                        also: set[str] | frozenset[str] = frozenset()) -> dict[str, list[str]]:
    """{other file: [stanza keys]} that configure any of our interfaces (netplan would merge their addresses),
    and the stanzas named in `also` (known, from NetworkManager, to take one of them)."""
    out: dict[str, list[str]] = {}
    for f in files:
        if f.path == own_path or f.content is None:
            continue
        keys = sorted({key for name, key in interfaces_in(f.content).items() if name in interfaces or key in also})
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


def renderer_of(files: list, stanza: str) -> str:
    """What netplan renders the ethernet stanza `stanza` (sparkctl names its stanzas after the interfaces) with,
    from the node's files: `NetworkManager` or `networkd` (or another backend netplan knows). As netplan's parser
    decides it (checked against the real `netplan generate` in tests/unit/test_netplan_renderer.py): files are read
    in order of their names, stanzas of one name merge; the stanza's own `renderer`, else the `renderer` of its
    `ethernets:` block, wins (the last file that says so); else the global `network: renderer:` of the LAST file
    that sets one, wherever the stanza is (on DGX OS, 01-network-manager-all.yaml); else networkd. A stanza of
    another name that matches the same device is another definition (conflicting_stanzas moves it out)."""
    global_renderer = own = None
    for f in sorted(files, key=lambda f: posixpath.basename(f.path)):
        network = _network(f.content)
        if isinstance(network.get("renderer"), str):
            global_renderer = network["renderer"]
        ethernets = network.get("ethernets")
        if not isinstance(ethernets, dict):
            continue
        block = ethernets.get("renderer") if isinstance(ethernets.get("renderer"), str) else None
        body = ethernets.get(stanza)
        if stanza != "renderer" and isinstance(body, dict):
            own = (body.get("renderer") if isinstance(body.get("renderer"), str) else None) or block or own
    return own or global_renderer or NETWORKD


def _network(content: str | None) -> dict:
    try:
        doc = yaml.safe_load(content or "") or {}
    except yaml.YAMLError:
        return {}
    network = doc.get("network") if isinstance(doc, dict) else None
    return network if isinstance(network, dict) else {}
