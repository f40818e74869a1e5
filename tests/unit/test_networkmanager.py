"""NetworkManager as the renderer, without a network: nmcli's real outputs parsed, the competing-profile and
unmanaged-twin judgements, network.netplan and down.network on recorded facts, doctor's findings, the bundle.

The nmcli outputs in tests/fixtures/nmcli/ are REAL: NetworkManager 1.42.4 (Debian 12) on lab nodes brought up
with `sparkctl lab up --renderer networkmanager`, captured by tests/fixtures/nmcli/capture.sh (README there).
"""

from __future__ import annotations

import contextlib
import copy
import io
import os
import subprocess
import tarfile
from pathlib import Path

import pytest

from sparkctl.doctor.bundle import write_bundle
from sparkctl.doctor.diagnose import run_checks
from sparkctl.facts import NetplanFile, facts_from_output
from sparkctl.facts.networkmanager import parse_nmcli, split_terse
from sparkctl.plan import plan_cluster
from sparkctl.rules.networkmanager import (
    competing_profiles,
    is_keyfile,
    is_uuid,
    netplan_stanzas_of,
    nm_renders,
    unmanaged_twins,
)
from sparkctl.taskgraph.task import Change, TaskFailed
from sparkctl.tasks.network import safe_apply
from sparkctl.tasks.network.down import NetworkDown
from sparkctl.tasks.network.netplan import NetplanTask
from sparkctl.transport.framing import MARKER
from tests.taskkit import install_effects, inventory, make_kit, normalize_run_id, spark_facts
from tests.unit.doctor_snapshot_kit import diagnose, healthy_snapshot
from tests.unit.nm_kit import BOUND_MAC, DGX_OS, nmcli

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "nmcli"
TWINS = ["enp1s0f1np1", "enP2p1s0f1np1"]
MGMT = {"enP7s7"}
CONVERGED = {"enp1s0f1np1": ["192.168.100.10/24"], "enP2p1s0f1np1": ["192.168.101.10/24"]}
def nm_facts(node: str = "spark1", fixture: str = "converged.txt", *, addresses=None, files=(DGX_OS,), **kw):
    """A Spark on DGX OS: NetworkManager renders netplan (01-network-manager-all.yaml) and answers nmcli."""
    facts = spark_facts(node, addresses=CONVERGED if addresses is None else addresses, mtu=9000,
                        netplan_files=list(files), **kw)
    facts.nm = nmcli(fixture)
    facts.interfaces["enp1s0f1np1"].mac = BOUND_MAC.upper()
    return facts


# --- nmcli's output, parsed -----------------------------------------------------------------------------------

def test_terse_fields_unescape_colons_and_backslashes():
    assert split_terse(r"6194c35c:fabric\: by MAC \\\\ x:802-3-ethernet") == [
        "6194c35c", "fabric: by MAC \\\\ x", "802-3-ethernet"]
    assert split_terse("enP2p1s0f0np0:ethernet:unavailable:") == ["enP2p1s0f0np0", "ethernet", "unavailable", ""]


def test_a_converged_node_shows_netplan_profiles_active_and_the_auto_created_ones_idle():
    nm = nmcli("converged.txt")
    assert nm.running
    assert {d.name: d.state for d in nm.devices}["enP2p1s0f1np1"] == "connected"
    active = {p.name: p.device for p in nm.profiles if p.device}
    assert active == {"lo": "lo", "netplan-enP2p1s0f1np1": "enP2p1s0f1np1", "netplan-enP7s7": "enP7s7",
                      "netplan-enp1s0f1np1": "enp1s0f1np1"}
    wired = [p for p in nm.profiles if p.name.startswith("Wired connection")]
    assert [(p.interface_name, p.priority, p.from_netplan) for p in wired] == [
        ("enP2p1s0f0np0", -999, False), ("enP2p1s0f1np1", -999, False), ("enp1s0f0np0", -999, False),
        ("enp1s0f1np1", -999, False)]
    assert all(p.filename.startswith("/run/NetworkManager/system-connections/Wired connection") for p in wired)
    assert nm.netplan_profile("enp1s0f1np1").uuid == "422c4968-c9eb-33ac-b993-958ae320e96c"


def test_bindings_by_mac_an_unbound_profile_an_unmanaged_twin_and_an_escaped_name():
    nm = nmcli("mac-bound-unbound-unmanaged.txt")
    by_name = {p.name: p for p in nm.profiles}
    weird = by_name["fabric: by MAC \\\\ x"]
    assert (weird.mac, weird.interface_name, weird.priority, weird.device) == (BOUND_MAC, "", 5, "")
    assert weird.filename == "/etc/NetworkManager/system-connections/fabric: by MAC \\\\ x.nmconnection"
    unbound = by_name["any ethernet"]
    assert (unbound.interface_name, unbound.mac, unbound.autoconnect) == ("", "", False)
    assert not nm.device("enP2p1s0f1np1").managed and nm.device("enp1s0f1np1").managed


def test_stopped_absent_and_odd_answers():
    stopped = nmcli("stopped.txt")
    assert (stopped.status, stopped.detail, stopped.profiles) == ("stopped", "NetworkManager is not running.", [])
    assert parse_nmcli("#absent\n") is None
    odd = parse_nmcli("#devices\n")  # cut short: no answer at all
    assert odd.status == "error" and not odd.running
    assert parse_nmcli("#devices\nError: Could not create NMClient object.\n").status == "error"


def test_the_gather_reads_the_nm_section():
    text = (FIXTURES / "competing-profile-active.txt").read_text()
    out = f"{MARKER}:n0:begin nm@@\n{text}\n{MARKER}:n0:end nm 0@@\n"
    facts = facts_from_output(out, "n0", "spark1")
    assert facts.nm.running and "rogue" in {p.name for p in facts.nm.profiles}
    assert facts_from_output("", "n0", "spark1").nm is None  # no section: not read


# --- the judgements ---------------------------------------------------------------------------------------------

def test_a_profile_active_on_a_twin_competes_the_auto_created_ones_do_not():
    facts = nm_facts(fixture="competing-profile-active.txt")
    (c,) = competing_profiles(facts, TWINS, MGMT)
    assert (c.profile.name, c.interface) == ("rogue", "enP2p1s0f1np1")
    assert c.why == "active, bound by name, autoconnect priority 0 >= netplan's 0"
    assert competing_profiles(nm_facts(), TWINS, MGMT) == []  # Wired connection N: -999, idle


def test_a_profile_bound_by_mac_with_a_higher_priority_competes_while_idle():
    facts = nm_facts(fixture="mac-bound-unbound-unmanaged.txt")
    (c,) = competing_profiles(facts, TWINS, MGMT)
    assert (c.profile.name, c.interface) == ("fabric: by MAC \\\\ x", "enp1s0f1np1")
    assert c.why == "inactive, bound by MAC, autoconnect priority 5 >= netplan's 0"
    # the same MAC on the management port: the management's connection, never touched
    facts.interfaces["enP7s7"].mac = BOUND_MAC
    facts.interfaces["enp1s0f1np1"].mac = None
    assert competing_profiles(facts, TWINS, MGMT) == []


def test_what_cannot_win_or_is_the_managements_is_left_alone():
    facts = nm_facts(fixture="competing-profile-active.txt")
    rogue = next(p for p in facts.nm.profiles if p.name == "rogue")
    for change, competes in [({"priority": -1}, False), ({"autoconnect": False}, False),
                             ({"interface_name": "", "device": "enP2p1s0f1np1"}, True),  # unbound, active there
                             ({"interface_name": "", "device": ""}, False),  # unbound and idle: maybe the mgmt's
                             ({"interface_name": "enP7s7", "device": ""}, False),
                             ({"interface_name": "", "device": "enP7s7"}, False),
                             ({"filename": "/run/NetworkManager/system-connections/netplan-x.nmconnection"}, False)]:
        f = copy.deepcopy(facts)
        p = next(p for p in f.nm.profiles if p.uuid == rogue.uuid)
        for key, value in change.items():
            setattr(p, key, value)
        assert bool(competing_profiles(f, TWINS, MGMT)) == competes, change
    facts.nm.status = "stopped"
    assert competing_profiles(facts, TWINS, MGMT) == []


def test_a_twin_is_unmanaged_only_where_networkmanager_renders_it():
    facts = nm_facts(fixture="mac-bound-unbound-unmanaged.txt")
    assert unmanaged_twins(facts, TWINS) == ["enP2p1s0f1np1"]
    assert nm_renders(facts.netplan_files, TWINS)
    assert unmanaged_twins(facts, TWINS, files=[]) == []  # networkd renders it: NetworkManager stays out
    assert not nm_renders([], TWINS)


def test_a_netplan_stanza_of_another_name_bound_to_a_twin_is_a_conflict():
    facts = nm_facts()
    profile = next(p for p in facts.nm.profiles if p.name == "netplan-enP2p1s0f1np1")
    profile.filename = "/run/NetworkManager/system-connections/netplan-NM-0d2f.nmconnection"
    assert netplan_stanzas_of(facts, TWINS) == {"NM-0d2f"}
    assert netplan_stanzas_of(nm_facts(), TWINS) == set()


def test_only_networkmanagers_own_keyfiles_are_backed_up_and_put_back():
    assert is_keyfile("/etc/NetworkManager/system-connections/rogue.nmconnection")
    assert is_keyfile("/run/NetworkManager/system-connections/Wired connection 2.nmconnection")
    for path in ("/etc/network/interfaces", "/etc/NetworkManager/system-connections/../../shadow.nmconnection",
                 "/run/NetworkManager/system-connections/netplan-enp1s0f1np1.nmconnection", "",
                 "/tmp/rogue.nmconnection"):
        assert not is_keyfile(path), path
    assert is_uuid("6e38f5a2-dd93-4245-8818-2bc7db02f9dd")
    assert not is_uuid("../../etc/6e38f5a2-dd93-4245-8818-2bc7db02f9dd") and not is_uuid("rogue")


# --- network.netplan ----------------------------------------------------------------------------------------------

def kit_with(fixture: str, addresses=None):
    """spark1 bootstrapped once (sparkctl's file in place), then NetworkManager as `fixture` shows it."""
    inv = inventory()
    facts = {"spark1": nm_facts("spark1", fixture, addresses=addresses),
             "spark2": nm_facts("spark2", addresses={"enp1s0f1np1": ["192.168.100.11/24"],
                                                     "enP2p1s0f1np1": ["192.168.101.11/24"]})}
    for name, f in facts.items():
        f.netplan_files.append(NetplanFile(inv.fabric.netplan_file, plan_cluster(inv, facts).nodes[name].netplan,
                                           0o600))
    return make_kit(inv, facts)


def test_a_competing_profile_is_removed_backed_up_before_netplan_apply():
    # what the node showed: rogue active on enP2p1s0f1np1 with its own address, netplan's idle
    kit = kit_with("competing-profile-active.txt",
                   addresses={"enp1s0f1np1": ["192.168.100.10/24"], "enP2p1s0f1np1": ["192.168.55.5/24"]})
    ctx = kit.node("spark1")
    changes = NetplanTask().check(ctx)
    assert [c.summary for c in changes] == [
        "remove the NetworkManager profile 'rogue' that competes with netplan's for enP2p1s0f1np1 (active, bound "
        "by name, autoconnect priority 0 >= netplan's 0; backed up)",
        "apply netplan: enP2p1s0f1np1 lacks 192.168.101.10/24; enP2p1s0f1np1 has unplanned 192.168.55.5/24"]
    converged = nm_facts("spark1")
    converged.netplan_files = ctx.shows.netplan_files
    install_effects(kit, "spark1", [])
    kit.transport("spark1").respond("^netplan apply", then=lambda: setattr(ctx, "shows", copy.deepcopy(converged)))
    NetplanTask().apply(ctx, changes)
    runs = [normalize_run_id(c.target) for c in kit.transport("spark1").calls if c.kind == "run"]
    base = "/var/lib/sparkctl/spark-pair/network/original"
    assert runs[0].startswith(f"set -e\ninstall -d -m 700 {base}\n")  # the record (addresses and MTUs, once)
    remove = runs[1]
    assert remove.startswith(f"set -e\ninstall -d -m 700 {base}/nm\n")
    profile, kept = ("/etc/NetworkManager/system-connections/rogue.nmconnection",
                     f"{base}/nm/6e38f5a2-dd93-4245-8818-2bc7db02f9dd.nmconnection")
    temp = f"{base}/nm/.6e38f5a2-dd93-4245-8818-2bc7db02f9dd.nmconnection.tmp"
    # written under a temp name, renamed, and proved equal to the profile before the profile is deleted
    assert f"cp -p {profile} {temp} && mv -f {temp} {kept}; }} || {{ rm -f {temp}; exit 1; }}" in remove
    assert f"cmp -s {profile} {kept} || " in remove
    assert remove.endswith("nmcli connection delete uuid 6e38f5a2-dd93-4245-8818-2bc7db02f9dd >/dev/null")
    assert runs[2] == safe_apply.NETPLAN_APPLY  # after the removal: NetworkManager chooses again as it restarts
    assert kit.fresh == []  # no file changed: no revert guard, no confirm
    assert NetplanTask().check(ctx) == []


def test_an_idle_competitor_alone_is_removed_without_an_apply():
    kit = kit_with("mac-bound-unbound-unmanaged.txt")
    ctx = kit.node("spark1")
    ctx.shows.nm.devices = [d for d in ctx.shows.nm.devices if d.name != "enP2p1s0f1np1"]  # managed again
    changes = NetplanTask().check(ctx)
    assert [c.carried().kind for c in changes] == ["nm-profile"]
    after = copy.deepcopy(ctx.shows)
    after.nm.profiles = [p for p in after.nm.profiles if p.priority != 5]
    kit.transport("spark1").respond("nmcli connection delete", then=lambda: setattr(ctx, "shows", after))
    NetplanTask().apply(ctx, changes)
    assert not any(c.target.startswith("netplan apply") for c in kit.transport("spark1").calls)
    assert NetplanTask().check(ctx) == []


def test_an_unmanaged_twin_is_live_drift_and_the_failure_points_at_networkmanager(monkeypatch):

    kit = kit_with("mac-bound-unbound-unmanaged.txt")
    ctx = kit.node("spark1")
    ctx.shows.nm.profiles = [p for p in ctx.shows.nm.profiles if p.priority != 5]
    changes = NetplanTask().check(ctx)
    assert [c.summary for c in changes] == [
        "apply netplan: enP2p1s0f1np1 is not managed by NetworkManager, which renders it"]
    # it stays unmanaged (a conf file's unmanaged-devices): the addresses never come
    monkeypatch.setattr(safe_apply, "wait_for_addresses", lambda ctx, wanted, mtu, timeout=20.0: {"enP2p1s0f1np1": "x"})
    with pytest.raises(TaskFailed) as err:
        NetplanTask().apply(ctx, changes)
    assert [c.target for c in kit.transport("spark1").calls if c.kind == "run"][0] == safe_apply.NETPLAN_APPLY
    assert "nmcli device" in err.value.hint and "journalctl -u NetworkManager" in err.value.hint


def test_a_profile_outside_networkmanagers_keyfile_dirs_is_refused_not_deleted():
    kit = kit_with("competing-profile-active.txt")
    ctx = kit.node("spark1")
    rogue = next(p for p in ctx.shows.nm.profiles if p.name == "rogue")
    rogue.filename = "/etc/network/interfaces"
    with pytest.raises(TaskFailed) as err:
        NetplanTask().apply(ctx, NetplanTask().check(ctx))
    assert "cannot back up the NetworkManager profile(s) in /etc/network/interfaces" in err.value.message
    assert not any("nmcli connection delete" in c.target for c in kit.transport("spark1").calls)


def test_a_hostile_profile_file_name_stays_one_quoted_word(tmp_path):
    kit = kit_with("competing-profile-active.txt")
    ctx = kit.node("spark1")
    rogue = next(p for p in ctx.shows.nm.profiles if p.name == "rogue")
    rogue.filename = "/etc/NetworkManager/system-connections/x'; touch pwned; '$(touch pwned).nmconnection"
    with contextlib.suppress(TaskFailed):  # the recorded node never shows the addresses; the commands matter here
        NetplanTask().apply(ctx, NetplanTask().check(ctx))
    remove = next(c.target for c in kit.transport("spark1").calls if "nmcli connection delete" in c.target)
    assert subprocess.run(["bash", "-n"], input=remove, capture_output=True, text=True).returncode == 0
    stubbed = remove.replace("install -d", ": install").replace("cp -p", ": cp").replace("nmcli", ": nmcli")
    stubbed = stubbed.replace("/var/lib/sparkctl", str(tmp_path))
    subprocess.run(["bash", "-c", stubbed], cwd=tmp_path, capture_output=True)
    assert not (tmp_path / "pwned").exists()


# --- down.network -------------------------------------------------------------------------------------------------

def test_down_puts_the_removed_profiles_back_before_netplan_apply():
    inv = inventory()
    kit = make_kit(inv, {"spark1": nm_facts("spark1"), "spark2": nm_facts("spark2")})
    ctx = kit.node("spark1")
    record = {
        "interfaces.json": '{"enP2p1s0f1np1": {"addresses": [], "mtu": 1500}}',
        "40-cx7.yaml.absent": "",
        "nm/199f.nmconnection": "[connection]\nid=rogue\n",
        "nm/199f.path": "/etc/NetworkManager/system-connections/rogue.nmconnection\n",
        "nm/bad.nmconnection": "[connection]\nid=elsewhere\n",
        "nm/bad.path": "/etc/shadow\n",  # never written: not where NetworkManager keeps profiles
    }
    NetworkDown().apply(ctx, [Change("restore", payload=record)])
    calls = [(c.kind, normalize_run_id(c.target)) for c in kit.transport("spark1").calls]
    assert calls[0] == ("put", "/etc/NetworkManager/system-connections/rogue.nmconnection")
    assert calls[1] == ("run", "nmcli connection load /etc/NetworkManager/system-connections/rogue.nmconnection")
    assert calls[2][1].startswith("set -e\ninstall -d -m 700 /var/lib/sparkctl/spark-pair/network/revert-")
    assert not any(target == "/etc/shadow" for _, target in calls)
    put = kit.transport("spark1").puts[0]
    assert (put.content, put.mode, put.owner, put.sudo) == ("[connection]\nid=rogue\n", 0o600, "root:root", True)


# --- doctor -------------------------------------------------------------------------------------------------------

def nm_snapshot(fixture: str = "converged.txt"):
    s = healthy_snapshot()
    for name in ("spark1", "spark2"):
        f = s.facts[name]
        f.netplan_files.append(DGX_OS)
        f.nm = nmcli(fixture if name == "spark2" else "converged.txt")
        f.interfaces["enp1s0f1np1"].mac = BOUND_MAC
    return s


def test_a_healthy_networkmanager_cluster_has_no_findings():
    d = diagnose(nm_snapshot())
    assert d.healthy and d.findings == [], d.findings


def test_doctor_names_the_competing_profile_and_the_unmanaged_twin():
    d = diagnose(nm_snapshot("mac-bound-unbound-unmanaged.txt"))
    found = {(f.id, f.node): f for f in d.errors}
    assert set(found) == {("nm.competing_profile", "spark2"), ("nm.twin_unmanaged", "spark2")}
    competing = found["nm.competing_profile", "spark2"]
    assert competing.summary == ("NetworkManager profile 'fabric: by MAC \\\\\\\\ x' competes with netplan's for "
                                 "enp1s0f1np1")
    assert "6194c35c-d762-4201-9dca-61895aa5d73d" in competing.evidence and "priority 5" in competing.evidence
    assert competing.fix.endswith("sudo nmcli connection delete uuid 6194c35c-d762-4201-9dca-61895aa5d73d")
    assert "--only network" in competing.fix
    assert found["nm.twin_unmanaged", "spark2"].summary == "NetworkManager renders enP2p1s0f1np1 but does not manage it"


def test_networkmanager_stopped_is_an_error_only_where_it_renders_the_fabric():
    s = nm_snapshot("stopped.txt")
    assert {(f.id, f.node) for f in diagnose(s).errors} == {("nm.not_running", "spark2")}
    s.facts["spark2"].netplan_files.remove(DGX_OS)  # networkd renders it: NetworkManager may be off
    assert diagnose(s).findings == []


def test_nmcli_that_did_not_answer_is_not_read_as_stopped():
    """A loaded node's nmcli timed out (the section printed nothing; seen at load 124 on a 16-node lab): nothing is
    known, so a warning that it could not be read, never the error that NetworkManager is not running."""
    s = nm_snapshot("stopped.txt")
    s.facts["spark2"].nm = parse_nmcli("#devices\n")
    assert s.facts["spark2"].nm.status == "error"
    d = diagnose(s)
    assert d.errors == []
    assert {(f.id, f.node, f.severity) for f in d.findings} == {("nm.unread", "spark2", "warning")}


def test_doctor_fix_runs_the_network_tasks_for_networkmanager_findings():
    from sparkctl.doctor.fix import tasks_for

    for f in diagnose(nm_snapshot("mac-bound-unbound-unmanaged.txt")).errors:
        assert tasks_for(f) == ("network.netplan", "network.verify"), f.id


def test_the_bundle_carries_nmcli_as_it_answered(tmp_path):
    s = nm_snapshot("competing-profile-active.txt")
    path = tmp_path / "bundle.tar.gz"
    write_bundle(path, run_checks(s), s, journals=[])
    with tarfile.open(path) as tar:
        files = {Path(m.name).relative_to(Path(m.name).parts[0]).as_posix(): tar.extractfile(m).read().decode()
                 for m in tar.getmembers() if m.isfile()}
    assert files["spark2/nmcli.txt"] == (FIXTURES / "competing-profile-active.txt").read_text()
    assert "rogue" in files["spark2/facts.json"] and '"raw": ""' in files["spark2/facts.json"]
    assert io.StringIO(files["spark1/nmcli.txt"]).readline() == "#devices\n"


@pytest.mark.parametrize("temp_dir", [True, False], ids=["as a job", "in order"])
def test_the_facts_ask_nmcli_three_times_and_print_its_answers_as_captured(tmp_path, temp_dir):
    """The `nm` section on a node: an nmcli that answers as the real one did (the captured converged.txt, block by
    block), asked for the devices, the profiles, then the settings of exactly the profiles it listed; as a job (its
    three asks under one `timeout`) and in order (no temp dir: each under its own)."""
    from sparkctl.facts.script import render_script
    from sparkctl.transport.framing import Framing

    captured = (FIXTURES / "converged.txt").read_text()
    blocks = {name: text for name, text in
              (block.split("\n", 1) for block in captured.split("#")[1:])}
    for name, text in blocks.items():
        (tmp_path / name).write_text(text)
    nmcli = tmp_path / "bin" / "nmcli"
    nmcli.parent.mkdir()
    nmcli.write_text(f"""#!/bin/sh
echo "$*" >> {tmp_path}/asked
case "$*" in
  *" device status") cat {tmp_path}/devices ;;
  *FILENAME" connection show") cat {tmp_path}/connections ;;
  *" connection show "*) cat {tmp_path}/settings ;;
esac
""")
    nmcli.chmod(0o755)
    script = render_script("n") if temp_dir else "mktemp() { return 1; }\n" + render_script("n")
    out = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=60,
                         env={**os.environ, "PATH": f"{nmcli.parent}:{os.environ['PATH']}"}).stdout
    assert Framing("n").split(out)["nm"].output == captured
    asked = (tmp_path / "asked").read_text().splitlines()
    uuids = [line.split(":", 1)[0] for line in blocks["connections"].splitlines()]
    assert len(asked) == 3 and asked[2].endswith("connection show " + " ".join(uuids))


@pytest.mark.parametrize("temp_dir", [True, False], ids=["as a job", "in order"])
def test_a_networkmanager_that_is_not_running_is_asked_for_no_settings(tmp_path, temp_dir):
    """The devices and the connections are asked at once; where the devices' ask fails (nmcli's exit 8, "not
    running"), the section is its answer alone, and no settings are asked."""
    from sparkctl.facts.script import render_script
    from sparkctl.transport.framing import Framing

    nmcli = tmp_path / "bin" / "nmcli"
    nmcli.parent.mkdir()
    nmcli.write_text(f"""#!/bin/sh
echo "$*" >> {tmp_path}/asked
echo 'Error: NetworkManager is not running.' >&2
exit 8
""")
    nmcli.chmod(0o755)
    script = render_script("n") if temp_dir else "mktemp() { return 1; }\n" + render_script("n")
    out = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=60,
                         env={**os.environ, "PATH": f"{nmcli.parent}:{os.environ['PATH']}"}).stdout
    assert Framing("n").split(out)["nm"].output == "#devices\nError: NetworkManager is not running.\n"
    assert parse_nmcli(Framing("n").split(out)["nm"].output).status == "stopped"
    asked = sorted((tmp_path / "asked").read_text().splitlines())
    assert len(asked) == 2 and not any(" connection show " in a for a in asked)
