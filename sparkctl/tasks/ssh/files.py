"""PURE editing of authorized_keys, known_hosts (hashed entries included) and ssh_config blocks.

sparkctl marks its own lines (a comment naming the cluster) so it can update and remove exactly them.
"""

from __future__ import annotations

import base64
import hashlib
import hmac


def key_marker(cluster: str) -> str:
    return f"sparkctl:{cluster}"


def _host_patterns(line: str) -> list[str]:
    if not line.strip() or line.lstrip().startswith("#"):
        return []
    fields = line.split()
    first = fields[0]
    if first.startswith("@") and len(fields) > 1:  # @cert-authority / @revoked
        first = fields[1]
    return first.split(",")


def _matches(pattern: str, host: str) -> bool:
    if pattern.startswith("|1|"):
        try:
            _, _, salt, digest = pattern.split("|", 3)
            mac = hmac.new(base64.b64decode(salt), host.encode(), hashlib.sha1).digest()
            return hmac.compare_digest(base64.b64encode(mac).decode(), digest)
        except (ValueError, TypeError):
            return False
    return pattern == host


def known_hosts_lines(entries: list[tuple[list[str], str]], cluster: str) -> list[str]:
    """entries: (host names, 'keytype base64') -> marked known_hosts lines."""
    return [f"{','.join(names)} {key} {key_marker(cluster)}" for names, key in entries]


def merge_known_hosts(current: str, wanted: list[str], names: set[str], cluster: str) -> str:
    """Drop our old lines and any other line (hashed or not) for the same names; append the wanted lines."""
    marker = key_marker(cluster)
    keep = []
    for line in current.splitlines():
        if line.rstrip().endswith(" " + marker):
            continue
        if any(_matches(p, n) for p in _host_patterns(line) for n in names):
            continue
        keep.append(line)
    return "\n".join(keep + wanted) + "\n"


def merge_authorized_keys(current: str, wanted: list[str], cluster: str) -> str:
    """Every wanted key exactly once; old keys of this cluster removed; the user's other lines untouched."""
    wanted_keys = {_key_body(w) for w in wanted}
    prefix = f"sparkctl-{cluster}@"
    keep = []
    for line in current.splitlines():
        body = _key_body(line)
        comment = line.split()[-1] if len(line.split()) > 2 else ""
        if body in wanted_keys or comment.startswith(prefix):
            continue
        keep.append(line)
    return "\n".join(keep + wanted) + "\n"


def _key_body(line: str) -> str:
    fields = line.split()
    for i, field in enumerate(fields):
        if field.startswith(("ssh-", "ecdsa-", "sk-")) and i + 1 < len(fields):
            return fields[i + 1]
    return ""


def block_markers(cluster: str) -> tuple[str, str]:
    return f"# BEGIN sparkctl {cluster}", f"# END sparkctl {cluster}"


def merge_config_block(current: str, block: str, cluster: str) -> str:
    """Our Host block first in ~/.ssh/config (ssh takes the first value it finds), the rest untouched."""
    begin, end = block_markers(cluster)
    lines = current.splitlines()
    out, inside = [], False
    for line in lines:
        if line.strip() == begin:
            inside = True
            continue
        if line.strip() == end:
            inside = False
            continue
        if not inside:
            out.append(line)
    rest = "\n".join(out).strip("\n")
    ours = f"{begin}\n{block.rstrip()}\n{end}\n"
    return ours + ("\n" + rest + "\n" if rest else "")


def remove_config_block(current: str, cluster: str) -> str:
    begin, end = block_markers(cluster)
    out, inside = [], False
    for line in current.splitlines():
        if line.strip() == begin:
            inside = True
        elif line.strip() == end:
            inside = False
        elif not inside:
            out.append(line)
    text = "\n".join(out).strip("\n")
    return text + "\n" if text else ""
