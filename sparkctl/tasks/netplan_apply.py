"""Applying netplan safely: record originals, arm a node-side revert, apply, confirm over a NEW connection.

The revert runs on the node by itself (like `netplan try`): if sparkctl cannot reach the node over a fresh
management connection after `netplan apply`, the node restores the previous files and applies them again.
"""

from __future__ import annotations

import json
import posixpath
import time

from sparkctl.engine.task import TaskFailed
from sparkctl.transport.base import q

STATE_ROOT = "/var/lib/sparkctl"

REVERT_SCRIPT = """#!/bin/sh
# sparkctl netplan revert guard: restores {backup} unless {confirmed} appears within {timeout}s.
sleep {timeout}
[ -e {confirmed} ] && exit 0
for f in {backup}/*.yaml; do [ -e "$f" ] && cp -p "$f" /etc/netplan/; done
if [ -f {backup}/absent ]; then while read -r f; do rm -f "$f"; done < {backup}/absent; fi
netplan apply
date +%s > {reverted}
"""


def state_dir(cluster: str) -> str:
    return posixpath.join(STATE_ROOT, cluster, "network")


def record_originals(ctx, paths: list[str], interfaces: list[str]) -> None:
    """Keep the pre-sparkctl version of each file, and the fabric addresses and MTUs, once (for `cluster down
    --network`); never overwrite them."""
    base = posixpath.join(state_dir(ctx.inventory.cluster.name), "original")
    facts = ctx.facts()
    live = {i: {"mtu": facts.interfaces[i].mtu, "addresses": [str(a) for a in facts.interfaces[i].ipv4()]}
            for i in interfaces if i in facts.interfaces}
    lines = [f"install -d -m 700 {q(base)}",
             f"[ -e {q(base)}/interfaces.json ] || printf '%s\\n' {q(json.dumps(live, sort_keys=True))} "
             f"> {q(base)}/interfaces.json"]
    for path in paths:
        name = posixpath.basename(path)
        lines.append(
            f"if [ ! -e {q(base)}/{q(name)} ] && [ ! -e {q(base)}/{q(name + '.absent')} ]; then "
            f"if [ -e {q(path)} ]; then cp -p {q(path)} {q(base)}/{q(name)}; "
            f"else touch {q(base)}/{q(name + '.absent')}; fi; fi"
        )
    ctx.must("\n".join(lines), "recording the original netplan files", sudo=True)


def arm_revert(ctx, paths: list[str], timeout: float) -> str:
    """Back up the current files and start the node-side timer. Returns the id to confirm with."""
    run_id = f"{int(time.time() * 1000)}"
    base = state_dir(ctx.inventory.cluster.name)
    backup = posixpath.join(base, f"revert-{run_id}")
    script = posixpath.join(base, f"revert-{run_id}.sh")
    body = REVERT_SCRIPT.format(
        backup=q(backup), confirmed=q(posixpath.join(base, f"confirmed-{run_id}")),
        reverted=q(posixpath.join(base, f"reverted-{run_id}")), timeout=int(timeout),
    )
    lines = [f"install -d -m 700 {q(backup)}"]
    for path in paths:
        lines.append(f"if [ -e {q(path)} ]; then cp -p {q(path)} {q(backup)}/; "
                     f"else echo {q(path)} >> {q(backup)}/absent; fi")
    lines.append(f"cat > {q(script)} <<'SPARKCTL_EOF'\n{body}SPARKCTL_EOF")
    # A new session, detached from ours: it must survive the very connection loss it guards against.
    lines.append(f"setsid nohup /bin/sh {q(script)} >/dev/null 2>&1 < /dev/null &")
    ctx.must("\n".join(lines), "arming the netplan revert", sudo=True)
    return run_id


def confirm(ctx, run_id: str) -> None:
    """Prove the management path over a NEW connection, then disarm the revert."""
    base = state_dir(ctx.inventory.cluster.name)
    try:
        fresh = ctx.cluster.new_transport(ctx.name)
        result = fresh.run(f"touch {q(posixpath.join(base, 'confirmed-' + run_id))} 2>/dev/null || true; echo ok",
                           sudo=True, timeout=15)
        fresh.close()
        reached = result.ok and "ok" in result.stdout
    except Exception as exc:  # any failure to reach the node means: do not confirm
        reached = False
        detail = str(exc)
    else:
        detail = (result.stderr or "").strip()
    if not reached:
        raise TaskFailed(
            f"after netplan apply, {ctx.name} could not be reached over a new management connection",
            hint=f"the node restores its previous netplan files by itself within "
                 f"{int(ctx.options.netplan_confirm_timeout)} s; check that the fabric subnets do not overlap "
                 "the management network or the controller's address",
            details=[detail] if detail else [],
        )


def netplan_apply(ctx) -> None:
    ctx.must("netplan apply", "netplan apply", sudo=True, timeout=120,
             hint="run `sudo netplan generate` on the node to see the error")


def wait_for_addresses(ctx, wanted: dict[str, str], mtu: int, timeout: float = 20.0) -> dict[str, str]:
    """Poll until every planned address is present with the MTU (they appear a moment after apply)."""
    deadline = time.monotonic() + timeout
    missing: dict[str, str] = {}
    while True:
        facts = ctx.facts(refresh=True)
        missing = {}
        for iface, addr in wanted.items():
            nic = facts.interfaces.get(iface)
            have = {str(a) for a in nic.addresses} if nic else set()
            if addr not in have:
                missing[iface] = f"{addr} absent"
            elif nic.mtu != mtu:
                missing[iface] = f"mtu {nic.mtu}"
        if not missing or time.monotonic() > deadline:
            return missing
        time.sleep(0.3)
