"""A node's management link cut in the middle of `cluster bootstrap` (issue 17): how long until the node is known
lost, and until the run ends, counted from the cut. Target: the run ends within 30 s of the cut.

Run as root: `python benchmarks/lost_node.py [--points preflight,network,ssh,container,mpi] [--dir D]`. A fresh
pair (or the lab already up in D) is bootstrapped once; then for each point: undo what that point needs to have
work (`cluster down` [--network]), start a bootstrap as its own process, cut spark2's management link when its
--json stream shows the point's task starting on spark2, restore the link after the run, and bootstrap again (it
must converge). Printed, never asserted; the load average is printed with it (the machine is shared).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from sparkctl.lab.lab import Lab  # noqa: E402
from tests.lab.conftest import poll  # noqa: E402
from tests.lab.fault_kit import (  # noqa: E402
    POINTS,
    Controller,
    applied_marker,
    bootstrap_all,
    cut_link,
    reset,
    restore_link,
)

CUT = "spark2"


def measure_point(lab: Lab, point: str) -> dict:
    reset(lab, point)
    run = Controller(lab)
    task = POINTS[point]
    run.wait_for_start(task, None if task == "mpi.hostfile" else CUT)
    if point == "network":
        poll(lambda: applied_marker(lab, CUT), timeout=30, interval=0.02)
    cut = time.monotonic()
    cut_link(lab, CUT)
    try:
        code = run.finish()
    finally:
        restore_link(lab, CUT)
    lost_at = run.when(lambda e: e.get("event") == "node_lost")
    recap = run.recap
    rerun = bootstrap_all(lab)
    return {"point": point, "exit": code, "lost": (lost_at - cut) if lost_at else None, "end": run.ended - cut,
            "during": (recap.get("lost") or {}).get(CUT, {}).get("during"),
            "healthy_failed": recap.get("nodes", {}).get("spark1", {}).get("failed"),
            "rerun": rerun.exit_code, "load": os.getloadavg()[0]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--points", default=",".join(POINTS))
    parser.add_argument("--dir", help="reuse the lab already up in this directory")
    args = parser.parse_args()
    points = [p for p in args.points.split(",") if p]
    if args.dir:
        lab, owned = Lab.load(args.dir), False
    else:
        lab, owned = Lab.up(Path(tempfile.mkdtemp(prefix="sparkctl-bench-lost-")), nodes=2), True
    try:
        first = bootstrap_all(lab)
        if first.exit_code != 0:
            raise SystemExit(f"the first bootstrap failed: {first.describe()}")
        rows = [measure_point(lab, point) for point in points]
    finally:
        if owned:
            lab.down()
    print(f"{'cut at':<10} {'exit':>4} {'lost after':>10} {'run ended':>10} {'lost during':<16} "
          f"{'spark1 failed':>13} {'rerun':>5} {'load':>5}")
    for r in rows:
        lost = f"{r['lost']:.1f} s" if r["lost"] is not None else "-"
        print(f"{r['point']:<10} {r['exit']:>4} {lost:>10} {r['end']:>8.1f} s {r['during'] or '-':<16} "
              f"{r['healthy_failed']!s:>13} {r['rerun']:>5} {r['load']:>5.1f}")


if __name__ == "__main__":
    main()
