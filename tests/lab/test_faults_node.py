"""Faults of one node during a bootstrap (issue 17): its disk full while sparkctl writes a file, its docker daemon
stopped, its sshd restarted, its clock far off, the node much slower than the other. Each is one clear error on
that node (or none, when sparkctl can ride it out), nothing half-written, the other node finishes its own tasks,
and once the fault is removed the next run converges and the one after changes nothing.

The runs are in process with a hook on the event stream: a fault lands synchronously when the faulted node's task
starts (the runner emits task_start in that node's thread, before the task runs), so each case is deterministic.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from sparkctl.exitcodes import ExitStatus
from sparkctl.inventory import load_inventory
from sparkctl.lab.node import CGROUP_ROOT
from sparkctl.plan.paths import state_dir
from sparkctl.runs.playbooks import bootstrap_graph
from sparkctl.runs.session import RunRequest, run_playbook
from sparkctl.taskgraph import Event
from tests.lab.conftest import ssh
from tests.lab.fault_kit import NODE_TASKS, bootstrap_all, bootstrapped_pair, half_written, reset

pytestmark = pytest.mark.lab

FAULTY, HEALTHY = "spark2", "spark1"
# libfaketime (Debian package libfaketime): every process the node starts sees its clock shifted
FAKETIME_LIB = "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1"


@pytest.fixture(scope="module")
def lab(lab_factory):
    return bootstrapped_pair(lab_factory)


def run_with(lab, hook: Callable[[Event], None] | None = None):
    """One bootstrap in process; `hook(event)` sees each event as it is emitted, in the emitting thread."""
    events: list[Event] = []
    lock = threading.Lock()

    def emit(event: Event) -> None:
        with lock:
            events.append(event)
        if hook is not None:
            hook(event)

    result = run_playbook(load_inventory(lab.inventory_path), bootstrap_graph(), RunRequest(), emit)
    return result, events


def starting(event: Event, task: str, node: str | None) -> bool:
    return event.event == "task_start" and event.task == task and event.node == node


def status(result, task: str, node: str | None) -> str | None:
    outcome = result.outcome(task, node)
    return outcome.status.value if outcome else None


def assert_healthy_node_finished(result) -> None:
    for name in NODE_TASKS:
        assert status(result, name, HEALTHY) in ("ok", "changed"), (name, result.outcome(name, HEALTHY))


def assert_converges(lab) -> None:
    rerun = bootstrap_all(lab)
    assert rerun.exit_code == 0, rerun.describe()
    again = bootstrap_all(lab)
    assert again.exit_code == 0 and again.changed_total == 0, again.describe()
    for node in (HEALTHY, FAULTY):
        assert not half_written(lab, node), node


def failures(result) -> list[tuple[str, str | None, str]]:
    return [(o.task, o.node, o.message) for o in result.failed]


# --- disk full --------------------------------------------------------------------------------------------------
def test_a_full_disk_is_one_clear_error_on_that_node_and_nothing_half_written(lab):
    inventory = load_inventory(lab.inventory_path)
    state = state_dir(inventory, "/home/nvidia")
    keep = "/run/lab/real-state"
    # a small file system over the node's state dir, holding its keys and dirs, then filled to the last byte: the
    # entrypoint and the probe must be written again (a changed version of sparkctl would do the same)
    lab.exec(FAULTY, f"mkdir -p {keep} && mount --bind {state} {keep} && "
                     f"mount -t tmpfs -o size=512k,mode=700,uid=$(id -u nvidia),gid=$(id -g nvidia) full {state} && "
                     f"cp -a {keep}/container-ssh {state}/ && install -d -o nvidia -g nvidia {state}/run && "
                     f"(dd if=/dev/zero of={state}/filler bs=4k 2>/dev/null; true)", check=True)
    try:
        result, _ = run_with(lab)
        listing = lab.exec(FAULTY, ["ls", "-A", state]).stdout.split()
    finally:
        lab.exec(FAULTY, f"umount {state} && umount {keep}", check=True)

    assert result.exit_status() == ExitStatus.TASK_FAILED, failures(result)
    ((task, node, message),) = failures(result)
    assert (task, node) == ("container.state", FAULTY)
    assert message.startswith(f"{FAULTY}: cannot write {state}/") and "no space left on the device" in message
    assert result.outcome("container.state", FAULTY).hint.startswith(f"free space on {FAULTY} (df -h")
    assert not result.unreachable
    assert_healthy_node_finished(result)
    assert status(result, "container.run", FAULTY) == "skipped"
    # no temp file, no truncated entrypoint, no holder record; run.lock is the cluster lock's (empty) flock file
    assert sorted(listing) == ["container-ssh", "filler", "run", "run.lock"]
    assert_converges(lab)


def test_a_full_disk_where_the_network_record_goes_is_one_clear_error_and_nothing_half_written(lab):
    """The node's root state (/var/lib/sparkctl: the originals `cluster down --network` restores, the netplan revert
    guard's backups) on a full file system while its netplan file must be rewritten (edited by hand):
    network.netplan stops at its first write, before any netplan change, and leaves no temp file, no short record,
    no guard armed over a short backup."""
    netplan = "/etc/netplan/40-cx7.yaml"
    lab.exec(FAULTY, f"echo '# edited by hand' >> {netplan}", check=True)
    root = "/var/lib/sparkctl"
    lab.exec(FAULTY, f"mount -t tmpfs -o size=64k,mode=755 full {root} && "
                     f"(dd if=/dev/zero of={root}/filler bs=4k 2>/dev/null; true)", check=True)
    try:
        result, _ = run_with(lab)
        left = half_written(lab, FAULTY)
        files = lab.exec(FAULTY, ["find", root, "-type", "f"]).stdout.split()
    finally:
        lab.exec(FAULTY, f"umount {root}", check=True)

    assert result.exit_status() == ExitStatus.TASK_FAILED, failures(result)
    assert len(failures(result)) == 1, failures(result)
    ((task, node, message),) = failures(result)
    assert (task, node) == ("network.netplan", FAULTY)
    assert message == f"recording the original netplan files failed on {FAULTY} (no space left on the device)"
    assert result.outcome(task, node).hint.startswith(f"the disk of {FAULTY} is full where sparkctl writes")
    assert not result.unreachable
    assert_healthy_node_finished(result)
    assert left == [] and files == [f"{root}/filler"]
    assert lab.exec(FAULTY, ["tail", "-n", "1", netplan]).stdout == "# edited by hand\n"  # no netplan change
    assert_converges(lab)


# --- docker stopped ---------------------------------------------------------------------------------------------
def test_docker_stopped_mid_run_is_one_clear_error_on_that_node(lab):
    reset(lab, "container")  # the containers must be made again

    def stop_docker(event: Event) -> None:
        if starting(event, "container.image", FAULTY):
            lab.exec(FAULTY, "systemctl stop docker", check=True)

    try:
        result, _ = run_with(lab, stop_docker)
    finally:
        lab.exec(FAULTY, "systemctl start docker", check=True)

    assert result.exit_status() == ExitStatus.TASK_FAILED, failures(result)
    ((task, node, message),) = failures(result)
    assert node == FAULTY and task.startswith("container.")
    assert message.endswith(f"on {FAULTY} (the docker daemon does not answer)"), message
    assert result.outcome(task, node).hint.startswith(f"on {FAULTY}: sudo systemctl start docker")
    assert not result.unreachable
    assert_healthy_node_finished(result)
    assert_converges(lab)


# --- sshd restarted ---------------------------------------------------------------------------------------------
def test_sshd_restarted_mid_run_costs_nothing_but_a_new_connection(lab):
    reset(lab, "network")
    kicked = []

    def restart_sshd(event: Event) -> None:
        if starting(event, "network.netplan", FAULTY):
            # a package upgrade restarts sshd: the sessions live on; the netplan confirmation needs a NEW one
            lab.exec(FAULTY, "systemctl restart ssh", check=True)
            kicked.append("restart")
        elif starting(event, "ssh.keys", FAULTY):
            # a restart that takes the sessions with it: the controller's connection is closed under it
            lab.exec(FAULTY, "systemctl restart ssh && loginctl terminate-user nvidia", check=True)
            kicked.append("sessions")

    result, _ = run_with(lab, restart_sshd)
    assert kicked == ["restart", "sessions"]
    assert result.exit_status() == ExitStatus.SUCCESS, failures(result) or result.unreachable
    assert status(result, "network.netplan", FAULTY) == "changed"
    assert status(result, "ssh.keys", FAULTY) == "changed"
    assert_converges(lab)


# --- clock far off ----------------------------------------------------------------------------------------------
def test_a_clock_days_off_is_refused_on_that_node_before_anything_changes(lab):
    if not Path(FAKETIME_LIB).exists():
        pytest.fail(f"{FAKETIME_LIB} missing: apt-get install libfaketime (scripts/test installs it)")
    # the sessions sparkctl opens see the node's clock 3 days behind (pam_env reads /etc/environment at login);
    # sshd itself, and what runs through sudo, keep the real one
    lab.exec(FAULTY, "if [ -e /etc/environment ]; then cp /etc/environment /run/lab/environment.orig; fi; "
                     f"printf 'LD_PRELOAD={FAKETIME_LIB}\\nFAKETIME=-3d\\nFAKETIME_DONT_FAKE_MONOTONIC=1\\n' "
                     ">> /etc/environment", check=True)
    try:
        skew = int(ssh(lab, FAULTY, "date +%s").stdout) - time.time()
        result, _ = run_with(lab)
    finally:
        lab.exec(FAULTY, "if [ -e /run/lab/environment.orig ]; then cp /run/lab/environment.orig /etc/environment; "
                         "else rm -f /etc/environment; fi", check=True)
    assert skew < -2 * 86400, skew  # the fault was real

    assert result.exit_status() == ExitStatus.TASK_FAILED, failures(result) or result.unreachable
    ((task, node, message),) = failures(result)
    assert (task, node) == ("preflight.node", FAULTY)
    (problem,) = result.outcome(task, node).details
    assert problem.startswith("its clock is 3 d behind this controller's"), problem
    assert not [o for o in result.outcomes if o.node == FAULTY and o.status.value == "changed"]
    assert_healthy_node_finished(result)
    assert abs(int(ssh(lab, FAULTY, "date +%s").stdout) - time.time()) < 60  # the fault removed
    assert_converges(lab)


# --- one node much slower ---------------------------------------------------------------------------------------
def freezer_state(lab, node: str) -> Path:
    mount = next(m for m in lab.cgroup_mounts if "freezer" in m.mountpoint.split(","))
    return CGROUP_ROOT / mount.mountpoint / lab.node_cgroup(node) / "freezer.state"


def test_a_much_slower_node_holds_the_other_up_only_where_it_must(lab):
    reset(lab, "container")
    frozen = freezer_state(lab, FAULTY)
    thawed = threading.Event()

    def thaw() -> None:
        if not thawed.is_set():
            thawed.set()
            frozen.write_text("THAWED")

    def slow_down(event: Event) -> None:
        if starting(event, "container.image", FAULTY):
            frozen.write_text("FROZEN")  # everything on the node stops, its kernel still answers
            threading.Timer(8, thaw).start()  # a bound: slow, never lost
        elif event.event == "task_result" and event.task == "container.run" and event.node == HEALTHY:
            thaw()

    try:
        result, events = run_with(lab, slow_down)
    finally:
        thaw()

    assert result.exit_status() == ExitStatus.SUCCESS, failures(result) or result.unreachable
    order = [(e.event, e.task, e.node) for e in events]
    # the fast node went on through its own container tasks while the slow one was still at its first
    assert order.index(("task_start", "container.state", HEALTHY)) < \
        order.index(("task_result", "container.image", FAULTY))
    # and met it where it must: the cluster task that needs both containers
    assert order.index(("task_result", "container.run", FAULTY)) < order.index(("task_start", "container.ssh", None))
    assert_converges(lab)
