"""A node's management link cut in the middle of a bootstrap (issue 17), at each phase: only that node is
unreachable, the other finishes every node task, the run ends with exit 3 saying which node is lost and what was
left undone, and once the link is back the next run converges and the one after changes nothing.

The cut lands when the controller's --json stream shows the point's task starting on the cut node: no sleeps.
"""

from __future__ import annotations

import time

import pytest

from sparkctl.exitcodes import ExitStatus
from tests.lab.conftest import poll
from tests.lab.fault_kit import (
    NODE_TASKS,
    PHASE_ORDER,
    POINTS,
    Controller,
    applied_marker,
    bootstrap_all,
    bootstrapped_pair,
    cut_link,
    half_written,
    pending_guards,
    reset,
    restore_link,
)

pytestmark = pytest.mark.lab

CUT, HEALTHY = "spark2", "spark1"


@pytest.fixture(scope="module")
def lab(lab_factory):
    return bootstrapped_pair(lab_factory)


#: Where the link is cut: the network (a netplan change left to its guard), a node's container and a cluster task's
#: mpirun. Preflight changes nothing (a node lost there leaves nothing half done) and ssh.keys is a node task as
#: container.run is; a stop at both is tried by tests/lab/test_faults_controller.py (Ctrl-C, and SIGKILL at ssh).
CUT_POINTS = [p for p in POINTS if p not in ("preflight", "ssh")]


@pytest.mark.parametrize("point", CUT_POINTS)
def test_a_node_cut_off_mid_run_is_the_only_one_lost_and_the_rerun_converges(lab, point):
    reset(lab, point)
    run = Controller(lab)
    task = POINTS[point]
    run.wait_for_start(task, None if task == "mpi.hostfile" else CUT)
    if point == "network":  # the cut that matters most: after the apply, before the confirmation
        poll(lambda: applied_marker(lab, CUT), timeout=30, interval=0.02)
    cut = time.monotonic()
    cut_link(lab, CUT)
    try:
        code = run.finish()
    finally:
        restore_link(lab, CUT)
    lost_at = run.when(lambda e: e.get("event") == "node_lost")
    print(f"\n{point}: cut -> {CUT} noticed lost {lost_at - cut if lost_at else float('nan'):.1f} s, "
          f"-> run ended {run.ended - cut:.1f} s")

    assert code == ExitStatus.UNREACHABLE, run.describe()
    assert "Traceback" not in run.stderr
    # event order: the node is lost once, before the recap, and nothing starts on it after that
    kinds = [(e.get("event"), e.get("node")) for e in run.stream]
    recap_at = next(i for i, (kind, _) in enumerate(kinds) if kind == "recap")
    assert kinds.count(("node_lost", CUT)) == 1 and kinds.index(("node_lost", CUT)) < recap_at, run.describe()
    assert ("task_start", CUT) not in kinds[kinds.index(("node_lost", CUT)):], run.describe()
    recap = run.recap
    assert list(recap["lost"]) == [CUT], run.describe()
    assert recap["nodes"][CUT]["unreachable"] == 1
    assert recap["nodes"][HEALTHY]["unreachable"] == 0 and recap["nodes"][HEALTHY]["failed"] == 0
    during = recap["lost"][CUT]["during"]
    assert PHASE_ORDER.index(during) >= PHASE_ORDER.index(task), during
    # noticed by silence detection (keepalive + TCP user timeout, or the failed confirmation), not a command timeout
    reason = recap["lost"][CUT]["reason"]
    assert "stopped answering" in reason or "could not be reached over a new management connection" in reason, reason
    # attribution: every unreachable outcome is the cut node's, nothing failed, nothing on the healthy node
    assert not run.results("failed"), run.describe()
    for result in run.results("unreachable"):
        assert result.get("node") == CUT or result.get("lost_node") == CUT, result
    # the healthy node finished every node task (none of them needs the other node)
    for name in NODE_TASKS:
        assert run.status_of(name, HEALTHY) in ("ok", "changed"), (name, run.describe())
    # what needs every node was skipped, saying why
    for name in recap.get("left_undone", []):
        assert run.status_of(name, None) in ("skipped", "unreachable", None)
    skipped = [r for r in run.results("skipped") if r.get("node") is None]
    assert skipped and all(r["message"] == f"needs every node, {CUT} unreachable" for r in skipped), skipped
    assert set(recap["lost"][CUT]["undone"]) <= set(NODE_TASKS)

    assert not half_written(lab, CUT)
    rerun = bootstrap_all(lab)
    assert rerun.exit_code == 0, rerun.describe()
    # the cut run's lock still waited on the cut node (no FIN reached it); its process is gone from this
    # controller, so the rerun took it over at once instead of being refused as busy
    taken = [e for e in rerun.events if e.get("event") == "warning" and "took over a stale cluster lock" in
             e.get("message", "")]
    assert taken, rerun.describe()
    again = bootstrap_all(lab)
    assert again.exit_code == 0 and again.changed_total == 0, again.describe()
    for node in (HEALTHY, CUT):
        assert pending_guards(lab, node) == [], node  # a guard the cut left armed was confirmed by the rerun
        assert not half_written(lab, node)
