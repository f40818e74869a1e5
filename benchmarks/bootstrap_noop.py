"""A no-op rerun of `cluster bootstrap --only preflight,network,ssh` on 2, 4, 8 and 16 lab nodes.

Run as root: `python benchmarks/bootstrap_noop.py [--sizes 2,4,8,16] [--repeat 3] [--renderer networkmanager,networkd]`.
Each size (and renderer: what renders netplan on the nodes, the lab's default unless given) gets a fresh lab (a pair
for 2, a switch above), one converging bootstrap, then --repeat no-op reruns. Printed, never asserted.
Targets (issue 4): 2 nodes under 1.0 s; 16 nodes under 2x the 2-node time; at most one facts round trip per
node per phase. Wall time includes connecting; round trips are commands and file transfers over SSH.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import threading
import time
from collections import Counter
from unittest import mock

from sparkctl.inventory import load_inventory
from sparkctl.lab.lab import Lab
from sparkctl.lab.renderer import DEFAULT_RENDERER
from sparkctl.runs.playbooks import bootstrap_graph
from sparkctl.runs.session import RunRequest, run_playbook
from sparkctl.tasks import context

PHASES = {"preflight", "network", "ssh"}


class FactsCounter:
    """Counts gather_facts calls per (phase, node): the phase is that of the task running at the time."""

    def __init__(self) -> None:
        self.phase = ""
        self.calls: Counter[tuple[str, str]] = Counter()
        self._lock = threading.Lock()
        self._real = context.gather_facts

    def emit(self, event) -> None:
        if event.event == "task_start" and event.phase:
            self.phase = event.phase

    def gather(self, transport, node, *args, **kwargs):
        with self._lock:
            self.calls[(self.phase, node)] += 1
        return self._real(transport, node, *args, **kwargs)

    def per_node(self) -> Counter[str]:
        total: Counter[str] = Counter()
        for (_phase, node), n in self.calls.items():
            total[node] += n
        return total


def run_once(inventory) -> tuple[float, object, FactsCounter]:
    counter = FactsCounter()
    with mock.patch.object(context, "gather_facts", counter.gather):
        started = time.monotonic()
        result = run_playbook(inventory, bootstrap_graph(), RunRequest(only=set(PHASES)), counter.emit)
        wall = time.monotonic() - started
    return wall, result, counter


def measure(size: int, repeat: int, renderer: str = DEFAULT_RENDERER) -> dict:
    topology = "pair" if size == 2 else "switch"
    with tempfile.TemporaryDirectory(prefix="bench-noop-") as directory:
        started = time.monotonic()
        lab = Lab.up(directory, nodes=size, topology=topology, renderer=renderer)
        up = time.monotonic() - started
        try:
            inventory = load_inventory(lab.inventory_path)
            first_wall, first, _ = run_once(inventory)
            if int(first.exit_status()) != 0:
                print(f"{size} nodes: the first bootstrap failed (exit {int(first.exit_status())}): "
                      f"{[(o.task, o.node, o.message, o.details) for o in first.failed]}", flush=True)
            runs = [run_once(inventory) for _ in range(repeat)]
        finally:
            lab.down()
    walls = [wall for wall, _, _ in runs]
    _, last, counter = runs[-1]
    trips = list(last.round_trips.values())
    facts = list(counter.per_node().values())
    return {"nodes": size, "topology": topology, "renderer": renderer, "up": up, "first": first_wall,
            "noop": statistics.median(walls), "noop_min": min(walls),
            "changed": sum(len(r.changed) for _, r, _ in runs),
            "trips_mean": statistics.mean(trips), "trips_max": max(trips),
            "facts_max": max(facts), "facts_per_phase_max": max(counter.calls.values()),
            "exit": int(last.exit_status())}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--sizes", default="2,4,8,16")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--renderer", default=DEFAULT_RENDERER, help="comma list: networkmanager, networkd")
    args = parser.parse_args()
    rows = [measure(int(s), args.repeat, r) for r in args.renderer.split(",") for s in args.sizes.split(",")]
    header = (f"{'nodes':>5}  {'topology':<8}  {'renderer':<14}  {'lab up s':>8}  {'1st run s':>9}  {'no-op s':>7}  "
              f"{'(min)':>6}  {'changed':>7}  {'RT/node':>7}  {'RT max':>6}  {'facts/node':>10}  "
              f"{'facts/phase':>11}  exit")
    print(header)
    for r in rows:
        print(f"{r['nodes']:>5}  {r['topology']:<8}  {r['renderer']:<14}  {r['up']:>8.1f}  {r['first']:>9.2f}  "
              f"{r['noop']:>7.2f}  {r['noop_min']:>6.2f}  {r['changed']:>7}  {r['trips_mean']:>7.1f}  "
              f"{r['trips_max']:>6}  {r['facts_max']:>10}  {r['facts_per_phase_max']:>11}  {r['exit']}")
    base = rows[0]["noop"] if rows and rows[0]["nodes"] == 2 else None
    if base:
        print(f"targets: 2 nodes < 1.0 s (median {base:.2f} s); 16 nodes < 2x that; <= 1 facts round trip per "
              "node per phase")


if __name__ == "__main__":
    main()
