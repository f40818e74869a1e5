"""Loading sparkctl's firewall safely, as netplan is applied (safe_apply.py): check the rules, keep what the node
has, arm a node-side revert, load, then confirm over a NEW management connection. A rule set that cuts the
controller's way in is put back by the node itself once the window passes; the connection the run already has is
established traffic and survives the load, so only a new one proves the way in.
"""

from __future__ import annotations

import posixpath
import time

from sparkctl.facts.firewall_files import FIREWALL_DIR, LISTED_PATH, RULES_PATH, TABLE
from sparkctl.plan.render import render
from sparkctl.taskgraph.task import TaskFailed
from sparkctl.tasks.context import NodeContext
from sparkctl.tasks.network.safe_apply import confirm_once
from sparkctl.transport.base import q

GUARD_DIR = posixpath.join(FIREWALL_DIR, "guard")
#: how long the guard waits for the load before it starts its window anyway (a session cut mid-load)
WAIT_LOAD = 60
#: a new connection's tries: an SSH handshake refused in the window's first moment is tried again
CONFIRM_TRIES = 2


def guard_script(run_id: str, timeout: int) -> str:
    """The node-side revert for one load (templates/firewall-guard.sh.j2)."""
    base = posixpath.join(GUARD_DIR, run_id)
    return render("firewall-guard.sh.j2", pidfile=f"{base}/guard.pid", applied=f"{base}/applied",
                  confirmed=f"{base}/confirmed", reverted=f"{base}/reverted", kept_table=f"{base}/table.kept",
                  kept_files=[f"{base}/{posixpath.basename(p)}.kept" for p in (RULES_PATH, LISTED_PATH)],
                  directory=FIREWALL_DIR, table=TABLE, timeout=timeout, wait_load=WAIT_LOAD)


def guarded_load(ctx: NodeContext, rules: str, timeout: int) -> None:
    """Load `rules` as the node's firewall, reverted by the node unless a new connection confirms it."""
    run_id = f"{int(time.time() * 1000)}"
    base = posixpath.join(GUARD_DIR, run_id)
    new = f"{RULES_PATH}.new"
    ctx.must(f"install -d -m 755 {q(FIREWALL_DIR)} && install -d -m 700 {q(GUARD_DIR)} {q(base)}",
             "making sparkctl's firewall folders", sudo=True)
    ctx.transport.put(new, rules, mode=0o644, owner="root:root", sudo=True)
    ctx.must(f"nft -c -f {q(new)}", "checking the firewall rules (nft -c)", sudo=True,
             hint="the rules nft refused are shown above; see docs/firewall.md")
    keep = [f"nft list table inet {TABLE} > {q(base + '/table.kept')} 2>/dev/null || : > {q(base + '/table.kept')}"]
    keep += [f"if [ -e {q(path)} ]; then cp -p {q(path)} {q(f'{base}/{posixpath.basename(path)}.kept')}; fi"
             for path in (RULES_PATH, LISTED_PATH)]
    script = posixpath.join(base, "revert.sh")
    arm = ["set -e", *keep, f"cat > {q(script)} <<'SPARKCTL_EOF'\n{guard_script(run_id, timeout)}SPARKCTL_EOF",
           # a session of its own: it must outlive the very connection loss it guards against
           f"setsid nohup /bin/sh {q(script)} >/dev/null 2>&1 < /dev/null &"]
    ctx.must("\n".join(arm), "arming the firewall's revert", sudo=True)
    ctx.must(f"nft -f {q(new)}; rc=$?; [ $rc -eq 0 ] && mv -f {q(new)} {q(RULES_PATH)}; touch {q(base + '/applied')}; "
             "exit $rc", "loading the firewall (nft -f)", sudo=True)
    _confirm(ctx, base, timeout)


def _confirm(ctx: NodeContext, base: str, timeout: int) -> None:
    reverted, confirmed, pidfile = (f"{base}/{name}" for name in ("reverted", "confirmed", "guard.pid"))
    script = (f"if [ -e {q(reverted)} ]; then echo reverted; exit 3; fi; touch {q(confirmed)} || exit 4; "
              f"kill \"$(cat {q(pidfile)} 2>/dev/null)\" 2>/dev/null; echo confirmed")
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
