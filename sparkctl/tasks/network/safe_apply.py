"""Applying netplan safely: record originals, arm a node-side revert, apply, confirm over a NEW connection.

The revert runs on the node by itself (like `netplan try`): if sparkctl cannot reach the node over a fresh
management connection after `netplan apply`, the node restores the previous files and applies them again.
"""

from __future__ import annotations

import json
import posixpath
import time

from sparkctl.errors import Unreachable
from sparkctl.plan.paths import network_state_dir
from sparkctl.plan.render import render
from sparkctl.rules.networkmanager import is_keyfile, is_uuid
from sparkctl.shipped import shipped_text
from sparkctl.taskgraph.task import TaskFailed
from sparkctl.tasks.context import NodeContext
from sparkctl.transport.base import CommandResult, q

#: where the original of each NetworkManager profile sparkctl removed is kept, under the network record
NM_BACKUP = "nm"

#: how long `netplan apply` may take before the guard starts its confirm window anyway
APPLY_TIMEOUT = 120
#: `netplan apply`, tried twice more when it fails, its exit status the last try's. Under NetworkManager netplan
#: stops NetworkManager without waiting (`systemctl stop --no-block`), flushes the addresses, removes
#: /run/NetworkManager/devices and starts it again. netplan.io 0.106 (Debian 12, Ubuntu 22.04) removes that directory
#: with a checked `rm -rf`, which fails when NetworkManager, still stopping, writes into it: that apply ends with
#: NetworkManager stopped and the node without its addresses. The next apply finds NetworkManager stopped and starts
#: it. (netplan.io's netplan/cli/commands/apply.py and cli/utils.py `systemctl`; later releases remove it with
#: shutil.rmtree(ignore_errors=True), and an apply can still fail for a moment on `udevadm trigger`, LP: #2095203.)
NETPLAN_APPLY = "netplan apply || { sleep 2; netplan apply; } || { sleep 2; netplan apply; }"
#: how long after the apply a confirm keeps trying to connect: under NetworkManager `netplan apply` disconnects
#: every device it renders (a management port described in netplan too), restarts NetworkManager without waiting,
#: and the address comes back a moment later. Capped at half the revert window, so a confirm never races the guard.
CONFIRM_RETRY = 30.0


def record_originals(ctx: NodeContext, paths: list[str], interfaces: list[str]) -> None:
    """Keep the pre-sparkctl version of each file, and the fabric addresses and MTUs, once (for `cluster down
    --network`); never overwrite them."""
    base = posixpath.join(network_state_dir(ctx.inventory.cluster.name), "original")
    facts = ctx.facts()
    live = {i: {"mtu": facts.interfaces[i].mtu, "addresses": [str(a) for a in facts.interfaces[i].ipv4()]}
            for i in interfaces if i in facts.interfaces}
    # Each record is written under a temp name and renamed, every step checked: records are never overwritten, so
    # one cut short would stay short for good (and `cluster down --network` would restore it), and one that
    # failed unnoticed would be written by a later run from what sparkctl had set by then.
    temp = f"{base}/.interfaces.json.tmp"
    lines = ["set -e", f"install -d -m 700 {q(base)}",
             f"[ -e {q(base)}/interfaces.json ] || {{ printf '%s\\n' {q(json.dumps(live, sort_keys=True))} "
             f"> {q(temp)} && mv -f {q(temp)} {q(base)}/interfaces.json; }} || {{ rm -f {q(temp)}; exit 1; }}"]
    for path in paths:
        name = posixpath.basename(path)
        lines.append(
            f"if [ ! -e {q(base)}/{q(name)} ] && [ ! -e {q(base)}/{q(name + '.absent')} ]; then "
            f"if [ -e {q(path)} ]; then {_copy(path, f'{base}/.{name}.tmp', f'{base}/{name}')}; "
            f"else touch {q(base)}/{q(name + '.absent')}; fi; fi"
        )
    ctx.must("\n".join(lines), "recording the original netplan files", sudo=True)


def revert_script(base: str, run_id: str, timeout: float) -> str:
    """The node-side guard of one apply (templates/netplan-revert.sh.j2)."""
    return render("netplan-revert.sh.j2", backup=posixpath.join(base, f"revert-{run_id}"),
                  confirmed=_marker(base, "confirmed", run_id), reverted=_marker(base, "reverted", run_id),
                  applied=_marker(base, "applied", run_id), pidfile=_marker(base, "guard", run_id) + ".pid",
                  timeout=int(timeout), wait_apply=APPLY_TIMEOUT + 30, apply=NETPLAN_APPLY)


def arm_revert(ctx: NodeContext, paths: list[str], timeout: float) -> str:
    """Back up the current files and start the node-side timer. Returns the id to confirm with.

    Every step is checked (`set -e`) and the guard starts last: a backup that could not be written whole (a full
    disk, a cut connection) leaves no guard armed, never one that would restore a truncated file into /etc/netplan.
    """
    refused = [path for path in paths if "\n" in path]
    if refused:  # the guard reads the absent files one per line
        raise TaskFailed(f"cannot guard a netplan change on {ctx.name}: a path holds a newline: {refused[0]!r}",
                         hint="name the netplan file without a newline in the inventory")
    run_id = f"{int(time.time() * 1000)}"
    base = network_state_dir(ctx.inventory.cluster.name)
    backup = posixpath.join(base, f"revert-{run_id}")
    script = posixpath.join(base, f"revert-{run_id}.sh")
    body = revert_script(base, run_id, timeout)
    absent_temp = posixpath.join(backup, ".absent.tmp")
    lines = ["set -e", f"install -d -m 700 {q(backup)}"]
    for path in paths:
        name = posixpath.basename(path)
        kept, temp = posixpath.join(backup, name), posixpath.join(backup, f".{name}.tmp")
        lines.append(f"if [ -e {q(path)} ]; then {_copy(path, temp, kept)}; "
                     f"cmp -s {q(path)} {q(kept)} || {{ echo {q(f'the backup of {path} differs from it')} >&2; "
                     f"exit 1; }}; else printf '%s\\n' {q(path)} >> {q(absent_temp)}; fi")
    lines.append(f"if [ -e {q(absent_temp)} ]; then mv -f {q(absent_temp)} {q(backup + '/absent')}; fi")
    temp_script = posixpath.join(base, f".revert-{run_id}.sh.tmp")
    lines.insert(2, f"trap {q(f'rm -f -- {q(temp_script)} {q(absent_temp)}')} EXIT")  # renamed when whole
    lines.append(f"cat > {q(temp_script)} <<'SPARKCTL_EOF'\n{body}SPARKCTL_EOF")
    lines.append(f"mv -f {q(temp_script)} {q(script)}")
    # A new session, detached from ours: it must survive the very connection loss it guards against.
    lines.append(f"setsid nohup /bin/sh {q(script)} >/dev/null 2>&1 < /dev/null &")
    ctx.must("\n".join(lines), "arming the netplan revert", sudo=True)
    return run_id


def _copy(source: str, temp: str, final: str) -> str:
    """Shell: `source` copied to `final` through `temp`; on a failure the temp is removed and the script ends."""
    return f"{{ cp -p {q(source)} {q(temp)} && mv -f {q(temp)} {q(final)}; }} || {{ rm -f {q(temp)}; exit 1; }}"


def _marker(base: str, what: str, run_id: str) -> str:
    return posixpath.join(base, f"{what}-{run_id}")


def confirm_once(ctx: NodeContext, script: str) -> tuple[CommandResult | None, str]:
    """`script` run as root over a NEW connection to the node: (its result, or None when the node could not be
    reached; what went wrong)."""
    try:
        fresh = ctx.cluster.new_transport(ctx.name)
        try:
            result = fresh.run(script, sudo=True, timeout=15)
        finally:
            fresh.close()
    except Exception as exc:  # any failure to reach the node means: do not confirm
        return None, str(exc)
    return result, (result.stderr or "").strip()


def confirm(ctx: NodeContext, run_id: str, applied_at: float | None = None) -> None:
    """Prove the management path over a NEW connection, then disarm the revert (and stop its guard).

    With `applied_at` (time.monotonic() when the apply returned), a connection that fails is tried again until
    CONFIRM_RETRY seconds (at most half the revert window) after the apply: the address may not be back yet."""
    base = network_state_dir(ctx.inventory.cluster.name)
    reverted, confirmed = _marker(base, "reverted", run_id), _marker(base, "confirmed", run_id)
    pidfile = _marker(base, "guard", run_id) + ".pid"
    script = (f"if [ -e {q(reverted)} ]; then echo reverted; exit 3; fi; touch {q(confirmed)} || exit 4; "
              f"kill \"$(cat {q(pidfile)} 2>/dev/null)\" 2>/dev/null; echo confirmed")
    window = int(ctx.options.netplan_confirm_timeout)
    deadline = None if applied_at is None else applied_at + min(CONFIRM_RETRY, window / 2)
    while True:
        result, detail = confirm_once(ctx, script)
        unreached = result is None or result.exit_code == 255
        if not unreached or deadline is None or time.monotonic() >= deadline:
            break
        if ctx.transport.connection_dead():
            # the run's own connection, kept alive since the apply, went unanswered as well: the node is cut off,
            # not between NetworkManager's disconnect and its address coming back; waiting longer only delays
            # the rest of the run (the node's guard reverts on its own)
            detail = "; ".join(filter(None, [detail, "the run's own connection to it stopped answering too"]))
            break
        time.sleep(0.5)
    if result is not None and result.ok and "confirmed" in result.stdout:
        return
    if result is not None and "reverted" in result.stdout:
        raise TaskFailed(f"{ctx.name} already reverted the netplan change: the {window} s confirm window passed",
                         hint="rerun; on a slow node raise --revert-after")
    if result is not None and result.exit_code != 255:
        raise TaskFailed(f"could not disarm the netplan revert on {ctx.name}; it reverts within {window} s",
                         details=[detail] if detail else [])
    # Unreachable, not failed: from here a cut cable and a change that cut the management path look the same,
    # and either way the node is out of this run; its guard restores the previous files unless confirmed.
    raise Unreachable(
        f"after netplan apply, {ctx.name} could not be reached over a new management connection"
        + (f" ({detail})" if detail else ""),
        hint=f"the node restores its previous netplan files by itself within {window} s; check that the "
             "fabric subnets do not overlap the management network or the controller's address",
        node=ctx.name,
    )


def pending_guards(ctx: NodeContext) -> list[str]:
    """Revert guards an earlier run armed and never confirmed (it was cut after arming), still waiting to
    revert: from the facts, or read with sudo when the facts could not (sudo needs a password)."""
    pending = ctx.facts().netplan_guards_pending
    if pending is not None:
        return pending
    base = network_state_dir(ctx.inventory.cluster.name)
    result = ctx.must(f"sh -c {q(shipped_text('netplan-guards.sh'))} sh {q(base)}", "reading the netplan revert guards",
                      sudo=True)
    return [line.strip() for line in result.stdout.splitlines() if line.strip().isdigit()]


def netplan_apply(ctx: NodeContext, run_id: str | None = None) -> float:
    """`netplan apply` (tried again when it fails: NETPLAN_APPLY); with a run id, tell the guard the apply is done
    (its confirm window starts then). Returns time.monotonic() when the apply returned."""
    command = NETPLAN_APPLY
    if run_id is not None:
        applied = _marker(network_state_dir(ctx.inventory.cluster.name), "applied", run_id)
        command = f"{NETPLAN_APPLY}; rc=$?; touch {q(applied)}; exit $rc"
    ctx.must(command, "netplan apply", sudo=True, timeout=APPLY_TIMEOUT,
             hint="run `sudo netplan generate` on the node to see the error")
    return time.monotonic()


def remove_nm_profiles(ctx: NodeContext, profiles: list[tuple[str, str]]) -> None:
    """Back up each NetworkManager profile's file (for `cluster down --network`), then delete the profile
    through NetworkManager. `profiles`: (uuid, the file nmcli named)."""
    refused = [path for uuid, path in profiles if not is_keyfile(path) or not is_uuid(uuid)]
    if refused:
        raise TaskFailed(f"cannot back up the NetworkManager profile(s) in {', '.join(refused)} on {ctx.name}: "
                         "not a keyfile of NetworkManager's own",
                         hint="remove or rebind it by hand (`sudo nmcli connection delete <uuid>`), then rerun")
    base = posixpath.join(network_state_dir(ctx.inventory.cluster.name), "original", NM_BACKUP)
    lines = ["set -e", f"install -d -m 700 {q(base)}"]
    for uuid, path in profiles:
        lines += nm_backup_lines(base, uuid, path) + [f"nmcli connection delete uuid {q(uuid)} >/dev/null"]
    ctx.must("\n".join(lines), "removing the competing NetworkManager profiles", sudo=True,
             hint="see `nmcli connection show` on the node; remove the profile by hand with "
                  "`sudo nmcli connection delete <uuid>`")


def nm_backup_lines(base: str, uuid: str, path: str) -> list[str]:
    """Shell (under `set -e`) that keeps the profile at `path` as `<uuid>.nmconnection` (and where it was as
    `<uuid>.path`) under `base`, each written to a temp name and renamed, and proves the backup equals the profile
    before the caller deletes it: a backup cut short is rewritten, never kept while the profile goes. A profile
    whose file is gone is deleted only when a whole backup was taken before."""
    backup, where = (posixpath.join(base, f"{uuid}.{ext}") for ext in ("nmconnection", "path"))
    temp_backup, temp_where = (posixpath.join(base, f".{uuid}.{ext}.tmp") for ext in ("nmconnection", "path"))
    return [f"if [ -f {q(path)} ]; then",
            f"  {{ printf '%s\\n' {q(path)} > {q(temp_where)} && mv -f {q(temp_where)} {q(where)}; }} "
            f"|| {{ rm -f {q(temp_where)}; exit 1; }}",
            f"  if ! cmp -s {q(path)} {q(backup)}; then {_copy(path, temp_backup, backup)}; fi",
            f"  cmp -s {q(path)} {q(backup)} || {{ echo {q(f'the backup of {path} differs from it')} >&2; exit 4; }}",
            f"elif [ ! -e {q(backup)} ]; then echo {q(f'no profile file {path}')} >&2; exit 3; fi"]


def wait_for_addresses(ctx: NodeContext, wanted: dict[str, str], mtu: int, timeout: float = 20.0) -> dict[str, str]:
    """Poll until every planned address is present with the MTU (they appear a moment after apply). A twin without
    carrier gets its address when the carrier comes (network.verify waits for that and says why not)."""
    deadline = time.monotonic() + timeout
    missing: dict[str, str] = {}
    while True:
        facts = ctx.facts(refresh=True)
        missing = {}
        for iface, addr in wanted.items():
            nic = facts.interfaces.get(iface)
            have = {str(a) for a in nic.addresses} if nic else set()
            if nic is not None and not nic.up and not nic.admin_down and nic.mtu == mtu:
                continue
            if addr not in have:
                missing[iface] = f"{addr} absent"
            elif nic is not None and nic.mtu != mtu:
                missing[iface] = f"mtu {nic.mtu}"
        if not missing or time.monotonic() > deadline:
            return missing
        time.sleep(0.3)
