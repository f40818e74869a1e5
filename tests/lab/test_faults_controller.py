"""The controller stopped in the middle of a bootstrap (issues 17 and 18), at each phase: Ctrl-C (SIGINT) stops
cleanly, a recap of what finished, what was cut and what did not start, the journal saying which task was cut,
exit 130, no traceback, no "Aborted!"; SIGKILL just dies. Either way the management path stays intact (the
node-side netplan revert guard protects it) and the next run converges, the one after changing nothing.

The signal lands when the controller's --json stream shows the point's task starting; at the network point,
when the node has applied netplan and the controller has not yet confirmed it (the guard's window).
"""

from __future__ import annotations

import os
import signal

import pytest
import yaml

from sparkctl.exitcodes import ExitStatus
from sparkctl.runs.journal import latest_runs, read_run
from tests.lab import serve_kit as serve_lab
from tests.lab.conftest import poll
from tests.lab.doctor_kit import bootstrap, changed, failed
from tests.lab.fault_kit import (
    CLUSTER_TASKS,
    PHASE_ORDER,
    POINTS,
    Controller,
    applied_marker,
    bootstrap_all,
    bootstrapped_pair,
    half_written,
    pending_guards,
    reachable,
    reset,
    xdg_state,
)

pytestmark = pytest.mark.lab

WATCHED = "spark1"
#: The shared fault points, and the verify phase (its mpirun probe runs after the containers were made again); the
#: model and serve phases are tried on a pair that serves (SERVING_POINTS, below).
STOP_POINTS = {**POINTS, "verify": "verify.fabric"}


def journals(lab):
    """The run journals of the lab's cluster (runs/journal.runs_dir: one folder per cluster)."""
    return xdg_state(lab) / "sparkctl" / "runs" / lab.names.cluster_name


@pytest.fixture(scope="module")
def lab(lab_factory):
    return bootstrapped_pair(lab_factory)


def stop_at(lab, point: str, signum: int) -> Controller:
    run = Controller(lab)
    task = STOP_POINTS[point]
    run.wait_for_start(task, None if task in CLUSTER_TASKS else WATCHED)
    if point == "network":
        # between `netplan apply` and the confirmation: hold the controller where the guard alone protects the node
        poll(lambda: applied_marker(lab, WATCHED), timeout=30, interval=0.005)
        run.send(signal.SIGSTOP)
        run.send(signum)
        run.send(signal.SIGCONT)
    else:
        run.send(signum)
    return run


@pytest.mark.parametrize("point", list(STOP_POINTS))
def test_ctrl_c_stops_cleanly_and_the_rerun_converges(lab, point):
    reset(lab, point)
    before = set(latest_runs(1000, journals(lab)))
    run = stop_at(lab, point, signal.SIGINT)
    assert_stopped_cleanly(lab, run, STOP_POINTS[point], before)
    assert_management_path_and_convergence(lab)


def assert_stopped_cleanly(lab, run: Controller, task: str, before: set) -> None:
    code = run.finish()
    assert code == ExitStatus.INTERRUPTED, run.describe()
    assert "Traceback" not in run.stderr and "Aborted!" not in run.stderr, run.stderr
    recap = run.recap
    assert recap["exit_status"] == 130, run.describe()
    stopped = recap["interrupted"]
    # nothing at or after the point's phase ran to its end after the Ctrl-C: it was cut, or it did not start
    cut = [(c["task"], c.get("node")) for c in stopped["cut"]]
    for name, node in cut:
        assert run.status_of(name, node) == "interrupted"
    # nothing started after the Ctrl-C, and the rest of the playbook is listed as not started
    kinds = [e.get("event") for e in run.stream]
    assert "task_start" not in kinds[kinds.index("interrupt"):], run.describe()
    if task == PHASE_ORDER[-1]:
        assert (PHASE_ORDER[-1], None) in cut, run.describe()  # the last task itself was cut
    else:
        assert PHASE_ORDER[-1] in stopped["not_started"]
    assert set(stopped["not_started"]) >= set(PHASE_ORDER[PHASE_ORDER.index(task) + 1:]) - {
        r["task"] for r in run.results()}
    # the journal says the same, cut tasks included
    journal = [p for p in latest_runs(1000, journals(lab)) if p not in before]
    assert len(journal) == 1
    events = read_run(journal[0])
    assert events[-1]["interrupted"] == stopped
    assert {(e["task"], e.get("node")) for e in events if e.get("status") == "interrupted"} == set(cut)


# --- the model and serve phases, on a pair that serves ----------------------------------------------------------
#: Where Ctrl-C lands there, and what is undone first so the run has work at it: the draft checkpoint gone from
#: the head (model.fetch downloads it), the server stopped with its unit (serve.launch starts it).
SERVING_POINTS = {"model": "model.fetch", "serve": "serve.launch"}


@pytest.fixture(scope="module")
def serving(lab_factory, tmp_path_factory):
    lab = lab_factory(2, "pair", port=1)
    document = yaml.safe_load(lab.inventory_path.read_text())
    document["serve"] = serve_lab.SERVE
    path = tmp_path_factory.mktemp("inv") / "serve.yaml"
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    lab.serve_inventory = str(path)
    lab.serve_env = {**os.environ, "HF_TOKEN": serve_lab.TOKEN, "XDG_STATE_HOME": str(xdg_state(lab))}
    code, events = bootstrap(lab, env=lab.serve_env, inventory=lab.serve_inventory)
    assert code == 0, failed(events)
    return lab


@pytest.mark.parametrize("point", list(SERVING_POINTS))
def test_ctrl_c_in_the_serving_phases_stops_cleanly_and_the_rerun_converges(serving, point):
    if point == "model":
        serving.exec(WATCHED, f"rm -rf {serve_lab.DRAFT}", check=True)
    else:
        serve_lab.stop_server(serving, WATCHED)
    before = set(latest_runs(1000, journals(serving)))
    task = SERVING_POINTS[point]
    run = Controller(serving, inventory=serving.serve_inventory, env=serving.serve_env)
    run.wait_for_start(task, None if task in CLUSTER_TASKS else WATCHED)
    run.send(signal.SIGINT)
    assert_stopped_cleanly(serving, run, task, before)
    for node in ("spark1", "spark2"):
        assert reachable(serving, node), f"the management path of {node} was lost"
    code, events = bootstrap(serving, env=serving.serve_env, inventory=serving.serve_inventory)
    assert code == 0, failed(events)
    code, events = bootstrap(serving, env=serving.serve_env, inventory=serving.serve_inventory)
    assert code == 0 and changed(events) == set(), (changed(events), failed(events))
    for node in ("spark1", "spark2"):
        assert not half_written(serving, node), node


#: SIGKILL where dying mid-change can leave something half done for the rerun: netplan applied and not yet confirmed
#: (the node's revert guard armed), keys being made, a container being started, an mpirun in the containers (verify;
#: mpi.hostfile's probe is the same kind). Killed at preflight, which only reads, it leaves what it leaves anywhere:
#: a stale lock and an unfinished journal. Ctrl-C is tried at every point: it has a stop to get right at each.
KILL_POINTS = ("network", "ssh", "container", "verify")


@pytest.mark.parametrize("point", KILL_POINTS)
def test_sigkill_of_the_controller_and_the_rerun_converges(lab, point):
    reset(lab, point)
    run = stop_at(lab, point, signal.SIGKILL)
    assert run.finish() == -signal.SIGKILL
    assert_management_path_and_convergence(lab)


def assert_management_path_and_convergence(lab) -> None:
    for node in ("spark1", "spark2"):
        assert reachable(lab, node), f"the management path of {node} was lost"
    rerun = bootstrap_all(lab)
    assert rerun.exit_code == 0, rerun.describe()
    again = bootstrap_all(lab)
    assert again.exit_code == 0 and again.changed_total == 0, again.describe()
    for node in ("spark1", "spark2"):
        assert reachable(lab, node)
        assert pending_guards(lab, node) == [], node  # an interrupted run's guard was confirmed, not left to fire
        assert not half_written(lab, node), node
