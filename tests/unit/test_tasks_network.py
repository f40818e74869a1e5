"""network.netplan and network.verify on recorded facts: one fixture per case in tests/fixtures/tasks/network.netplan/.

A case gives the facts of each node, the changes check must find (exactly), optionally the exact calls apply
makes on every transport, in order, and what the node shows after a command ran (`effects`). After apply, a
second check must find nothing. Hostile values prove the quoting: `bash -n` on every command, and a payload
that would create a file if it ever reached the shell unquoted, run for real inside a temp dir.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from sparkctl.errors import Unreachable
from sparkctl.facts import NetplanFile
from sparkctl.plan import paths as plan_paths
from sparkctl.rules.netplan import conflicting_stanzas, interfaces_in, without_stanzas
from sparkctl.taskgraph.task import TaskFailed
from sparkctl.tasks.network import safe_apply as netplan_apply
from sparkctl.tasks.network.netplan import NetplanTask
from sparkctl.tasks.network.safe_apply import NETPLAN_APPLY, revert_script
from sparkctl.tasks.network.verify import NetworkVerify
from tests.taskkit import (
    Call,
    install_effects,
    inventory,
    kit_from_case,
    make_kit,
    normalize_run_id,
    spark_facts,
    task_cases,
)

CASES = task_cases("network.netplan")
CONVERGED = {"addresses": {"enp1s0f1np1": ["192.168.100.10/24"], "enP2p1s0f1np1": ["192.168.101.10/24"]}}


def call_entry(label: str, call: Call) -> dict:
    """A recorded call as a fixture writes it."""
    entry: dict = {"on": label}
    if call.kind == "put":
        entry.update(put=call.target, mode=f"{call.mode:o}", owner=call.owner)
    else:
        entry[call.kind] = normalize_run_id(call.target)
    if call.sudo:
        entry["sudo"] = True
    return entry


@pytest.mark.parametrize("case", [c for _, c in CASES], ids=[n for n, _ in CASES])
def test_netplan_case(case):
    kit = kit_from_case(case)
    ctx = kit.node("spark1")
    task = NetplanTask()
    expect = case["check"]
    if "fails" in expect:
        with pytest.raises(TaskFailed) as err:
            task.check(ctx)
        assert err.value.message == expect["fails"]
        assert kit.log == []
        return
    changes = task.check(ctx)
    assert [c.summary for c in changes] == expect["changes"]
    diffs = "".join(c.diff or "" for c in changes)
    for needle in expect.get("diff_has", []):
        assert needle in diffs.splitlines() or needle in diffs, needle
    assert kit.log == [], "check must not send anything: facts are read by the context"
    if not changes:
        return
    install_effects(kit, "spark1", case.get("effects", []))
    task.apply(ctx, changes)
    if "apply" in case:
        assert [call_entry(label, call) for label, call in kit.log] == case["apply"]
    assert task.check(ctx) == [], "a second check after apply must find nothing (converged)"
    assert all(t.closed for t in kit.fresh)


# --- what apply sends, exactly -----------------------------------------------------------------------------

def test_apply_sequence_record_arm_put_apply_confirm_wait():
    (case,) = [c for n, c in CASES if n == "create"]
    kit = kit_from_case(case)
    ctx = kit.node("spark1")
    install_effects(kit, "spark1", case["effects"])
    NetplanTask().apply(ctx, NetplanTask().check(ctx))
    steps = [(label, call.kind, call.target.splitlines()[0]) for label, call in kit.log]
    base = "/var/lib/sparkctl/spark-pair/network"
    assert [s[:2] for s in steps] == [("spark1", "run"), ("spark1", "run"), ("spark1", "put"), ("spark1", "run"),
                                      ("spark1 (new connection)", "run")]
    record, arm, put, apply_, confirm = (call for _, call in kit.log)
    assert record.target.startswith(f"set -e\ninstall -d -m 700 {base}/original\n") and record.sudo
    assert "cp -p /etc/netplan/40-cx7.yaml" in record.target
    assert arm.target.startswith(f"set -e\ninstall -d -m 700 {base}/revert-") and arm.sudo
    assert "setsid nohup /bin/sh" in arm.target.splitlines()[-1] and arm.target.endswith("&")
    assert (put.target, put.mode, put.owner, put.sudo) == ("/etc/netplan/40-cx7.yaml", 0o600, "root:root", True)
    assert put.content == kit.cluster.plan().nodes["spark1"].netplan
    run_id = arm.target.split("revert-")[1].split("\n")[0]
    # the apply tells the guard it is done: the confirm window starts then, not while files are written
    assert (apply_.target, apply_.sudo) == (f"{NETPLAN_APPLY}; rc=$?; touch {base}/applied-{run_id}; exit $rc", True)
    # the confirm fails if the node already reverted, and stops the guard
    assert confirm.target.startswith(f"if [ -e {base}/reverted-{run_id} ]; then echo reverted; exit 3; fi; "
                                     f"touch {base}/confirmed-{run_id} || exit 4; kill ")
    assert kit.fresh[0].closed
    assert kit.node("spark1").facts_round_trips >= 2  # facts read again after apply (the wait)


def test_live_drift_only_runs_netplan_apply():
    (case,) = [c for n, c in CASES if n == "live-drift"]
    kit = kit_from_case(case)
    install_effects(kit, "spark1", case["effects"])
    NetplanTask().apply(kit.node("spark1"), NetplanTask().check(kit.node("spark1")))
    assert [(label, c.kind, c.target) for label, c in kit.log] == [("spark1", "run", NETPLAN_APPLY)]
    assert kit.fresh == []


def test_unplanned_address_removed_with_ip_addr_del():
    (case,) = [c for n, c in CASES if n == "legacy-scheme"]
    kit = kit_from_case(case)
    install_effects(kit, "spark1", case["effects"])
    NetplanTask().apply(kit.node("spark1"), NetplanTask().check(kit.node("spark1")))
    dels = [c.target for c in kit.transport("spark1").calls if c.target.startswith("ip addr del")]
    assert dels == ["ip addr del 192.168.200.12/24 dev enp1s0f1np1\nip addr del 192.168.200.14/24 dev enP2p1s0f1np1"]


def test_lost_management_path_is_unreachable_and_leaves_the_revert_armed(monkeypatch):
    clock = iter(range(1000))  # the confirm's retry window passes without waiting for it
    monkeypatch.setattr(netplan_apply.time, "sleep", lambda _s: None)
    monkeypatch.setattr(netplan_apply.time, "monotonic", lambda: float(next(clock)))
    (case,) = [c for n, c in CASES if n == "create"]
    kit = kit_from_case(case)
    kit.refuse_fresh = True
    ctx = kit.node("spark1")
    with pytest.raises(Unreachable) as err:
        NetplanTask().apply(ctx, NetplanTask().check(ctx))
    assert err.value.node == "spark1"  # the node out of the run, whoever met it
    assert "could not be reached over a new management connection" in err.value.message
    assert "restores its previous netplan files by itself within 60 s" in err.value.hint
    assert kit.fresh == [] and not any(c.target.startswith("touch ") for _, c in kit.log)
    assert any("setsid nohup" in c.target for _, c in kit.log)  # the node-side revert stays armed


@pytest.mark.parametrize("dead", [False, True], ids=["connection-alive", "connection-dead"])
def test_a_confirm_waits_for_the_address_to_come_back_only_while_the_run_s_connection_lives(monkeypatch, dead):
    """Under NetworkManager the management address drops for a moment after `netplan apply`, so a failed fresh
    connection is tried again (CONFIRM_RETRY); once the run's own connection, kept alive since the apply, has died
    too, the node is cut off (issue 17): it is lost at once, not after the whole retry window."""
    clock = iter(range(1000))
    monkeypatch.setattr(netplan_apply.time, "sleep", lambda _s: None)
    monkeypatch.setattr(netplan_apply.time, "monotonic", lambda: float(next(clock)))
    kit = make_kit(inventory(), {n: spark_facts(n) for n in ("spark1", "spark2")})
    kit.refuse_fresh = True
    attempts = []
    opened = kit.cluster.new_transport
    kit.cluster.new_transport = lambda node: attempts.append(node) or opened(node)
    kit.transport("spark1").dead = dead
    with pytest.raises(Unreachable) as lost:
        netplan_apply.confirm(kit.node("spark1"), "run1", applied_at=0.0)
    assert lost.value.node == "spark1"
    if dead:
        assert attempts == ["spark1"]
        assert lost.value.message.endswith("(spark1: connection refused; the run's own connection to it stopped "
                                           "answering too)")
    else:
        assert len(attempts) > 1 and "stopped answering too" not in lost.value.message


def test_addresses_that_never_appear_fail_with_details(monkeypatch):
    (case,) = [c for n, c in CASES if n == "create"]
    kit = kit_from_case(case)  # no effects: the node never shows the addresses
    ctx = kit.node("spark1")
    real = netplan_apply.wait_for_addresses
    monkeypatch.setattr(netplan_apply, "wait_for_addresses",
                        lambda ctx, wanted, mtu, timeout=20.0: real(ctx, wanted, mtu, timeout=0.0))
    with pytest.raises(TaskFailed) as err:
        NetplanTask().apply(ctx, NetplanTask().check(ctx))
    assert "still lacks the planned fabric settings" in err.value.message
    assert "enp1s0f1np1: 192.168.100.10/24 absent" in err.value.details


# --- quoting ---------------------------------------------------------------------------------------------------

def hostile_kit():
    """A cluster name and a netplan path that would run `touch pwned` (in the cwd) if interpolated unquoted.

    The netplan path passes inventory validation (a .yaml under /etc/netplan/); the cluster name does not, and is
    forced onto the model to prove the quoting does not rely on validation.
    """
    payload = "x'; touch pwned; '"
    inv = inventory()
    inv.cluster.name = f"pair{payload}$(touch pwned)"
    inv.fabric.netplan_file = f"/etc/netplan/{payload} $(touch pwned) `touch pwned`.yaml"
    facts = {n: spark_facts(n) for n in ("spark1", "spark2")}
    kit = make_kit(inv, facts)
    install_effects(kit, "spark1", [{"after": "^netplan apply", "shows": {**CONVERGED, "mtu": 9000}}])
    return kit


def bash_n(script: str) -> None:
    result = subprocess.run(["bash", "-n"], input=script, capture_output=True, text=True, timeout=10)
    assert result.returncode == 0, f"not valid shell:\n{script}\n{result.stderr}"


def test_hostile_values_give_valid_shell(tmp_path):
    kit = hostile_kit()
    ctx = kit.node("spark1")
    NetplanTask().apply(ctx, NetplanTask().check(ctx))
    commands = [c.target for _, c in kit.log if c.kind == "run"]
    assert len(commands) >= 4
    for command in commands:
        bash_n(command)
    arm = next(c for c in commands if "SPARKCTL_EOF" in c)
    revert_script = arm.split("<<'SPARKCTL_EOF'\n", 1)[1].split("SPARKCTL_EOF", 1)[0]
    bash_n(revert_script)
    (put,) = kit.transport("spark1").puts
    assert put.target == kit.cluster.inventory.fabric.netplan_file  # the path as given, not mangled


def test_hostile_payload_does_not_execute(tmp_path, monkeypatch):
    """Run what record_originals and arm_revert send, for real, with every path inside tmp_path.

    setsid/netplan/ip are stubs on PATH that only log their arguments: nothing reaches the real system.
    """
    pwned = tmp_path / "pwned"  # the payload's `touch pwned` runs in the cwd: tmp_path
    state_root = tmp_path / "state"
    monkeypatch.setattr(plan_paths, "NETWORK_STATE_ROOT", str(state_root))
    kit = hostile_kit()
    inv = kit.cluster.inventory
    netplan_dir = tmp_path / "etc-netplan"
    netplan_dir.mkdir()
    inv.fabric.netplan_file = str(netplan_dir / Path(inv.fabric.netplan_file).name)
    Path(inv.fabric.netplan_file).write_text("network: {version: 2}\n")
    stubs = tmp_path / "bin"
    stubs.mkdir()
    for name in ("setsid", "netplan", "ip", "nohup"):
        stub = stubs / name
        stub.write_text(f'#!/bin/sh\nprintf "%s\\n" "{name} $*" >> {tmp_path}/stub.log\n')
        stub.chmod(0o755)
    ctx = kit.node("spark1")
    paths = [inv.fabric.netplan_file]
    netplan_apply.record_originals(ctx, paths, ["enp1s0f1np1", "enP2p1s0f1np1"])
    run_id = netplan_apply.arm_revert(ctx, paths, 30)
    env = {"PATH": f"{stubs}:{os.environ['PATH']}", "HOME": str(tmp_path)}
    for command in kit.transport("spark1").commands:
        # `wait`: what a command starts in the background (&) has run before its stub's log is read
        result = subprocess.run(["bash", "-c", command + "\nwait"], cwd=tmp_path, env=env, capture_output=True,
                                text=True, timeout=10)
        assert result.returncode == 0, f"{command}\n{result.stderr}"
    assert not pwned.exists(), "the payload ran: a value reached the shell unquoted"
    network = Path(plan_paths.network_state_dir(inv.cluster.name))
    assert network.is_relative_to(state_root)
    name = Path(inv.fabric.netplan_file).name
    assert (network / "original" / name).read_text() == "network: {version: 2}\n"
    assert (network / f"revert-{run_id}" / name).exists()
    script = network / f"revert-{run_id}.sh"
    assert "sleep 30\n" in script.read_text() and f"confirmed-{run_id}" in script.read_text()
    bash_n(script.read_text())
    log = tmp_path / "stub.log"
    assert log.read_text() == f"setsid nohup /bin/sh {script}\n"
    assert not pwned.exists()


def failing_netplan(tmp_path: Path, failures: int) -> dict[str, str]:
    """An environment whose `netplan` fails its first `failures` calls (exit 7, as an apply cut short by
    NetworkManager's state directory), logging each call; what the node's shell runs reaches nothing real."""
    stubs = tmp_path / "bin"
    stubs.mkdir()
    stub = stubs / "netplan"
    stub.write_text(f'#!/bin/sh\necho "$*" >> {tmp_path}/netplan.log\n'
                    f'[ "$(wc -l < {tmp_path}/netplan.log)" -le {failures} ] && exit 7\nexit 0\n')
    stub.chmod(0o755)
    return {"PATH": f"{stubs}:{os.environ['PATH']}"}


def test_an_apply_that_fails_is_tried_again_and_its_last_status_is_the_tasks(tmp_path):
    env = failing_netplan(tmp_path, failures=5)
    result = subprocess.run(["sh", "-c", NETPLAN_APPLY], env=env, capture_output=True, text=True, timeout=20)
    assert result.returncode == 7
    assert (tmp_path / "netplan.log").read_text() == "apply\n" * 3


def test_the_guards_revert_applies_again_when_the_first_apply_fails(tmp_path):
    """netplan 0.106's apply can fail once under NetworkManager and leave it stopped: a revert that gave up there
    would leave the node cut off, the very thing the guard is for."""
    base = tmp_path / "network"
    (base / "revert-1").mkdir(parents=True)  # nothing to copy back: /etc/netplan stays untouched
    (base / "applied-1").touch()
    env = failing_netplan(tmp_path, failures=1)
    result = subprocess.run(["sh", "-c", revert_script(str(base), "1", 0)], env=env, capture_output=True, text=True,
                            timeout=20)
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "netplan.log").read_text() == "apply\n" * 2
    assert (base / "reverted-1").exists()


# --- pure netplan helpers ------------------------------------------------------------------------------------

def test_netplan_file_helpers():
    doc = "network:\n  ethernets:\n    eth0: {dhcp4: true}\n    cx: {match: {name: enp1s0f1np1}}\n"
    assert interfaces_in(doc) == {"eth0": "eth0", "cx": "cx", "enp1s0f1np1": "cx"}
    assert interfaces_in("not: [valid") == {}
    files = [NetplanFile("/etc/netplan/40-cx7.yaml", doc, 0o600), NetplanFile("/etc/netplan/50.yaml", doc, 0o600),
             NetplanFile("/etc/netplan/60.yaml", None, None)]
    assert conflicting_stanzas(files, "/etc/netplan/40-cx7.yaml", ["enp1s0f1np1"]) == {"/etc/netplan/50.yaml": ["cx"]}
    assert without_stanzas(doc, ["cx"]) == "network:\n  ethernets:\n    eth0:\n      dhcp4: true\n"
    assert without_stanzas(doc, ["cx", "eth0"]) == "network: {}\n"


# --- network.verify ------------------------------------------------------------------------------------------

def verify_kit():
    facts = {n: spark_facts(n, addresses=CONVERGED["addresses"] if n == "spark1" else {
        "enp1s0f1np1": ["192.168.100.11/24"], "enP2p1s0f1np1": ["192.168.101.11/24"]}, mtu=9000)
        for n in ("spark1", "spark2")}
    return make_kit(inventory(), facts)


def test_verify_pings_every_peer_on_every_twin_with_dont_fragment():
    kit = verify_kit()
    for node in ("spark1", "spark2"):
        kit.transport(node).respond(r"ping", stdout="ok whatever\n")
    assert NetworkVerify().check(kit.cluster) == []
    script = kit.transport("spark1").commands[0]
    bash_n(script)
    assert 'ping -c 1 -W 1 -M \'do\' -s "$_s" -I "$_i" "$_a"' in script
    assert "ping -c 1 -W 1 -M 'do' -s 8972 -I enp1s0f1np1 192.168.100.11 >/dev/null 2>&1 &" in script
    assert "_ping enp1s0f1np1 spark2 192.168.100.11 8972 1 &" in script  # not answered: tried again, then told
    assert "ping -c 1 -W 1 -M 'do' -s 8972 -I enP2p1s0f1np1 192.168.101.11 >/dev/null 2>&1 &" in script
    assert "_ping enP2p1s0f1np1 spark2 192.168.101.11 8972 1 &" in script  # not answered: tried again, then told
    assert "192.168.100.10" not in script  # not itself
    assert "enP2p1s0f1np1 spark2 192.168.100.11" not in script  # each twin pings its own subnet only
    assert "192.168.100.10" in kit.transport("spark2").commands[0]


def test_verify_tells_mtu_from_dead_links():
    kit = verify_kit()
    kit.transport("spark1").respond(r"ping", stdout="ok enp1s0f1np1 spark2 192.168.100.11\n"
                                                    "mtu enP2p1s0f1np1 spark2 192.168.101.11\n")
    kit.transport("spark2").respond(r"ping", stdout="dead enp1s0f1np1 spark1 192.168.100.10\n")
    with pytest.raises(TaskFailed) as err:
        NetworkVerify().check(kit.cluster)
    assert err.value.message == "2 fabric link check(s) failed"
    mtu, dead = err.value.details
    assert mtu.startswith("spark1 enP2p1s0f1np1>spark2:192.168.101.11: jumbo ping (8972 bytes, don't fragment) "
                          "fails but a small one passes: MTU mismatch")
    assert dead == "spark2 enp1s0f1np1>spark1:192.168.100.10: no answer (cable, port, or the peer's address)"


def test_verify_script_outputs_parse_as_promised(tmp_path):
    """Run the real verify script with `ping` stubbed: the stub's verdicts come back as the parser expects."""
    if not shutil.which("bash"):
        pytest.skip("no bash")
    kit = verify_kit()
    NetworkVerify().check(kit.cluster)  # records the scripts (no output: nothing reported)
    script = kit.transport("spark1").commands[0]
    stubs = tmp_path / "bin"
    stubs.mkdir()
    # jumbo pings (-M do) fail on twin 2, small ones pass: an MTU problem on that twin
    (stubs / "ping").write_text('#!/bin/sh\ncase "$*" in *"-M do"*enP2p1s0f1np1*) exit 1;; esac\nexit 0\n')
    (stubs / "ping").chmod(0o755)
    out = subprocess.run(["bash", "-c", script], env={"PATH": f"{stubs}:/usr/bin:/bin"}, capture_output=True,
                         text=True, timeout=10).stdout
    assert sorted(out.splitlines()) == ["mtu enP2p1s0f1np1 spark2 192.168.101.11",
                                        "ok enp1s0f1np1 spark2 192.168.100.11"]


def test_verify_explains_a_twin_set_down_once_with_its_far_end_under_it_and_pings_the_rest(monkeypatch):
    from sparkctl.tasks.network import verify

    monkeypatch.setattr(verify, "WAIT_FOR_TWINS_S", 0.0)
    kit = verify_kit()
    kit.node("spark1").shows = spark_facts("spark1", addresses={"enp1s0f1np1": ["192.168.100.10/24"]}, mtu=9000,
                                           set_down=("enP2p1s0f1np1",))
    kit.node("spark2").shows = spark_facts("spark2", addresses={"enp1s0f1np1": ["192.168.100.11/24"]}, mtu=9000,
                                           no_carrier=("enP2p1s0f1np1",))
    for node in ("spark1", "spark2"):
        kit.transport(node).respond(r"ping", stdout="")
    with pytest.raises(TaskFailed) as err:
        NetworkVerify().check(kit.cluster)
    assert err.value.message == "1 fabric link check(s) failed"
    assert err.value.details == [
        "spark1 enP2p1s0f1np1 is administratively down; the network phase (network.netplan) brings it Up, Up is "
        "part of the planned state: sparkctl brings it Up (network.netplan); by hand: sudo ip link set "
        "enP2p1s0f1np1 up",
        "  because of it: spark2 enP2p1s0f1np1 has no carrier because spark1's end is administratively down"]
    scripts = kit.transport("spark1").commands + kit.transport("spark2").commands
    assert all("192.168.101." not in s for s in scripts)  # the link with an end down is not pinged again
    assert "_ping enp1s0f1np1 spark2 192.168.100.11 " in kit.transport("spark1").commands[0]


def test_verify_waits_for_a_twin_brought_up_to_have_carrier_and_its_address(monkeypatch):
    from sparkctl.tasks.network import verify

    kit = verify_kit()
    healthy = kit.node("spark2").shows
    kit.node("spark2").shows = spark_facts("spark2", addresses={"enp1s0f1np1": ["192.168.100.11/24"]}, mtu=9000,
                                           no_carrier=("enP2p1s0f1np1",))
    waits = []

    def carrier_comes(seconds):
        waits.append(seconds)
        kit.node("spark2").shows = healthy  # the far end was brought up: carrier, then the address

    monkeypatch.setattr(verify.time, "sleep", carrier_comes)
    for node in ("spark1", "spark2"):
        kit.transport(node).respond(r"ping", stdout="")
    assert NetworkVerify().check(kit.cluster) == []
    assert len(waits) == 1 and "192.168.101.10" in kit.transport("spark2").commands[0]
