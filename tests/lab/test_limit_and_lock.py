"""On one converged lab pair: --limit with Ansible's meaning (changes happen only on the limited nodes, while
what the cluster shares -- keys, known hosts, ssh config, hostfile, container mesh -- is still computed from every
node), and the cluster lock held on the nodes (a second run is refused naming the holder; a killed holder's
lock is taken over)."""

from __future__ import annotations

import signal
import subprocess

import pytest

from tests.lab.lab_kit import CONTAINER, changed, results
from tests.lab.lab_kit import sparkctl as run_sparkctl
from tests.taskkit import doctor_report

pytestmark = pytest.mark.lab

def sparkctl(lab, *args: str) -> tuple[int, list[dict], str]:
    return run_sparkctl([*args, "--json"])


def bootstrap(lab, *extra: str) -> tuple[int, list[dict], str]:
    return sparkctl(lab, "cluster", "bootstrap", str(lab.inventory_path), *extra)


def failures(events) -> list[dict]:
    return results(events, "failed", "unreachable")


def applied_on(events) -> set[str]:
    """Every node a change was applied on: node tasks by their node, cluster tasks by the change's label."""
    nodes = set()
    for e in events:
        if e["event"] != "task_changes":
            continue
        if e.get("node"):
            nodes.add(e["node"])
        for change in e["changes"]:
            nodes.update(n for n in ("spark1", "spark2") if n in change["summary"])
    return nodes


def node_state(lab, node: str) -> str:
    """What a run must not touch on a node: addresses, netplan, ssh files, sparkctl's state, the container (its
    id and start time) and the files in it."""
    script = (f"ip -br addr; ip -br link; sha256sum /etc/netplan/*; sha256sum /home/nvidia/.ssh/*; "
              f"find /home/nvidia/.local/state/sparkctl -type f ! -name 'run.lock' ! -name 'run.holder*' "
              f"-printf '%p %s %T@\\n' | sort; docker inspect -f '{{{{.Id}}}} {{{{.State.StartedAt}}}}' {CONTAINER}; "
              f"docker exec {CONTAINER} sh -c 'sha256sum /etc/openmpi-hostfile /root/.ssh/*'")
    return lab.exec(node, ["sh", "-c", script]).stdout


def same_state(before: dict[str, str], lab) -> list[str]:
    """The lines of node_state that changed, per node (empty: untouched)."""
    out = []
    for node, text in before.items():
        now = node_state(lab, node)
        out += [f"{node}: -{line}" for line in text.splitlines() if line not in now.splitlines()]
        out += [f"{node}: +{line}" for line in now.splitlines() if line not in text.splitlines()]
    return out


def doctor_errors(lab) -> list[dict]:
    proc = subprocess.run(["sparkctl", "doctor", str(lab.inventory_path), "--json"], capture_output=True,
                          text=True, timeout=300)
    return [f for f in doctor_report(proc.stdout)["findings"] if f["severity"] == "error"]


@pytest.fixture(scope="module")
def converged(lab_factory):
    lab = lab_factory(2, "pair", port=1)
    rc, events, _ = bootstrap(lab)
    assert rc == 0, failures(events)
    return lab


def test_limit_on_a_converged_pair_changes_nothing_and_doctor_stays_healthy(converged):
    lab = converged
    before = {n: node_state(lab, n) for n in ("spark1", "spark2")}
    rc, events, err = bootstrap(lab, "--limit", "spark1")
    assert rc == 0, (failures(events), err)
    assert changed(events) == set()
    assert not [e for e in events if e["event"] == "warning" and "outside --limit" in e.get("message", "")]
    assert same_state(before, lab) == []
    assert events[0]["nodes"] == ["spark1"] and events[0]["outside_limit"] == ["spark2"]
    assert events[-1]["verified"] is True
    assert doctor_errors(lab) == []


def test_drift_on_spark2_is_repaired_by_limit_spark2_without_touching_spark1(converged):
    lab = converged
    cluster = lab.names.cluster_name
    drift = (f"sed -i '/sparkctl-{cluster}@spark1/d' /home/nvidia/.ssh/authorized_keys; "
             "ip link set enP2p1s0f1np1 mtu 1500; "
             f"docker exec {CONTAINER} sh -c 'echo 10.9.9.9 > /etc/openmpi-hostfile'")
    lab.exec("spark2", ["sh", "-c", drift], check=True)
    spark1 = node_state(lab, "spark1")
    rc, events, err = bootstrap(lab, "--limit", "spark2")
    assert rc == 0, (failures(events), err)
    assert {("network.netplan", "spark2"), ("ssh.mesh", None), ("mpi.hostfile", None)} <= changed(events)
    assert not {node for _, node in changed(events)} - {"spark2", None}
    assert applied_on(events) == {"spark2"}
    assert same_state({"spark1": spark1}, lab) == []
    assert events[-1]["verified"] is True
    rc, events, _ = bootstrap(lab)
    assert rc == 0 and changed(events) == set(), failures(events)
    assert doctor_errors(lab) == []


def test_limit_leaves_drift_outside_it_alone_and_says_so(converged):
    lab = converged
    lab.exec("spark2", ["sh", "-c", f"docker exec {CONTAINER} sh -c 'echo 10.9.9.9 > /etc/openmpi-hostfile'"],
             check=True)
    spark2 = node_state(lab, "spark2")
    rc, events, _ = bootstrap(lab, "--limit", "spark1", "--check")
    left = [e for e in events if e["event"] == "warning" and e.get("task") == "mpi.hostfile"]
    assert left and left[0]["message"] == "left alone outside --limit: 1 change(s)"
    assert left[0]["details"] == ["update spark2: /etc/openmpi-hostfile in the container"]
    assert "--limit spark2" in left[0]["hint"]
    assert same_state({"spark2": spark2}, lab) == []
    rc, events, _ = bootstrap(lab, "--limit", "spark2")
    assert rc == 0 and changed(events) == {("mpi.hostfile", None)}, failures(events)


def test_doctor_limit_reports_the_limited_node_only(converged):
    lab = converged
    lab.exec("spark2", ["sh", "-c", "ip link set enP2p1s0f1np1 mtu 1500"], check=True)
    try:
        proc = subprocess.run(["sparkctl", "doctor", str(lab.inventory_path), "--limit", "spark1", "--json"],
                              capture_output=True, text=True, timeout=300)
        assert "spark2" not in {f.get("node") for f in doctor_report(proc.stdout)["findings"]
                                if f["severity"] == "error"}
        proc = subprocess.run(["sparkctl", "doctor", str(lab.inventory_path), "--limit", "spark2", "--json"],
                              capture_output=True, text=True, timeout=300)
        found = {(f["id"], f["node"]) for f in doctor_report(proc.stdout)["findings"] if f["severity"] == "error"}
        assert ("fabric.mtu_mismatch", "spark2") in found and proc.returncode == 1
    finally:
        lab.exec("spark2", ["sh", "-c", "ip link set enP2p1s0f1np1 mtu 9000"], check=True)


def test_only_a_later_phase_after_down_network_brings_the_fabric_back_first(converged):
    """`cluster down --network`, then `--only serve` (what doctor suggests after a down): the containers' sshd
    listens on the fabric addresses and their mesh connects over them, so the run puts them back first (and says
    so) instead of meshing containers against addresses that are not there, and converges."""
    lab = converged
    rc, events, err = sparkctl(lab, "cluster", "down", str(lab.inventory_path), "--network")
    assert rc == 0, (failures(events), err)
    try:
        rc, events, err = bootstrap(lab, "--only", "serve")
        assert rc == 0, (failures(events), err)
        assert {"network.netplan", "network.forwarding", "container.run", "container.ssh",
                "mpi.hostfile"} <= set(events[0]["added_needs"])
        assert {("network.netplan", "spark1"), ("network.netplan", "spark2"), ("container.run", "spark1"),
                ("container.run", "spark2")} <= changed(events)
        applied = [e["task"] for e in events if e["event"] == "task_changes"]
        assert applied.index("network.netplan") < applied.index("container.run")
        rc, events, err = bootstrap(lab, "--only", "serve")
        assert rc == 0 and changed(events) == set(), (failures(events), err)
    finally:
        rc, events, err = bootstrap(lab)  # the ssh keys `down --network` took: the module's other tests need them
        assert rc == 0, (failures(events), err)


# --- the cluster lock ---------------------------------------------------------------------------------------

def holder_on(lab, node: str) -> str:
    path = f"/home/nvidia/.local/state/sparkctl/{lab.names.cluster_name}/run.holder"
    return lab.exec(node, ["sh", "-c", f"cat {path} 2>/dev/null"]).stdout


def wait_for(check, timeout: float = 120):
    import time

    deadline = time.monotonic() + timeout
    while not check() and time.monotonic() < deadline:
        time.sleep(0.1)
    return check()


def start_bootstrap(lab) -> subprocess.Popen:
    return subprocess.Popen(["sparkctl", "cluster", "bootstrap", str(lab.inventory_path), "--json"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_a_second_bootstrap_exits_at_once_naming_the_holder_and_read_only_commands_go_on(converged):
    lab = converged
    lab.exec("spark2", ["sh", "-c", f"docker stop -t 0 {CONTAINER}"], check=True)  # work for the first run
    first = start_bootstrap(lab)
    try:
        assert wait_for(lambda: f'"pid":{first.pid}' in holder_on(lab, "spark1")), first.stderr
        # held still while the others run, however slow they are: the nodes keep its lock for the lease (45 s)
        first.send_signal(signal.SIGSTOP)
        second = subprocess.run(["sparkctl", "cluster", "bootstrap", str(lab.inventory_path)], capture_output=True,
                                text=True, timeout=120)
        status = subprocess.run(["sparkctl", "cluster", "status", str(lab.inventory_path)], capture_output=True,
                                text=True, timeout=120)
        assert first.poll() is None, "the first run ended before the second was refused: no proof"
        assert second.returncode == 5, second.stderr
        lines = second.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith(f"sparkctl: error: cluster {lab.names.cluster_name} is "
                                                       "busy: bootstrap by ")
        assert f"(pid {first.pid})" in lines[0] and "(lock on spark1)" in lines[0]
        assert status.returncode == 0, status.stderr
        assert f"(pid {first.pid})" in status.stderr and "is changing the cluster now" in status.stderr
    finally:
        first.send_signal(signal.SIGCONT)
        out, err = first.communicate(timeout=600)
    assert first.returncode == 0, err
    assert holder_on(lab, "spark1") == "" and holder_on(lab, "spark2") == ""  # released


def test_after_the_holder_is_sigkilled_the_next_run_takes_the_stale_lock_and_converges(converged):
    lab = converged
    lab.exec("spark2", ["sh", "-c", f"docker stop -t 0 {CONTAINER}"], check=True)
    first = start_bootstrap(lab)
    assert wait_for(lambda: f'"pid":{first.pid}' in holder_on(lab, "spark2")), first.stderr
    first.kill()
    first.communicate(timeout=60)
    rc, events, err = bootstrap(lab)
    assert rc == 0, (failures(events), err)
    took = [e for e in events if e["event"] == "warning" and "took over a stale cluster lock" in e["message"]]
    assert took and f"(pid {first.pid})" in took[0]["message"]
    assert events[0]["event"] == "run_start"
    rc, events, _ = bootstrap(lab)
    assert rc == 0 and changed(events) == set()
