"""What one node-to-node ssh login depends on, for its proof on record (tasks/proof.py PairProofs).

A pair (node -> peer at an address) is fingerprinted by: the node's cluster key (its public half, and the private
file's inode, size, mtime, mode and owner), its known_hosts and ~/.ssh/config (content, and inode, mtime, mode and
owner: a file rewritten, by ssh.mesh's repair or anyone, is proven again; one ssh would refuse is too), its system
ssh client configuration (/etc/ssh/ssh_config and ssh_config.d), the exact try (rules/mesh.py: address, port, user,
options); the peer's authorized_keys (the same), its ssh host key, the modes and owners sshd's StrictModes judges
($HOME, ~/.ssh, authorized_keys), the cluster user's groups, login shell and /etc/nologin, its boot, the ssh
service's start and last reload (systemd), the digest of its sshd configuration files and of `sshd -T` as evaluated
for the node's addresses and the cluster user (per source address when a `Match` block could tell them apart, else
once); and both nodes' fabric as their facts show it (tasks/proof.py fabric_state). Without passwordless sudo `sshd
-T` cannot be read (it loads the host keys): the readable configuration files' digest and the service's start and
reload stand in. What a pair cannot see (a PAM rule, a directory service) is caught by `doctor`, which proves every
pair and takes a broken one off the record. The ~/.ssh files are ssh.keys' read; the rest is this module's `login`
section, which rides in the same read (and so, on a rerun, in the facts round trip).
"""

from __future__ import annotations

import ipaddress

from sparkctl import __version__
from sparkctl.rules.mesh import Try
from sparkctl.tasks.context import ClusterContext
from sparkctl.tasks.proof import digest, fabric_state, pair_id
from sparkctl.transport.base import q

#: the record's key for the node-to-node mesh (runs/proofs.py keeps it beside the MPI proof)
HOST_MESH = "ssh-mesh"
#: the section of ssh.keys' read that holds what login_script prints
SECTION = "login"

# What only root may read: sshd's files (0600 drop-ins) and `sshd -T` (it loads the host keys). ONE shell reads it
# all, as root where that takes no password (`sudo -n` once, not once per command: each sudo costs ~10 ms of the
# node's CPU and a line in its auth log), else as the user: then only the readable files' digest counts.
# $1: the cluster user, $2: sshd's port, then "source/local" address pairs.
_AS_ROOT = r"""_h() { sha256sum | cut -c1-16; }
_U=$1; _P=$2; shift 2
printf 'files %s\n' "$(cat /etc/ssh/sshd_config /etc/ssh/sshd_config.d/*.conf 2>/dev/null | _h)"
_D=$(command -v sshd 2>/dev/null || echo /usr/sbin/sshd)
if grep -qisE '^[[:space:]]*match[[:space:]]' /etc/ssh/sshd_config /etc/ssh/sshd_config.d/*.conf; then
  for _a in "$@"; do
    _src=${_a%%/*}; _l=${_a#*/}
    printf 'sshd %s %s\n' "$_src" "$("$_D" -T -C "user=$_U,host=$_src,addr=$_src,laddr=$_l,lport=$_P" 2>&1 | _h)"
  done
else
  printf 'sshd * %s\n' "$("$_D" -T 2>&1 | _h)"
fi
exit 0"""

_LOGIN = r"""_h() { sha256sum | cut -c1-16; }
printf 'boot %s\n' "$(cat /proc/sys/kernel/random/boot_id 2>/dev/null)"
printf 'key %s\n' "$(stat -c '%i %s %Y %a %u' "$HOME"/.ssh/KEY 2>/dev/null)"
printf 'client %s\n' "$(cat /etc/ssh/ssh_config /etc/ssh/ssh_config.d/*.conf 2>/dev/null | _h)"
printf 'perms %s\n' "$(stat -c '%a:%u' "$HOME" "$HOME"/.ssh "$HOME"/.ssh/authorized_keys 2>/dev/null | tr '\n' ' ')"
printf 'written %s\n' "$(cd "$HOME"/.ssh 2>/dev/null && stat -c '%i:%Y:%a:%u' authorized_keys known_hosts config \
  2>/dev/null | tr '\n' ' ')"
printf 'account %s\n' "$(id -Gn 2>/dev/null | tr ' ' ,) $(getent passwd "$(id -un)" | cut -d: -f7) \
$([ -e /etc/nologin ] && echo nologin)"
printf 'service %s\n' "$(systemctl show -p MainPID -p ExecMainStartTimestampMonotonic -p ExecReload ssh.service \
  ssh.socket 2>/dev/null | _h)"
_R=AS_ROOT
if [ "$(id -u)" = 0 ]; then sh -c "$_R" sh USER PORT SOURCES
else sudo -n sh -c "$_R" sh USER PORT SOURCES 2>/dev/null || sh -c "$_R" sh USER PORT SOURCES; fi"""


def _ip(host: object) -> str | None:
    try:
        return str(ipaddress.ip_address(str(host)))
    except ValueError:
        return None  # a host name: sshd matches on addresses


def source_addresses(ctx: ClusterContext, node: str) -> list[tuple[str, str]]:
    """(source, local) address pairs `node`'s sshd may see a cluster login come from: every fabric address of every
    peer with the node's own address on that subnet (else its first fabric address), and every peer's management
    address (when it is one) with the node's own."""
    plan = ctx.plan()
    mine = list(plan.fabric.addresses.get(node, {}).values())
    first = plan.fabric.first_address(node)
    own_management = _ip(ctx.inventory.node(node).host)
    out: list[tuple[str, str]] = []
    for spec in ctx.inventory.nodes:
        if spec.name == node:
            continue
        for address in plan.fabric.addresses.get(spec.name, {}).values():
            local = next((a.ip for a in mine if address.ip in a.network), first)
            out.append((str(address.ip), str(local if local is not None else "0.0.0.0")))
        management = _ip(spec.host)
        if management is not None:
            out.append((management, own_management or "0.0.0.0"))
    return out


def login_script(ctx: ClusterContext, node: str, key: str) -> str:
    """The `login` section's shell for `node` (key: the cluster key's file name in ~/.ssh)."""
    inv = ctx.inventory
    port = int(inv.node(node).port or inv.ssh.port or 22)
    sources = " ".join(q(f"{src}/{local}") for src, local in source_addresses(ctx, node)) or "none/none"
    return (_LOGIN.replace("AS_ROOT", q(_AS_ROOT)).replace("KEY", q(key)).replace("SOURCES", sources)
            .replace("USER", q(inv.user)).replace("PORT", str(port)))


def parse_login(text: str | None) -> dict[str, str]:
    """`name value` lines; the sshd digests as `sshd <source>`."""
    out: dict[str, str] = {}
    for line in (text or "").splitlines():
        name, _, value = line.partition(" ")
        if name == "sshd":
            source, _, value = value.partition(" ")
            name = f"sshd {source}"
        if name:
            out[name] = value.strip()
    return out


def _sshd_seen_from(login: dict[str, str], sources: list[str]) -> list[str]:
    """The peer's `sshd -T` digests that a login from these addresses meets."""
    if "sshd *" in login:
        return [login["sshd *"]]
    return [f"{s} {login.get(f'sshd {s}', '')}" for s in sorted(sources)]


def host_fingerprints(ctx: ClusterContext, inputs: dict[str, dict[str, str | None]],
                      tries: dict[str, list[Try]]) -> dict[str, str]:
    """pair id -> fingerprint, for every try of every node whose read (ssh.keys' sections) is at hand. Each node's
    side is digested once, as a source and as a target; a pair's own work is one short digest."""
    plan = ctx.plan()
    logins = {node: parse_login(found.get(SECTION)) for node, found in inputs.items()}
    fabric = {node: fabric_state(ctx, node) for node in inputs}
    as_source = {node: digest([found.get(k) for k in ("pub", "known_hosts", "config")],
                              [logins[node].get(k) for k in ("key", "client", "written")], fabric[node])
                 for node, found in inputs.items()}
    as_target = {node: digest([found.get(k) for k in ("authorized_keys", "hostkey")],
                              [logins[node].get(k) for k in ("boot", "perms", "written", "account", "service",
                                                             "files")],
                              logins[node].get("sshd *"), fabric[node])
                 for node, found in inputs.items()}
    out = {}
    for node, node_tries in tries.items():
        if node not in inputs:
            continue
        sources = [str(a.ip) for a in plan.fabric.addresses.get(node, {}).values()]
        sources.append(str(ctx.inventory.node(node).host))
        for attempt in node_tries:
            if attempt.peer not in inputs:
                continue
            sshd = _sshd_seen_from(logins[attempt.peer], sources)
            out[pair_id(node, attempt.peer, attempt.target)] = digest(
                __version__, attempt.argv, as_source[node], as_target[attempt.peer], sshd)
    return out
