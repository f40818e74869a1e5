"""Bring labs of 2, 8 and 16 simulated Sparks up and down; print times and memory per node.

Run as root: `python benchmarks/lab_updown.py [--sizes 2,8,16]`. Memory is the resident memory of every
process in a node's cgroup (systemd, journald, networkd, dbus, sshd, logind), averaged over nodes.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from sparkctl.lab.lab import Lab


def node_rss_mib(lab: Lab) -> float:
    total = 0
    for n in lab.nodes:
        procs = Path(f"/sys/fs/cgroup/systemd/{lab.node_cgroup(n.name)}")
        pids = {int(p) for f in procs.rglob("cgroup.procs") for p in f.read_text().split()}
        for pid in pids:
            try:
                status = Path(f"/proc/{pid}/status").read_text()
            except OSError:
                continue
            total += next((int(line.split()[1]) for line in status.splitlines() if line.startswith("VmRSS:")), 0)
    return total / 1024 / len(lab.nodes)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--sizes", default="2,8,16")
    parser.add_argument("--topology", default="switch")
    args = parser.parse_args()
    rows = []
    for size in [int(s) for s in args.sizes.split(",")]:
        topology = "pair" if size == 2 else args.topology
        with tempfile.TemporaryDirectory(prefix="lab-bench-") as directory:
            started = time.monotonic()
            lab = Lab.up(directory, nodes=size, topology=topology)
            up = time.monotonic() - started
            rss = node_rss_mib(lab)
            started = time.monotonic()
            leftovers = lab.down()
            down = time.monotonic() - started
        rows.append((size, topology, up, down, rss, "clean" if not leftovers else f"{len(leftovers)} left"))
    print(f"{'nodes':>5}  {'topology':<8}  {'up s':>6}  {'down s':>6}  {'RSS/node MiB':>12}  teardown")
    for size, topology, up, down, rss, state in rows:
        print(f"{size:>5}  {topology:<8}  {up:>6.1f}  {down:>6.1f}  {rss:>12.1f}  {state}")


if __name__ == "__main__":
    main()
