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
from sparkctl.plan.render import render
from sparkctl.rules.mesh import Try
from sparkctl.shipped import shipped_text, without_comments
from sparkctl.tasks.context import ClusterContext
from sparkctl.tasks.proof import digest, fabric_state, pair_id
from sparkctl.transport.base import q
from sparkctl.transport.framing import Framing

#: the record's key for the node-to-node mesh (runs/proofs.py keeps it beside the MPI proof)
HOST_MESH = "ssh-mesh"
#: the section of ssh.keys' read that holds what login_script prints
SECTION = "login"
#: the section of the root read that holds the login state's `#root` part (sshd_as_root)
ROOT_SECTION = "login-root"

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


def login_script(ctx: ClusterContext, node: str, key: str, sshd: bool = True) -> str:
    """The `login` section's shell for `node` (key: the cluster key's file name in ~/.ssh); `sshd=False`: without
    its `#root` part (read as root beside the facts instead: sshd_as_root)."""
    user, port, sources = _digest_arguments(ctx, node)
    return render("ssh-login-state.sh.j2", key=key, user=user, port=port, sources=sources,
                  digest=without_comments(shipped_text("sshd-digest.sh")) if sshd else "")


def sshd_as_root(ctx: ClusterContext, node: str, framing: Framing) -> str | None:
    """The login state's `#root` part (sshd-digest.sh) as a root read ahead, in the facts' root shell
    (tasks/read_ahead.py): the same digests without a `sudo` of their own, in section ROOT_SECTION. None where the
    node gives no passwordless sudo (the login state's own read asks sudo, or reads what the user may)."""
    if not ctx.nodes[node].facts().sudo_nopasswd:
        return None
    user, port, sources = _digest_arguments(ctx, node)
    return framing.section(ROOT_SECTION, "\n".join([
        "echo '#root'", f"set -- {q(user)} {port} {' '.join(q(s) for s in sources)}",
        without_comments(shipped_text("sshd-digest.sh"))]))


def _digest_arguments(ctx: ClusterContext, node: str) -> tuple[str, int, list[str]]:
    """sshd-digest.sh's arguments for `node`: the cluster user, its sshd's port, the source/local pairs."""
    inv = ctx.inventory
    port = int(inv.node(node).port or inv.ssh.port or 22)
    sources = [f"{src}/{local}" for src, local in source_addresses(ctx, node)] or ["none/none"]
    return inv.user, port, sources


#: the lines of the `login` section that are one value each (the others are `#name` blocks of raw lines)
_NAMED = ("boot", "stat", "groups", "passwd", "shell", "nologin", "sshd")
#: the ~/.ssh files whose rewrite (inode, mtime, mode, owner) a pair depends on, and those sshd's StrictModes judges
_WRITTEN = ("/.ssh/authorized_keys", "/.ssh/known_hosts", "/.ssh/config")


def parse_login(text: str | None, groups: list[str] | None = None) -> dict[str, str]:
    """What ssh-login-state.sh.j2 printed, as the values a fingerprint takes: boot, key, client, perms, written,
    account, service, files, and the sshd digests as `sshd <source>`. `groups`: the user's groups, as the facts
    read them (the login state printed its own before)."""
    named: dict[str, list[str]] = {}
    blocks: dict[str, list[str]] = {}
    block: list[str] | None = None
    for line in (text or "").splitlines():
        name, _, value = line.partition(" ")
        if line.startswith("#"):
            block = blocks.setdefault(line[1:].strip(), [])
        elif name in _NAMED:
            named.setdefault(name, []).append(value)
        elif block is not None and line:
            block.append(line)
    out: dict[str, str] = {}
    if "boot" in named:
        out["boot"] = named["boot"][0].strip()
    stats = [value.split(" ", 5) for value in named.get("stat", [])]
    stats = [fields for fields in stats if len(fields) == 6]  # inode size mtime mode owner path
    if stats:
        keys = [f for f in stats if "/.ssh/" in f[5] and not f[5].endswith(_WRITTEN)]
        out["key"] = " ".join(keys[0][:5]) if keys else ""
        # $HOME, ~/.ssh and authorized_keys
        out["perms"] = " ".join(f"{f[3]}:{f[4]}" for f in stats
                                if f not in keys and not f[5].endswith(_WRITTEN[1:]))
        out["written"] = " ".join(f"{f[0]}:{f[2]}:{f[3]}:{f[4]}" for f in stats if f[5].endswith(_WRITTEN))
    if "groups" in named or "passwd" in named or "shell" in named:
        listed = named["groups"][0].split() if "groups" in named else groups or []
        shell = named["shell"][:1] if "shell" in named else named.get("passwd", [""])[0].strip().split(":")[6:7]
        out["account"] = " ".join([",".join(listed), *(s.strip() for s in shell),
                                   *(["nologin"] if "nologin" in named else [])])
    for name in ("client", "service", "files"):
        if name in blocks:
            out[name] = digest(blocks[name])[:16]
    for value in named.get("sshd", []):
        source, _, sha = value.partition(" ")
        out[f"sshd {source}"] = sha.split()[0][:16] if sha.split() else ""
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
    logins = {node: parse_login(found.get(SECTION), ctx.nodes[node].facts().groups) for node, found in inputs.items()}
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
