"""PURE: proving every ordered pair of a mesh (ssh between nodes, ssh between containers, pings across links)
from each node at once, paced so no target is flooded, and reading the verdicts back.

One script per node: it tries its own outgoing pairs, a few at a time, and prints one verdict line per pair.
Bootstrap's verify tasks and doctor's probes both use it, so they agree on what a broken pair is.

Pacing: node i's r-th try goes to node i+r (mod N). In each step every node receives exactly ONE try, so
with WAVE tries in flight per node, a target sees about WAVE new connections at once, whatever N is. OpenSSH's
default `MaxStartups 10:30:100` starts dropping unauthenticated connections past 10 (OpenSSH's sshd_config(5),
MaxStartups); WAVE leaves room for nodes drifting a wave apart, and for mpirun's and sparkctl's own sessions.

Verdicts: `ok`, `fail` (the pair is broken: refused, denied, host key, no route) and `unknown` (the try could
not run: the target reset or timed out the handshake, which is what an overloaded sshd does; retried first).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from sparkctl.inventory import Inventory
from sparkctl.plan.fabric import FabricPlan
from sparkctl.plan.render import render
from sparkctl.plan.ssh import peer_route
from sparkctl.shipped import shipped_text
from sparkctl.transport.base import q

#: Tries one node has in flight at once (and so, about the new connections one target receives at once).
WAVE = 4
#: Tries per pair when the handshake was reset or timed out (not when the pair is plainly broken).
ATTEMPTS = 3
CONNECT_TIMEOUT = 5

# What an overloaded sshd does to a connection it will not serve (MaxStartups, a full accept queue): the try
# could not run, the pair is not known to be broken. ssh's own words (OpenSSH 9.x, sshconnect.c / kex.c).
_TRANSIENT = ("kex_exchange_identification", "Connection reset by peer", "Connection closed by remote host",
              "banner exchange", "Broken pipe", "ssh_dispatch_run_fatal")

# What a pair proves is that the peer's sshd, at the pinned host key, accepts the node's key for the user: all
# of that is settled once authentication succeeds. So the try opens no session channel (-N) and ends right there:
# ssh runs LocalCommand only after host key verification and authentication, and it prints the mark and ends its
# own ssh (LocalCommand runs under $SHELL, which _try sets to /bin/sh: the user's login shell may be fish or a
# wrapper). The peer then starts no shell and no command, which halved a try's cost in the lab (0.12 vs 0.22 s per
# try, one after another). A user's ControlMaster is bypassed: through a live master there would be no
# authentication to prove. That the ranks' daemons really start over ssh is verify.fabric's MPI probe's to prove.
AUTHENTICATED = "sparkctl-mesh-authenticated"
# (rendered by hand in double quotes: the `$PPID` is the shell's that ssh runs LocalCommand under)
_AUTHENTICATED_THEN_QUIT = ("-o ControlMaster=no -o ControlPath=none -o PermitLocalCommand=yes -o "
                            f'"LocalCommand=echo {AUTHENTICATED} >&2; kill \\$PPID"')
#: A try still running after this long (a peer's sshd that accepted the connection and went silent) is stopped:
#: the pair could not be checked.
TRY_LIMIT = 30


def prelude() -> str:
    """What every mesh script starts with (templates/mesh-try.sh.j2): `$_K`, the cheap key exchange where ssh
    knows it, and `_try PEER TARGET argv...`."""
    return render("mesh-try.sh.j2", try_limit=TRY_LIMIT, authenticated=AUTHENTICATED, transient=_TRANSIENT,
                  attempts=ATTEMPTS)


def schedule(order: Sequence[str], node: str) -> list[str]:
    """The peers `node` tries, in the order it tries them: node i's r-th try goes to node i+r, so in every
    step each node is the target of exactly one try."""
    i = list(order).index(node)
    return [order[(i + r) % len(order)] for r in range(1, len(order))]


@dataclass(frozen=True)
class Try:
    peer: str
    target: str            # what the verdict names (an address, or user@address)
    argv: str              # the command, already quoted for the shell, with $_K where ssh options go


def ssh_try(peer: str, target: str, options: str = "", user: str | None = None) -> Try:
    """`ssh -N -o BatchMode=yes ... target`: passwordless, host key pinned (no prompt), quick to give up, and
    done once the peer has accepted the key (see _AUTHENTICATED_THEN_QUIT)."""
    where = f"{user}@{target}" if user else target
    extra = f" {options}" if options else ""
    argv = (f"ssh -N -o BatchMode=yes -o ConnectTimeout={CONNECT_TIMEOUT} {_AUTHENTICATED_THEN_QUIT} "
            f'${{_K:+"$_K"}}{extra} {q(where)}')
    return Try(peer, where, argv)


def host_tries(inventory: Inventory, fabric: FabricPlan, order: Sequence[str], node: str) -> list[Try]:
    """ssh from the node to every other node as the cluster user, the way plan/ssh.py peer_route reaches it."""
    return [ssh_try(peer, *peer_route(inventory, fabric, node, peer)) for peer in schedule(order, node)]


def container_tries(fabric: FabricPlan, order: Sequence[str], node: str, options: str = "") -> list[Try]:
    """ssh from the node's container to every peer's container (root; inside the container its ssh config gives
    the port, key and pinned host keys; from the node, `options` name them), at the peer's address on the first
    subnet they share: the one mpirun's daemons use. A peer with no shared subnet is reached through the routes
    the fabric plan gives (its first address)."""
    mine = {a.network for a in fabric.addresses.get(node, {}).values()}
    out = []
    for peer in schedule(order, node):
        theirs = list(fabric.addresses.get(peer, {}).values())
        addr = next((a for a in theirs if a.network in mine), None)
        if addr is None:
            first = fabric.first_address(peer)
            addr = next((a for a in theirs if a.ip == first), None)
        if addr is not None:
            out.append(ssh_try(peer, str(addr.ip), options, user="root"))
    return out


def waves(tries: Sequence[Try], wave: int = WAVE) -> str:
    """The tries in waves of `wave` (each try in the background, then `wait`), in the order given."""
    lines = []
    for start in range(0, len(tries), wave):
        batch = tries[start:start + wave]
        lines += [f"_try {q(t.peer)} {q(t.target)} {t.argv} &" for t in batch]
        lines.append("wait")
    return "\n".join(lines)


def mesh_script(tries: Sequence[Try], wave: int = WAVE) -> str:
    """The whole script of one node (prelude and waves); empty when there is nothing to try."""
    return f"{prelude()}\n{waves(tries, wave)}" if tries else ""


def mesh_timeout(tries: int, wave: int = WAVE) -> float:
    """How long one node's script may take: every wave's tries all retried to their connect timeout."""
    rounds = -(-tries // max(1, wave))
    return 30.0 + rounds * ATTEMPTS * (CONNECT_TIMEOUT + 2)


@dataclass(frozen=True)
class Verdict:
    node: str
    peer: str
    target: str
    state: str             # "ok" | "fail" | "unknown"
    error: str = ""


def parse_verdicts(node: str, stdout: str) -> list[Verdict]:
    out = []
    for line in stdout.splitlines():
        state, _, rest = line.partition(" ")
        if state not in ("ok", "fail", "unknown"):
            continue
        peer, _, rest = rest.partition(" ")
        target, _, error = rest.partition(" ")
        out.append(Verdict(node, peer, target, state, error.strip()))
    return out


def missing_verdicts(node: str, tries: Sequence[Try], verdicts: Sequence[Verdict], why: str) -> list[Verdict]:
    """An `unknown` for every try that printed no verdict (the script was cut short, the node went away)."""
    seen = {(v.peer, v.target) for v in verdicts}
    return [Verdict(node, t.peer, t.target, "unknown", why) for t in tries if (t.peer, t.target) not in seen]


#: Pings one node has in flight at once (ICMP has no MaxStartups; this only keeps a big node's burst small). Each
#: waits 1 s for its reply (`-W 1`, templates/mesh-ping.sh): a cabled or switched fabric answers in well under a
#: millisecond, so a second is only what a dropped jumbo frame or a dead link costs, three times over before it is
#: called dead.
PING_WAVE = 8


@dataclass(frozen=True)
class Ping:
    interface: str
    peer: str
    address: str


def link_pings(fabric: FabricPlan, order: Sequence[str], node: str,
               routes: dict[str, list[tuple[str, str]]] | None = None) -> list[Ping]:
    """Every peer address on every twin subnet of the node, and every address a route of the node leads to (a
    ring's: through a neighbour, relayed beyond it), peers in the paced order of schedule()."""
    rank = {peer: i for i, peer in enumerate(schedule(order, node))} if node in order else {}
    pings = [Ping(link.interface, peer, str(paddr.ip)) for link in fabric.links(node)
             for peer, _pif, paddr in link.peers]
    owners = {str(a.ip): peer for peer, addrs in fabric.addresses.items() for a in addrs.values()}
    for iface, planned in (routes or {}).items():
        for to, _via in planned:
            address = to.split("/")[0]
            if address in owners:
                pings.append(Ping(iface, owners[address], address))
    return sorted(pings, key=lambda p: rank.get(p.peer, len(rank)))


def ping_script(pings: Sequence[Ping], size: int, wave: int = PING_WAVE) -> str:
    """Don't-fragment pings of `size` bytes, a few at a time, each tried twice before a small ping tells an MTU
    problem (`mtu`) from a dead link (`dead`); one line per ping: `VERDICT IFACE PEER ADDRESS`."""
    if not pings:
        return ""
    lines = [shipped_text("mesh-ping.sh").rstrip()]
    for start in range(0, len(pings), wave):
        batch = list(enumerate(pings[start:start + wave]))
        # each first try is a ping of its own in the background (the function there would be a shell and a ping)
        lines += [f"ping -c 1 -W 1 -M 'do' -s {int(size)} -I {q(p.interface)} {q(p.address)} >/dev/null 2>&1 & _w{i}=$!"
                  for i, p in batch]
        lines += [f'if wait "$_w{i}"; then echo {q(f"ok {p.interface} {p.peer} {p.address}")}; '
                  f"else _ping {q(p.interface)} {q(p.peer)} {q(p.address)} {int(size)} 1 & fi" for i, p in batch]
        lines.append("wait")
    return "\n".join(lines)


def parse_pings(stdout: str) -> list[tuple[str, str, str, str]]:
    """(verdict, interface, peer, address) per ping line."""
    out = []
    for line in stdout.splitlines():
        fields = line.split()
        if len(fields) == 4 and fields[0] in ("ok", "mtu", "dead"):
            out.append((fields[0], fields[1], fields[2], fields[3]))
    return out


# ssh's own words for why a pair is broken (OpenSSH 9.x: sshconnect.c, sshconnect2.c, ssh.c), for a hint that
# fits the failure: the cause -> the phrases that show it.
_SSH_FAILURES = {
    "refused": ("Connection refused",),
    "denied": ("Permission denied", "Too many authentication failures"),
    "host_key": ("Host key verification failed", "REMOTE HOST IDENTIFICATION HAS CHANGED", "No ED25519 host key",
                 "host key for", "No matching host key"),
    "timeout": ("Connection timed out", "Operation timed out", "timed out"),
    "no_route": ("No route to host", "Network is unreachable"),
}


def failure_causes(errors: Sequence[str]) -> set[str]:
    """The causes ssh's messages show (keys of _SSH_FAILURES); "other" for a message none of them explains."""
    out = set()
    for error in errors:
        found = {cause for cause, words in _SSH_FAILURES.items() if any(w.lower() in error.lower() for w in words)}
        out |= found or {"other"}
    return out


def fitting_fixes(errors: Sequence[str], fixes: dict[str, str]) -> list[str]:
    """The fixes (cause -> what to do) for the causes ssh's messages show, once each, in the table's order."""
    causes = failure_causes(errors)
    return list(dict.fromkeys(fix for cause, fix in fixes.items() if cause in causes))
