"""Serve on a lab pair and measure it: bootstrap to a first answer, a no-op rerun, then `serve bench`.

Run as root: `python benchmarks/serve_bench.py [--inventory FILE] [--concurrency 1,4,8] [--requests 16]`.
Without --inventory a lab pair is brought up (and torn down). The lab's trtllm-serve is a stand-in whose
every token is an MPI allreduce between the nodes: the numbers measure sparkctl and the MPI path, not a GPU.
Results are printed as a table, never asserted.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import tempfile
import time
from pathlib import Path

import yaml

from sparkctl.inventory import load_inventory
from sparkctl.knowledge.bench import parse_concurrency, run_bench
from sparkctl.knowledge.serve_client import ServeClient, endpoint_url
from sparkctl.tasks.serve.api_key import api_key

ENV = {"HF_TOKEN": "hf_BenchFakeToken0123456789abcdef", "SPARKCTL_FIT_CHECK": "warn"}


def bootstrap(inventory: str) -> float:
    started = time.monotonic()
    subprocess.run(["sparkctl", "cluster", "bootstrap", inventory, "--json"], check=True, capture_output=True,
                   env={**os.environ, **ENV}, timeout=1800)
    return time.monotonic() - started


def measure(inventory: str, levels: list[int], requests: int, max_tokens: int) -> None:
    first = bootstrap(inventory)
    noop = bootstrap(inventory)
    inv = load_inventory(inventory)
    client = ServeClient(endpoint_url(str(inv.head.host), inv.serve_spec().port), timeout=600, api_key=api_key(inv))
    print(f"bootstrap to a serving endpoint: {first:.1f}s; no-op rerun: {noop:.1f}s")
    print(f"{'conc.':>5} {'reqs':>5} {'fail':>4} {'decode tok/s/req':>17} {'aggr. tok/s':>12} "
          f"{'TTFT p50 ms':>12} {'TTFT p95 ms':>12} {'accept.':>8}")
    for s in run_bench(client, levels, requests, max_tokens):
        cells = [s.decode_tps_per_request, s.aggregate_tps, s.ttft_p50 and s.ttft_p50 * 1000,
                 s.ttft_p95 and s.ttft_p95 * 1000, s.acceptance_length]
        shown = ["-" if c is None else f"{c:.1f}" for c in cells]
        print(f"{s.concurrency:>5} {s.requests:>5} {s.failed:>4} {shown[0]:>17} {shown[1]:>12} {shown[2]:>12} "
              f"{shown[3]:>12} {shown[4]:>8}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--inventory", help="an inventory with a serve section (default: a new lab pair)")
    parser.add_argument("--concurrency", default="1,4,8")
    parser.add_argument("--requests", type=int, default=16)
    parser.add_argument("--max-tokens", type=int, default=64)
    args = parser.parse_args()
    levels = parse_concurrency(args.concurrency)
    if args.inventory:
        measure(args.inventory, levels, args.requests, args.max_tokens)
        return
    from sparkctl.lab.lab import Lab

    with tempfile.TemporaryDirectory(prefix="serve-bench-") as directory:
        lab = Lab.up(Path(directory) / "lab", nodes=2, topology="pair")
        try:
            document = yaml.safe_load(lab.inventory_path.read_text())
            document["serve"] = {"preset": "qwen3-235b-eagle3", "config": {"enable_iter_perf_stats": True},
                                 "fit_check": "warn"}
            path = Path(directory) / "serve.yaml"
            path.write_text(yaml.safe_dump(document, sort_keys=False))
            measure(str(path), levels, args.requests, args.max_tokens)
        finally:
            lab.down()


if __name__ == "__main__":
    main()
