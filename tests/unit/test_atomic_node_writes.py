"""The records and backups the network tasks write on a node are whole or absent (issue 17: "a lost connection never
leaves a half-written file"): the scripts they send, run for real with bash inside a temp dir, on a disk that takes
no byte (`ulimit -f 0` with SIGXFSZ ignored: every write fails as on a full file system, as root too). A failure
is reported (exit status), nothing half-written stays, the profile or netplan file is left alone, and the next run
writes the record whole.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from sparkctl.plan import paths as plan_paths
from sparkctl.taskgraph.task import TaskFailed
from sparkctl.tasks.network import safe_apply
from sparkctl.tasks.network.forwarding import record_script
from tests.taskkit import inventory, make_kit, spark_facts

FULL = "trap '' XFSZ; ulimit -f 0\n"
UUID = "6e38f5a2-dd93-4245-8818-2bc7db02f9dd"


def bash(script: str, *, full: bool = False, path: str | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, **({"PATH": path} if path else {})}
    return subprocess.run(["bash", "-c", (FULL if full else "") + script], capture_output=True, text=True,
                          timeout=20, env=env)


def listing(directory: Path) -> list[str]:
    return sorted(str(p.relative_to(directory)) for p in directory.rglob("*"))


# --- network.forwarding: the kernel settings it replaced -----------------------------------------------------------
def test_the_forwarding_record_is_whole_or_absent(tmp_path):
    original = tmp_path / "original" / "sysctl.orig"
    was = "net/ipv4/conf/enp1s0f0np0/forwarding 0\nnet/ipv4/conf/enp1s0f0np0/rp_filter 1\n"
    failed = bash(record_script(str(original), was), full=True)
    assert failed.returncode != 0
    # no empty record that no later run would rewrite (and `cluster down --network` would restore nothing from)
    assert listing(tmp_path) == ["original"]
    assert bash(record_script(str(original), was)).returncode == 0
    assert original.read_text() == was
    # recorded once: a later run's values (sparkctl's own) never replace the original ones
    assert bash(record_script(str(original), "net/ipv4/conf/enp1s0f0np0/forwarding 1\n")).returncode == 0
    assert original.read_text() == was and listing(tmp_path) == ["original", "original/sysctl.orig"]


# --- network.netplan: the originals of the netplan files and the fabric addresses ------------------------------
def test_the_netplan_originals_are_whole_or_absent_and_a_failure_is_reported(tmp_path, monkeypatch):
    monkeypatch.setattr(plan_paths, "NETWORK_STATE_ROOT", str(tmp_path / "state"))
    netplan = tmp_path / "40-cx7.yaml"
    netplan.write_text("network:\n  version: 2\n" + "#" * 4000 + "\n")
    kit = make_kit(inventory(), {n: spark_facts(n) for n in ("spark1", "spark2")})
    safe_apply.record_originals(kit.node("spark1"), [str(netplan)], ["enp1s0f1np1"])
    (script,) = kit.transport("spark1").commands
    original = Path(plan_paths.network_state_dir(kit.cluster.inventory.cluster.name)) / "original"
    assert bash(script, full=True).returncode != 0
    assert listing(original) == []
    assert bash(script).returncode == 0
    assert (original / "40-cx7.yaml").read_text() == netplan.read_text()
    assert json.loads((original / "interfaces.json").read_text())["enp1s0f1np1"]["mtu"] == 1500
    assert listing(original) == ["40-cx7.yaml", "interfaces.json"]


# --- network.netplan: a competing NetworkManager profile, backed up then deleted --------------------------------
def nm_script(base: Path, profile: Path, deleted: Path) -> str:
    lines = ["set -e", f"install -d -m 700 {base}", *safe_apply.nm_backup_lines(str(base), UUID, str(profile)),
             f"touch {deleted}"]  # stands for `nmcli connection delete`
    return "\n".join(lines)


@pytest.fixture
def nm(tmp_path):
    profile = tmp_path / "rogue.nmconnection"
    profile.write_text("[connection]\nid=rogue\nuuid=" + UUID + "\ntype=ethernet\n" + "x" * 4000 + "\n")
    return tmp_path / "nm", profile, tmp_path / "deleted"


def test_a_profile_is_not_deleted_when_its_backup_cannot_be_written(nm):
    base, profile, deleted = nm
    failed = bash(nm_script(base, profile, deleted), full=True)
    assert failed.returncode != 0 and not deleted.exists()
    assert listing(base) == []  # no temp, no short backup
    assert bash(nm_script(base, profile, deleted)).returncode == 0
    assert deleted.exists() and (base / f"{UUID}.nmconnection").read_text() == profile.read_text()
    assert (base / f"{UUID}.path").read_text() == f"{profile}\n"
    assert listing(base) == [f"{UUID}.nmconnection", f"{UUID}.path"]


def test_a_backup_cut_short_earlier_is_written_again_before_the_profile_goes(nm):
    base, profile, deleted = nm
    base.mkdir()
    (base / f"{UUID}.nmconnection").write_text(profile.read_text()[:100])  # what a cut copy left
    assert bash(nm_script(base, profile, deleted)).returncode == 0
    assert (base / f"{UUID}.nmconnection").read_text() == profile.read_text() and deleted.exists()


def test_a_profile_whose_file_is_gone_is_deleted_only_with_a_backup_taken_before(nm):
    base, profile, deleted = nm
    gone = profile.with_name("gone.nmconnection")
    refused = bash(nm_script(base, gone, deleted))
    assert refused.returncode == 3 and f"no profile file {gone}" in refused.stderr and not deleted.exists()
    base.mkdir(exist_ok=True)
    (base / f"{UUID}.nmconnection").write_text("[connection]\nid=rogue\n")
    assert bash(nm_script(base, gone, deleted)).returncode == 0 and deleted.exists()


# --- network.netplan: the node-side revert guard ----------------------------------------------------------------
@pytest.fixture
def arming(tmp_path, monkeypatch):
    """arm_revert's script for a netplan file inside tmp_path; setsid/nohup are stubs that log their arguments."""
    monkeypatch.setattr(plan_paths, "NETWORK_STATE_ROOT", str(tmp_path / "state"))
    netplan = tmp_path / "etc-netplan" / "40-cx7.yaml"
    netplan.parent.mkdir()
    netplan.write_text("network:\n  version: 2\n" + "#" * 4000 + "\n")
    stubs = tmp_path / "bin"
    stubs.mkdir()
    for name in ("setsid", "nohup"):
        (stubs / name).write_text(f'#!/bin/sh\nprintf "%s\\n" "{name} $*" >> {tmp_path}/started\n')
        (stubs / name).chmod(0o755)
    kit = make_kit(inventory(), {n: spark_facts(n) for n in ("spark1", "spark2")})
    ctx = kit.node("spark1")
    run_id = safe_apply.arm_revert(ctx, [str(netplan), str(netplan.with_name("50-absent.yaml"))], 30)
    (script,) = kit.transport("spark1").commands
    network = Path(plan_paths.network_state_dir(kit.cluster.inventory.cluster.name))
    return script, run_id, network, netplan, f"{stubs}:{os.environ['PATH']}", tmp_path / "started"


def test_a_revert_guard_is_never_armed_over_a_backup_that_could_not_be_written(arming):
    script, run_id, network, netplan, path, started = arming
    failed = bash(script, full=True, path=path)
    assert failed.returncode != 0, "a failed backup went unnoticed"
    assert not started.exists(), "the guard was started over a failed backup"
    # nothing the guard would restore from, no temp, no guard script
    assert listing(network) == [f"revert-{run_id}"]


def test_a_revert_guard_is_armed_over_whole_backups(arming):
    script, run_id, network, netplan, path, started = arming
    # the guard is started in the background (`&`): wait for it, or its stub may not have written yet
    assert bash(script + "\nwait", path=path).returncode == 0
    backup = network / f"revert-{run_id}"
    assert (backup / "40-cx7.yaml").read_text() == netplan.read_text()
    assert (backup / "absent").read_text() == f"{netplan.with_name('50-absent.yaml')}\n"
    assert listing(network) == [f"revert-{run_id}", f"revert-{run_id}.sh", f"revert-{run_id}/40-cx7.yaml",
                                f"revert-{run_id}/absent"]
    assert started.read_text() == f"setsid nohup /bin/sh {network}/revert-{run_id}.sh\n"


def test_a_path_with_a_newline_is_refused_before_anything_is_sent():
    kit = make_kit(inventory(), {n: spark_facts(n) for n in ("spark1", "spark2")})
    with pytest.raises(TaskFailed) as err:
        safe_apply.arm_revert(kit.node("spark1"), ["/etc/netplan/40-cx7.yaml\n/etc/passwd"], 30)
    assert "a path holds a newline" in err.value.message
    assert kit.transport("spark1").commands == []
