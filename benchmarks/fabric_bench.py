"""`sparkctl fabric bench` on bootstrapped labs: wall time of the links and of the NCCL all-reduce, and the figures
the lab's stand-ins measured over the veths (with the machine's load average, which they depend on).

Run as root: `python benchmarks/fabric_bench.py [--sizes 2,4] [--nccl-max 8M]`. Printed, never asserted. Each lab
is bootstrapped first (not timed) and torn down at the end; the bench records go to a temporary state dir.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time

from sparkctl.inventory import load_inventory
from sparkctl.lab.lab import Lab
from sparkctl.runs.fabric_bench import BenchRequest, fabric_bench
from sparkctl.runs.playbooks import bootstrap_graph
from sparkctl.runs.session import RunRequest, run_playbook


def one(size: int, nccl_max: str) -> list[str]:
    topology = "pair" if size == 2 else "switch"
    with tempfile.TemporaryDirectory(prefix="fabric-bench-") as directory:
        os.environ["XDG_STATE_HOME"] = os.path.join(directory, "state")
        lab = Lab.up(os.path.join(directory, "lab"), nodes=size, topology=topology)
        try:
            inventory = load_inventory(lab.inventory_path)
            run_playbook(inventory, bootstrap_graph(), RunRequest(), lambda _e: None)
            load = os.getloadavg()[0]
            started = time.monotonic()
            links = fabric_bench(inventory, BenchRequest(nccl=False, record=False))
            links_s = time.monotonic() - started
            started = time.monotonic()
            nccl = fabric_bench(inventory, BenchRequest(links=False, nccl_max=nccl_max, record=False))["nccl"]
            nccl_s = time.monotonic() - started
        finally:
            lab.down()
    gbps = [link["gbps"] for link in links["links"] if link["gbps"] is not None]
    lat = [link["latency_us"] for link in links["links"] if link["latency_us"] is not None]
    return [f"{size} ({topology})", str(len(links["links"])), f"{links_s:.1f}",
            f"{min(gbps):.2f} / {statistics.median(gbps):.2f} / {max(gbps):.2f}" if gbps else "-",
            f"{statistics.median(lat):.1f}" if lat else "-",
            f"{nccl['busbw']:.2f}" if nccl and nccl.get("busbw") is not None else "-", f"{nccl_s:.1f}",
            f"{load:.1f}"]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", default="2,4")
    parser.add_argument("--nccl-max", default="8M")
    args = parser.parse_args()
    head = ["nodes", "links", "links s", "Gb/s min/median/max", "latency us (median)", "NCCL busbw GB/s", "NCCL s",
            "load avg"]
    rows = [one(int(size), args.nccl_max) for size in args.sizes.split(",")]
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(len(head))]
    for row in [head, ["-" * w for w in widths], *rows]:
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)))


if __name__ == "__main__":
    main()
