"""Loading sparkctl's firewall safely, as netplan is applied (safe_apply.py): check the rules, keep the table the
node has, arm a node-side revert, load, then confirm over a NEW management connection. A rule set that cuts the
controller's way in is put back by the node itself once the window passes; the connection the run already has is
established traffic and survives the load, so only a new one proves the way in.

The new rules file takes the old one's place only when confirmed (the boot unit loads that file: a reboot inside the
window boots the old rules). The guard runs as a transient systemd unit where systemd runs (outside the login's
session, which may be killed with it), and is proven alive before the load. A guard an interrupted run left armed
stands down when the next run arms its own: that run keeps what the node holds then.
"""

from __future__ import annotations

import posixpath
import time
from dataclasses import dataclass

from sparkctl.facts.firewall_files import FIREWALL_DIR, RULES_PATH, TABLE
from sparkctl.plan.render import render
from sparkctl.taskgraph.task import TaskFailed
from sparkctl.tasks.context import NodeContext
from sparkctl.tasks.network.safe_apply import confirm_once
from sparkctl.transport.base import q

GUARD_DIR = posixpath.join(FIREWALL_DIR, "guard")
NEW_RULES = f"{RULES_PATH}.new"
#: how long the guard waits for the load before it starts its window anyway (a session cut mid-load)
WAIT_LOAD = 60
#: a new connection's tries: an SSH handshake refused in the window's first moment is tried again
CONFIRM_TRIES = 2
NO_NFT = ("nft is not on the node: install nftables (DGX OS ships it) or set `firewall: off` in the inventory")


@dataclass(frozen=True)
class GuardFiles:
    """One load's guard: its folder under GUARD_DIR and the files in it."""

    run_id: str

    @property
    def base(self) -> str:
        return posixpath.join(GUARD_DIR, self.run_id)

    def _at(self, name: str) -> str:
        return posixpath.join(self.base, name)

    @property
    def pidfile(self) -> str:
        return self._at("guard.pid")

    @property
    def applied(self) -> str:
        return self._at("applied")

    @property
    def confirmed(self) -> str:
        return self._at("confirmed")

    @property
    def reverted(self) -> str:
        return self._at("reverted")

    @property
    def lock(self) -> str:
        return self._at("lock")

    @property
    def kept_table(self) -> str:
        return self._at("table.kept")

    @property
    def script(self) -> str:
        return self._at("revert.sh")


def guard_script(run_id: str, timeout: int) -> str:
    """The node-side revert for one load (templates/firewall-guard.sh.j2)."""
    g = GuardFiles(run_id)
    return render("firewall-guard.sh.j2", pidfile=g.pidfile, applied=g.applied, confirmed=g.confirmed,
                  reverted=g.reverted, lock=g.lock, kept_table=g.kept_table, new_rules=NEW_RULES, table=TABLE,
                  timeout=timeout, wait_load=WAIT_LOAD)


#: guards an interrupted run left armed stand down (this run keeps what the node holds now)
STAND_DOWN = f"""for p in {GUARD_DIR}/*/guard.pid; do
  [ -e "$p" ] || continue; d=${{p%/guard.pid}}
  if [ ! -e "$d/confirmed" ] && [ ! -e "$d/reverted" ]; then
    touch "$d/confirmed"; kill "$(cat "$p")" 2>/dev/null || true
  fi
done"""


def arm_script(g: GuardFiles, timeout: int) -> str:
    unit = f"sparkctl-firewall-guard-{g.run_id}"
    return "\n".join([
        "set -e", STAND_DOWN,
        f"nft list table inet {TABLE} > {q(g.kept_table)} 2>/dev/null || : > {q(g.kept_table)}",
        f"cat > {q(g.script)} <<'SPARKCTL_EOF'\n{guard_script(g.run_id, timeout)}SPARKCTL_EOF",
        # outside the login's session where systemd runs: it must outlive the very connection loss it guards against
        "if [ -d /run/systemd/system ] && command -v systemd-run >/dev/null 2>&1; then",
        f"  systemd-run --quiet --collect --unit={q(unit)} /bin/sh {q(g.script)}",
        f"else setsid nohup /bin/sh {q(g.script)} >/dev/null 2>&1 < /dev/null & fi",
        f"i=0; while [ ! -s {q(g.pidfile)} ] && [ \"$i\" -lt 100 ]; do sleep 0.1; i=$((i + 1)); done",
        f"kill -0 \"$(cat {q(g.pidfile)} 2>/dev/null)\" || {{ echo 'the revert guard did not start' >&2; exit 1; }}",
    ])


def load_script(g: GuardFiles) -> str:
    """nft -f; a load nft refused changed nothing: its guard stands down."""
    return (f"if nft -f {q(NEW_RULES)}; then touch {q(g.applied)}; else rc=$?; touch {q(g.confirmed)} {q(g.applied)}; "
            f"rm -f {q(NEW_RULES)}; kill \"$(cat {q(g.pidfile)})\" 2>/dev/null; exit $rc; fi")


def confirm_script(g: GuardFiles) -> str:
    """Over a new connection: the new file takes the old one's place, the guard stands down; never while it
    reverts."""
    return (f"exec 9> {q(g.lock)}; flock 9; if [ -e {q(g.reverted)} ]; then echo reverted; exit 3; fi; "
            f"mv -f {q(NEW_RULES)} {q(RULES_PATH)} && touch {q(g.confirmed)} || exit 4; "
            f"kill \"$(cat {q(g.pidfile)} 2>/dev/null)\" 2>/dev/null; echo confirmed")


def guarded_load(ctx: NodeContext, rules: str, timeout: int) -> None:
    """Load `rules` as the node's firewall, reverted by the node unless a new connection confirms it."""
    g = GuardFiles(f"{int(time.time() * 1000)}")
    ctx.must("command -v nft >/dev/null", "looking for nft", sudo=True, hint=NO_NFT)
    ctx.must(f"install -d -m 755 {q(FIREWALL_DIR)} && install -d -m 700 {q(GUARD_DIR)} {q(g.base)}",
             "making sparkctl's firewall folders", sudo=True)
    ctx.transport.put(NEW_RULES, rules, mode=0o644, owner="root:root", sudo=True)
    ctx.must(f"nft -c -f {q(NEW_RULES)}", "checking the firewall rules (nft -c)", sudo=True,
             hint="the rules nft refused are shown above; see docs/firewall.md")
    ctx.must(arm_script(g, timeout), "arming the firewall's revert", sudo=True)
    ctx.must(load_script(g), "loading the firewall (nft -f)", sudo=True)
    _confirm(ctx, g, timeout)


def _confirm(ctx: NodeContext, g: GuardFiles, timeout: int) -> None:
    script = confirm_script(g)
    result, detail, cut = None, "", ""
    for attempt in range(CONFIRM_TRIES):
        result, detail = confirm_once(ctx, script)
        if result is not None and result.exit_code != 255:
            break
        cut = cut or detail or "no answer"
        if attempt + 1 < CONFIRM_TRIES:
            time.sleep(1.0)
    if result is not None and result.ok and "confirmed" in result.stdout:
        return
    if cut and (result is None or result.exit_code == 255 or "reverted" in result.stdout):
        # a new connection was refused its way in: the rules cut it, and the node undoes them by itself
        done = "has put" if result is not None and "reverted" in result.stdout else "puts"
        raise TaskFailed(
            f"after loading the firewall, {ctx.name} could not be reached over a new management connection "
            f"({cut}): it {done} its previous firewall back by itself (within {timeout} s of the load)",
            hint="the rules would cut this machine's way in: check firewall.ssh_from (this machine's address must "
                 "be in it) and the node's ssh port in the inventory")
    if result is not None and "reverted" in result.stdout:
        raise TaskFailed(f"{ctx.name} already put its previous firewall back: the {timeout} s window passed",
                         hint="rerun; on a slow node raise --revert-after")
    raise TaskFailed(f"could not disarm the firewall's revert on {ctx.name}; it reverts within {timeout} s",
                     details=[detail] if detail else [])
