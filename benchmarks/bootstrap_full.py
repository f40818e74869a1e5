"""The whole `cluster bootstrap` (every phase through verify.fabric) on 2 and 4 lab nodes: fresh, then no-op.

Run as root: `python benchmarks/bootstrap_full.py [--sizes 2,4] [--repeat 3] [--dir D]`. Each size gets a fresh
lab (a pair for 2, a switch above; the lab image must be present or is built first, outside the timing), one
fresh bootstrap (containers created), then --repeat no-op reruns. With --dir, the lab already up in D is reused
(its size and topology are the lab's) and the "fresh" column is whatever that first run had to do.
Printed, never asserted. Target (issue 5): a no-op rerun of all phases on 2 nodes under 1.5 s.
Wall time includes connecting; round trips are commands and file transfers over SSH (RunResult.round_trips),
per node; the slowest tasks of the last no-op run are listed with their durations.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from sparkctl.inventory import load_inventory
from sparkctl.lab.lab import Lab
from sparkctl.runs.playbooks import bootstrap_graph
from sparkctl.runs.session import RunRequest, run_playbook


def run_once(inventory) -> tuple[float, object]:
    started = time.monotonic()
    result = run_playbook(inventory, bootstrap_graph(), RunRequest(), lambda _event: None)
    return time.monotonic() - started, result


def _checked(size: int, what: str, result) -> None:
    if int(result.exit_status()) != 0:
        raise SystemExit(f"{size} nodes, {what}: bootstrap failed: "
                         f"{[(o.task, o.node, o.message) for o in result.failed]}")


def measure_lab(lab: Lab, repeat: int) -> dict:
    inventory = load_inventory(lab.inventory_path)
    size = len(inventory.nodes)
    first_wall, first = run_once(inventory)
    _checked(size, "first run", first)
    runs = [run_once(inventory) for _ in range(repeat)]
    for _, result in runs:
        _checked(size, "no-op run", result)
    walls = [wall for wall, _ in runs]
    last = runs[-1][1]
    slowest = sorted((o for o in last.outcomes if o.duration), key=lambda o: -o.duration)[:4]
    return {"nodes": size, "topology": inventory.topology, "first": first_wall,
            "first_changed": len(first.changed), "first_trips": statistics.mean(first.round_trips.values()),
            "noop": statistics.median(walls), "noop_min": min(walls),
            "changed": sum(len(r.changed) for _, r in runs),
            "trips": statistics.mean(last.round_trips.values()), "trips_max": max(last.round_trips.values()),
            "slowest": ", ".join(f"{o.task}{'@' + o.node if o.node else ''} {o.duration:.2f}" for o in slowest)}


def measure(size: int, repeat: int) -> dict:
    from sparkctl.lab.image import ensure_image

    ensure_image()
    topology = "pair" if size == 2 else "switch"
    with tempfile.TemporaryDirectory(prefix="bench-full-") as directory:
        lab = Lab.up(directory, nodes=size, topology=topology)
        try:
            return measure_lab(lab, repeat)
        finally:
            lab.down()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--sizes", default="2,4")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--dir", type=Path, help="reuse the lab already up in this directory")
    args = parser.parse_args()
    if args.dir:
        rows = [measure_lab(Lab.load(args.dir), args.repeat)]
    else:
        rows = [measure(int(s), args.repeat) for s in args.sizes.split(",")]
    print(f"{'nodes':>5}  {'topology':<8}  {'fresh s':>7}  {'changed':>7}  {'RT/node':>7}  "
          f"{'no-op s':>7}  {'(min)':>6}  {'changed':>7}  {'RT/node':>7}  {'RT max':>6}  slowest no-op tasks (s)")
    for r in rows:
        print(f"{r['nodes']:>5}  {r['topology']:<8}  {r['first']:>7.2f}  {r['first_changed']:>7}  "
              f"{r['first_trips']:>7.1f}  {r['noop']:>7.2f}  {r['noop_min']:>6.2f}  {r['changed']:>7}  "
              f"{r['trips']:>7.1f}  {r['trips_max']:>6}  {r['slowest']}")
    two = next((r for r in rows if r["nodes"] == 2), None)
    if two:
        print(f"target: no-op rerun of all phases on 2 nodes < 1.5 s (median {two['noop']:.2f} s)")


if __name__ == "__main__":
    main()
