"""Why a peer's sshd refused a node's cluster key: its effective configuration for that login (`sshd -T -C`, Match
blocks applied) judged by rules/sshd.py, and the line of its configuration files that set what keeps the key out.
Asked only of the peers that refused a pair (one round trip each, all at once)."""

from __future__ import annotations

from sparkctl.plan.render import render
from sparkctl.rules.mesh import Verdict
from sparkctl.rules.sshd import SSHD_KEYS, blame, effective_settings, keyword, parse_config_lines, sshd_problem
from sparkctl.tasks.context import ClusterContext
from sparkctl.tasks.ssh.proofs import source_addresses
from sparkctl.transport.framing import Framing

_KEYS = "|".join(k.lower() for k in SSHD_KEYS if k != "MaxStartups")  # a refused key, not a dropped connection
_LINES = (r"""$_S grep -nHiE '^[[:space:]]*(match|KEYS)([[:space:]]|=)' /etc/ssh/sshd_config """
          r"""/etc/ssh/sshd_config.d/*.conf 2>/dev/null; true""")


def refusal_script(ctx: ClusterContext, peer: str, sources: set[str], framing: Framing) -> str:
    """On `peer`: the effective settings for a login from each address of the `sources` nodes, and the lines of
    sshd's files that set them."""
    inv = ctx.inventory
    port = int(inv.node(peer).port or inv.ssh.port or 22)
    theirs = {str(a.ip) for node in sources for a in ctx.plan().fabric.addresses.get(node, {}).values()}
    theirs |= {str(inv.node(node).host) for node in sources}  # a peer reached over management (no shared link)
    pairs = [f"{src}/{local}" for src, local in source_addresses(ctx, peer) if src in theirs] or ["none/none"]
    effective = render("sshd-effective.sh.j2", user=inv.user, sources=pairs, port=port, keys=_KEYS)
    return "\n".join([framing.section("effective", effective), framing.section("lines", _LINES.replace("KEYS", _KEYS))])


def explain_refusals(ctx: ClusterContext, verdicts: list[Verdict]) -> list[str]:
    """One line per setting that keeps a refused pair's key out: `peer: path:line: Keyword value (in `Match ...`):
    why (logins from <addresses>)`; empty when the peers' sshd configuration does not explain the refusals."""
    refused: dict[str, set[str]] = {}
    for v in verdicts:
        if v.state == "fail" and "permission denied" in v.error.lower():
            refused.setdefault(v.peer, set()).add(v.node)
    if not refused:
        return []
    framing = Framing()
    results = ctx.run_on_all({peer: refusal_script(ctx, peer, nodes, framing) for peer, nodes in refused.items()},
                             timeout=30)
    out = []
    for peer, result in results.items():
        sections = Framing.texts_of(framing.split(result.stdout))
        lines = parse_config_lines(sections.get("lines", ""))
        facts = ctx.nodes[peer].known_facts()
        groups = list(facts.groups) if facts is not None else []
        by_source: dict[str, list[tuple[str, str]]] = {}
        for raw in sections.get("effective", "").splitlines():
            source, _, setting = raw.partition(" ")
            key, _, value = setting.strip().partition(" ")
            by_source.setdefault(source, []).append((key, value))
        found: dict[str, list[str]] = {}  # what was found -> the source addresses it keeps out
        for source, settings in by_source.items():
            effective = effective_settings(settings)
            for key, value in effective.items():
                problem = sshd_problem(keyword(key), value, ctx.inventory.user, groups, len(ctx.inventory.nodes))
                if problem:
                    line = blame({key: value}, lines)[key]
                    found.setdefault(f"{line or keyword(key) + ' ' + value}: {problem}", []).append(source)
        out += [f"{peer}: {what} (logins from {', '.join(sorted(sources))})" for what, sources in found.items()]
    return out


REFUSAL_HINT = ("a person must change the named line of sshd's configuration on that node (sparkctl does not edit "
                "sshd's own files), then `sudo systemctl reload ssh` there, and rerun bootstrap")
