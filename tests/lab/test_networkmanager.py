"""A lab rendered by NetworkManager, as DGX OS ships (01-network-manager-all.yaml, NetworkManager under systemd):
it bootstraps, a rerun changes nothing, drift is repaired exactly (a competing NetworkManager profile on a twin,
an idle one that would win, a flushed address, an unmanaged twin), doctor is clean and names what competes, the
bundle carries nmcli, and `cluster down --network` puts back the profiles sparkctl removed.

One lab for the whole module (bring-up and the first full bootstrap are most of its cost). The networkd renderer
is covered by the other lab modules (their labs pin it) and by the revert guard, which runs under both.
"""

from __future__ import annotations

import tarfile

import pytest

from sparkctl.plan.paths import network_state_dir
from tests.lab import doctor_kit as kit
from tests.lab.conftest import poll
from tests.lab.doctor_kit import doctor, errors
from tests.lab.network_kit import bootstrap, fabric_of, snapshot, sparkctl
from tests.lab.nm_kit import NM_SEEDS

pytestmark = pytest.mark.lab

DGX_OS_FILE = "/etc/netplan/01-network-manager-all.yaml"
PLANNED = {"spark1": {"enp1s0f1np1": "192.168.100.10/24", "enP2p1s0f1np1": "192.168.101.10/24"},
           "spark2": {"enp1s0f1np1": "192.168.100.11/24", "enP2p1s0f1np1": "192.168.101.11/24"}}


def nm_profiles(lab, node: str) -> dict[str, dict[str, str]]:
    """nmcli's profiles on a node: name -> device it is active on, its file, its bound interface."""
    out = lab.exec(node, "LC_ALL=C nmcli -t -f NAME,UUID,DEVICE,FILENAME connection show", check=True).stdout
    profiles = {}
    for line in out.splitlines():
        name, uuid, device, filename = line.replace("\\:", "\x00").split(":")
        bound = lab.exec(node, ["nmcli", "-g", "connection.interface-name", "connection", "show", uuid]).stdout
        profiles[name.replace("\x00", ":")] = {"device": device, "file": filename, "bound": bound.strip()}
    return profiles


def nm_devices(lab, node: str) -> dict[str, tuple[str, str]]:
    out = lab.exec(node, "LC_ALL=C nmcli -t -f DEVICE,STATE,CONNECTION device status", check=True).stdout
    return {d: (state, conn) for d, state, conn in (line.split(":") for line in out.splitlines())}


def nm_pid(lab, node: str) -> str:
    return lab.exec(node, ["systemctl", "show", "-p", "MainPID", "--value", "NetworkManager"]).stdout.strip()


def full_bootstrap(lab):
    return sparkctl(lab, "cluster", "bootstrap", str(lab.inventory_path))


@pytest.fixture(scope="module")
def nm_lab(lab_factory):
    """(lab, what NetworkManager showed at first boot, the first full bootstrap)."""
    lab = lab_factory(2, "pair", port=1, renderer="networkmanager")
    # the auto-created profiles are there as soon as NetworkManager has seen the twins
    assert poll(lambda: {"enp1s0f1np1", "enP2p1s0f1np1"} <= {
        p["bound"] for name, p in nm_profiles(lab, "spark1").items() if name.startswith("Wired connection")}), \
        nm_profiles(lab, "spark1")
    booted = {n.name: (nm_profiles(lab, n.name), nm_devices(lab, n.name)) for n in lab.nodes}
    return lab, booted, full_bootstrap(lab)


@pytest.fixture
def converged(nm_lab):
    lab, _booted, first = nm_lab
    assert first.exit_code == 0, first.describe()
    before = snapshot(lab)
    yield lab, before
    if snapshot(lab) != before:  # whatever a test did, leave the pair converged for the next one
        bootstrap(lab)


def repair(lab, before: dict, expected: set):
    run = bootstrap(lab)
    assert run.exit_code == 0, run.describe()
    assert run.changed() == expected, run.describe()
    assert snapshot(lab) == before
    again = bootstrap(lab)
    assert again.exit_code == 0 and again.changed_total == 0, again.describe()
    return run


def test_the_nodes_boot_as_dgx_os_does(nm_lab):
    lab, booted, _first = nm_lab
    for n in lab.nodes:
        assert lab.exec(n.name, ["systemctl", "is-active", "NetworkManager"]).stdout.strip() == "active"
        assert lab.exec(n.name, ["systemctl", "is-enabled", "systemd-networkd"]).stdout.strip() == "disabled"
        assert "renderer: NetworkManager" in lab.exec(n.name, ["cat", DGX_OS_FILE], check=True).stdout
        profiles, devices = booted[n.name]
        # NetworkManager's own profiles on the unconfigured twins, the management port through netplan
        wired = {p["bound"]: name for name, p in profiles.items() if name.startswith("Wired connection")}
        assert {"enp1s0f1np1", "enP2p1s0f1np1", "enp1s0f0np0", "enP2p1s0f0np0"} <= set(wired), profiles
        assert devices["enp1s0f1np1"][1] == wired["enp1s0f1np1"], devices
        assert devices["enP7s7"] == ("connected", "netplan-enP7s7")
        assert all(p["file"].startswith("/run/NetworkManager/system-connections/") for p in profiles.values())


def test_bootstrap_converges_and_a_rerun_changes_nothing(nm_lab):
    lab, _booted, first = nm_lab
    assert first.exit_code == 0, first.describe()
    assert {("network.netplan", "spark1"), ("network.netplan", "spark2")} <= first.changed()
    for n in lab.nodes:
        live = fabric_of(lab, n.name)
        for iface, addr in PLANNED[n.name].items():
            assert live[iface] == {"mtu": 9000, "inet": [addr]}, (n.name, iface, live[iface])
            assert nm_devices(lab, n.name)[iface] == ("connected", f"netplan-{iface}")
    second = full_bootstrap(lab)
    assert second.exit_code == 0, second.describe()
    assert second.changed_total == 0, second.changed()


def test_a_competing_profile_active_on_a_twin_is_removed_and_netplans_wins(converged):
    lab, before = converged
    lab.exec("spark1", "nmcli connection add type ethernet ifname enP2p1s0f1np1 con-name rogue ipv4.method manual "
                       "ipv4.addresses 192.168.55.5/24 >/dev/null && nmcli connection up rogue >/dev/null", check=True)
    assert poll(lambda: fabric_of(lab, "spark1")["enP2p1s0f1np1"]["inet"] == ["192.168.55.5/24"])
    run = repair(lab, before, {("network.netplan", "spark1")})
    summaries = run.change_summaries("network.netplan")
    assert any(s.startswith("remove the NetworkManager profile 'rogue' that competes with netplan's for "
                            "enP2p1s0f1np1 (active, bound by name") for s in summaries), summaries
    assert "rogue" not in nm_profiles(lab, "spark1")
    assert nm_devices(lab, "spark1")["enP2p1s0f1np1"] == ("connected", "netplan-enP2p1s0f1np1")
    backups = lab.exec("spark1", f"cat {network_state_dir(lab.names.cluster_name)}/original/nm/*.path").stdout
    assert backups == "/etc/NetworkManager/system-connections/rogue.nmconnection\n"


def test_an_idle_profile_that_would_win_is_removed_without_touching_the_link(converged):
    lab, before = converged
    mac = lab.exec("spark2", ["cat", "/sys/class/net/enp1s0f1np1/address"], check=True).stdout.strip()
    lab.exec("spark2", f"nmcli connection add type ethernet con-name by-mac ethernet.mac-address {mac} "
                       "ipv4.method manual ipv4.addresses 192.168.56.7/24 connection.autoconnect-priority 10 "
                       ">/dev/null", check=True)
    pid = nm_pid(lab, "spark2")
    run = repair(lab, before, {("network.netplan", "spark2")})
    (summary,) = run.change_summaries("network.netplan")
    assert summary.startswith("remove the NetworkManager profile 'by-mac' that competes with netplan's for "
                              "enp1s0f1np1 (inactive, bound by MAC, autoconnect priority 10 >= netplan's 0")
    assert nm_pid(lab, "spark2") == pid, "no netplan apply: NetworkManager was not restarted"
    assert "by-mac" not in nm_profiles(lab, "spark2")


def test_a_flushed_address_is_restored(converged):
    lab, before = converged
    lab.exec("spark2", "ip addr flush dev enP2p1s0f1np1", check=True)
    assert fabric_of(lab, "spark2")["enP2p1s0f1np1"]["inet"] == []
    # NetworkManager does not put it back by itself: the profile stays "connected" without its address
    assert nm_devices(lab, "spark2")["enP2p1s0f1np1"] == ("connected", "netplan-enP2p1s0f1np1")
    run = repair(lab, before, {("network.netplan", "spark2")})
    assert run.change_summaries("network.netplan") == ["apply netplan: enP2p1s0f1np1 lacks 192.168.101.11/24"]


def test_an_unmanaged_twin_is_managed_again(converged):
    lab, before = converged
    lab.exec("spark1", "nmcli device set enp1s0f1np1 managed no", check=True)
    assert poll(lambda: nm_devices(lab, "spark1")["enp1s0f1np1"][0] == "unmanaged")
    run = repair(lab, before, {("network.netplan", "spark1")})
    assert any("enp1s0f1np1 is not managed by NetworkManager, which renders it" in s
               for s in run.change_summaries("network.netplan"))
    assert nm_devices(lab, "spark1")["enp1s0f1np1"] == ("connected", "netplan-enp1s0f1np1")


def test_doctor_is_clean_names_a_competing_profile_and_fix_removes_it(converged, tmp_path):
    lab, _before = converged
    report = doctor(lab)
    assert report["healthy"], errors(report)
    lab.exec("spark2", "nmcli connection add type ethernet ifname enP2p1s0f1np1 con-name wins-next "
                       "connection.autoconnect-priority 5 >/dev/null", check=True)
    report = doctor(lab, "--bundle", str(tmp_path / "bundle.tar.gz"))
    assert errors(report) == {("nm.competing_profile", "spark2")}, report["findings"]
    finding = next(f for f in report["findings"] if f["id"] == "nm.competing_profile")
    assert "wins-next" in finding["summary"] and "sudo nmcli connection delete uuid" in finding["fix"]
    with tarfile.open(tmp_path / "bundle.tar.gz") as tar:
        nmcli = {m.name.split("/", 1)[1]: tar.extractfile(m).read().decode() for m in tar.getmembers()
                 if m.name.endswith("/nmcli.txt")}
    assert set(nmcli) == {"spark1/nmcli.txt", "spark2/nmcli.txt"}
    assert "wins-next" in nmcli["spark2/nmcli.txt"] and "netplan-enP2p1s0f1np1" in nmcli["spark1/nmcli.txt"]
    fixed = doctor(lab, "--fix")
    assert fixed["healthy"], errors(fixed)
    assert "wins-next" not in nm_profiles(lab, "spark2")


# --- seeded faults on the NetworkManager-rendered pair (the lab's default renderer, as DGX OS ships) -------------
# Each as tests/lab/test_doctor_repairs.py does them: doctor names it on its node and nothing else, `doctor --fix`
# repairs it (healthy after), a bootstrap rerun then changes nothing; seeded again, a plain bootstrap rerun repairs
# it, doctor is healthy, and the next rerun changes nothing.



@pytest.fixture(scope="module")
def nm_baseline(nm_lab):
    lab, _booted, first = nm_lab
    assert first.exit_code == 0, first.describe()
    healthy = kit.doctor(lab)
    assert healthy["healthy"], healthy["findings"]
    # what a healthy lab warns about anyway: its veths link at 10 Gb/s (fabric.speed_low), nothing else
    baseline = kit.problems(healthy)
    assert {i for i, _ in baseline} <= {"fabric.speed_low"}, baseline
    return baseline


@pytest.fixture
def nm_restore(nm_lab, request):
    """A case that fails leaves the pair repaired for the next one."""
    yield
    if getattr(request.node, "failed_call", False):
        kit.bootstrap(nm_lab[0])


def seeded(lab, baseline, seed) -> dict:
    seed.seed(lab)
    reports: list[dict] = []

    def look():
        reports.append(kit.doctor(lab))
        return (seed.finding, seed.node) in kit.problems(reports[-1]) - baseline

    poll(look, timeout=120, interval=0.5)  # returns at the first report that has it
    return reports[-1]


@pytest.mark.parametrize("seed", NM_SEEDS, ids=[s.name for s in NM_SEEDS])
def test_doctor_fix_repairs_a_seeded_fault_and_a_rerun_changes_nothing(nm_lab, nm_baseline, nm_restore, seed):
    lab = nm_lab[0]
    report = seeded(lab, nm_baseline, seed)
    assert kit.problems(report) - nm_baseline == {(seed.finding, seed.node), *seed.also}, report["findings"]
    assert not report["healthy"]
    if seed.finding == "fabric.port_down":  # one finding, its far end's lost carrier under it, no cable
        (f,) = [f for f in report["findings"] if f["id"] == "fabric.port_down"]
        assert "spark2 enP2p1s0f1np1 has no carrier because spark1's end is administratively down" in f["details"]
        assert "cable" not in str([f for f in report["findings"] if f["id"] != "fabric.speed_low"]).lower()
    fixed = kit.doctor(lab, "--fix")
    assert fixed["fix"]["ran"] and fixed["fix"]["exit_status"] == 0, fixed["fix"]
    assert fixed["healthy"] and kit.problems(fixed) - nm_baseline == set(), fixed["findings"]
    code, events = kit.bootstrap(lab)
    assert code == 0 and kit.changed(events) == set(), (kit.changed(events), kit.failed(events))


#: A twin set down is brought Up by the same network.netplan step whichever command runs it: doctor --fix above
#: (with its one-finding checks) carries it; the NetworkManager seeds of their own go both ways.
RERUN_SEEDS = [s for s in NM_SEEDS if s.name != "nm-twin-set-down"]


@pytest.mark.parametrize("seed", RERUN_SEEDS, ids=[s.name for s in RERUN_SEEDS])
def test_a_bootstrap_rerun_repairs_a_seeded_fault_and_the_next_changes_nothing(nm_lab, nm_baseline, nm_restore,
                                                                               seed):
    lab = nm_lab[0]
    seeded(lab, nm_baseline, seed)
    code, events = kit.bootstrap(lab)
    assert code == 0 and kit.changed(events), (kit.changed(events), kit.failed(events))
    if seed.finding == "fabric.port_down":  # preflight goes on, nobody is sent to the cables
        assert [e for e in events if "cable" in str(e).lower() and "Gb/s" not in str(e.get("message"))] == []
        summaries = [(e.get("node"), c["summary"]) for e in events if e["event"] == "task_result"
                     for c in e.get("changes", [])]
        assert ("spark1", "bring enP2p1s0f1np1 up (administratively down; Up is part of the planned state)") in \
            summaries and {task for task, _ in kit.changed(events)} == {"network.netplan"}, summaries
        # NetworkManager takes a twin's profile down with its carrier and puts its MTU back to 1500: spark2's end is
        # set to the plan again (its address comes with the carrier), nothing else is changed there
        assert {c for n, c in summaries if n == "spark2"} <= {"apply netplan: enP2p1s0f1np1 mtu 1500, want 9000"}, \
            summaries
    after = kit.doctor(lab)
    assert after["healthy"] and kit.problems(after) - nm_baseline == set(), after["findings"]
    code, events = kit.bootstrap(lab)
    assert code == 0 and kit.changed(events) == set(), (kit.changed(events), kit.failed(events))


def test_down_network_puts_back_what_sparkctl_removed(nm_lab):
    lab, _booted, _first = nm_lab
    down = sparkctl(lab, "cluster", "down", str(lab.inventory_path), "--network")
    assert down.exit_code == 0, down.describe()
    for n in lab.nodes:
        assert lab.exec(n.name, ["test", "-e", "/etc/netplan/40-cx7.yaml"]).returncode == 1
        assert lab.exec(n.name, ["test", "-e", network_state_dir(lab.names.cluster_name)]).returncode == 1
    # the profiles the drift tests made and bootstrap removed are back, where NetworkManager keeps them
    assert nm_profiles(lab, "spark1")["rogue"]["file"] == "/etc/NetworkManager/system-connections/rogue.nmconnection"
    assert {"by-mac", "wins-next"} <= set(nm_profiles(lab, "spark2"))
    assert "192.168.101.11/24" not in fabric_of(lab, "spark2")["enP2p1s0f1np1"]["inet"]
    again = sparkctl(lab, "cluster", "down", str(lab.inventory_path), "--network")
    assert again.exit_code == 0 and again.changed_total == 0, again.describe()
