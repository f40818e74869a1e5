"""`sparkctl doctor` on healthy bootstrapped labs of 2 and 8 nodes: wall time and SSH round trips per node.

Run as root: `python benchmarks/doctor_bench.py [--sizes 2,8] [--runs 3]`. Printed, never asserted (the target
for 2 nodes is under 3 s). Each lab is bootstrapped first (not timed) and torn down at the end.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time

from sparkctl.doctor.diagnose import run_checks
from sparkctl.inventory import load_inventory
from sparkctl.lab.lab import Lab
from sparkctl.runs.doctor import DoctorRequest, take_snapshot
from sparkctl.runs.playbooks import bootstrap_graph
from sparkctl.runs.session import RunRequest, run_playbook
from sparkctl.transport import connect


def count_round_trips() -> list[int]:
    """Wrap connect_all so every transport's round trips are summed after doctor closes them."""
    totals: list[int] = []
    original = connect.connect_all

    def counting(*args, **kwargs):
        transports, unreachable = original(*args, **kwargs)
        for t in transports.values():
            close = t.close

            def closing(t=t, close=close):
                totals.append(t.round_trips)
                close()

            t.close = closing
        return transports, unreachable

    import sparkctl.runs.session as session_module

    session_module.connect_all = counting
    return totals


def bench(size: int, runs: int) -> tuple:
    topology = "pair" if size == 2 else "switch"
    with tempfile.TemporaryDirectory(prefix="doctor-bench-") as directory:
        lab = Lab.up(directory, nodes=size, topology=topology)
        try:
            inventory = load_inventory(lab.inventory_path)
            result = run_playbook(inventory, bootstrap_graph(), RunRequest(), lambda _e: None)
            times, errors, trips = [], 0, []
            for _ in range(runs):
                totals = count_round_trips()
                started = time.monotonic()
                diagnosis = run_checks(take_snapshot(inventory, DoctorRequest()))
                times.append(time.monotonic() - started)
                errors = len(diagnosis.errors)
                trips.append(sum(totals) / max(1, len(totals)))
        finally:
            lab.down()
    return (size, topology, int(result.exit_status()), min(times), statistics.median(times), max(times),
            statistics.median(trips), errors)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--sizes", default="2,8")
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    rows = [bench(int(s), args.runs) for s in args.sizes.split(",")]
    print(f"{'nodes':>5}  {'topology':<8}  {'bootstrap':>9}  {'min s':>6}  {'median s':>8}  {'max s':>6}  "
          f"{'round trips/node':>16}  errors")
    for size, topology, status, low, mid, high, trips, errors in rows:
        print(f"{size:>5}  {topology:<8}  {'ok' if status == 0 else f'exit {status}':>9}  {low:>6.2f}  {mid:>8.2f}  "
              f"{high:>6.2f}  {trips:>16.1f}  {errors}")


if __name__ == "__main__":
    main()
