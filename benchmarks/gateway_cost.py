"""What the gateway costs: `serve bench`'s own measurement (sparkctl/knowledge/bench.py) of the engine directly
and of the endpoint through the gateway (NGINX, the API key checked), side by side in one run.

Run as root: `python benchmarks/gateway_cost.py [--concurrency 1,4] [--requests 16] [--repeat 3]`. A lab pair is
brought up serving (and torn down). Both clients run on the head itself, so the only difference between the two
columns is the gateway: the engine at 127.0.0.1:<engine port>, the gateway at 127.0.0.1:<serve port>; the levels
alternate between the two, `--repeat` times, and the medians are printed. The lab's engine is a stand-in (each
token an MPI allreduce between the nodes): the absolute figures are the lab's, the difference is the gateway's.
Printed, never asserted.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

from sparkctl.inventory import load_inventory

REPO = Path(__file__).resolve().parents[1]
ENV = {"HF_TOKEN": "hf_BenchFakeToken0123456789abcdef"}

# Runs on the head with the machine's python3 and this checkout on its path (stdlib only): the key on stdin.
ON_HEAD = r"""
import json, sys
from sparkctl.knowledge.bench import run_bench
from sparkctl.knowledge.serve_client import ServeClient
job = json.loads(sys.stdin.read())
out = []
for _ in range(job["repeat"]):
    for level in job["levels"]:
        for label, url, key in (("direct", job["direct"], None), ("gateway", job["gateway"], job["key"])):
            (s,) = run_bench(ServeClient(url, timeout=600, api_key=key), [level], job["requests"], job["max_tokens"])
            out.append({"label": label, "concurrency": level, "failed": s.failed, "ttft_p50": s.ttft_p50,
                        "decode": s.decode_tps_per_request, "aggregate": s.aggregate_tps})
print(json.dumps(out))
"""


def sparkctl(*args: str, env: dict[str, str]) -> str:
    return subprocess.run(["sparkctl", *args], check=True, capture_output=True, text=True, env=env,
                          timeout=1800).stdout


def median(rows: list[dict], key: str) -> float | None:
    values = [r[key] for r in rows if r[key] is not None]
    return statistics.median(values) if values else None


def measure(lab, inventory: str, levels: list[int], requests: int, max_tokens: int, repeat: int,
            env: dict[str, str]) -> None:
    sparkctl("cluster", "bootstrap", inventory, "--json", env=env)
    key = sparkctl("serve", "key", inventory, env=env).strip()
    spec = load_inventory(inventory).serve_spec()
    job = {"levels": levels, "requests": requests, "max_tokens": max_tokens, "repeat": repeat, "key": key,
           "direct": f"http://127.0.0.1:{spec.engine_port}", "gateway": f"http://127.0.0.1:{spec.port}"}
    result = lab.exec("spark1", ["env", f"PYTHONPATH={REPO}", "python3", "-c", ON_HEAD], input=json.dumps(job),
                      timeout=3600, check=True)
    rows = json.loads(result.stdout.strip().splitlines()[-1])
    print(f"gateway cost, {requests} requests of {max_tokens} tokens per level, medians of {repeat} alternating runs")
    print(f"{'conc.':>5} {'TTFT p50 ms direct':>19} {'gateway':>8} {'diff':>7} "
          f"{'decode tok/s direct':>20} {'gateway':>8} {'diff':>7} {'failed':>7}")
    for level in levels:
        d = [r for r in rows if r["concurrency"] == level and r["label"] == "direct"]
        g = [r for r in rows if r["concurrency"] == level and r["label"] == "gateway"]
        ttft_d, ttft_g = median(d, "ttft_p50"), median(g, "ttft_p50")
        dec_d, dec_g = median(d, "decode"), median(g, "decode")
        failed = sum(r["failed"] for r in d + g)

        def cell(v, scale=1.0):
            return "-" if v is None else f"{v * scale:.1f}"

        diff_t = cell(ttft_g - ttft_d, 1000) if ttft_d is not None and ttft_g is not None else "-"
        diff_d = f"{(dec_g / dec_d - 1) * 100:+.1f}%" if dec_d and dec_g else "-"
        print(f"{level:>5} {cell(ttft_d, 1000):>19} {cell(ttft_g, 1000):>8} {diff_t:>7} "
              f"{cell(dec_d):>20} {cell(dec_g):>8} {diff_d:>7} {failed:>7}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--concurrency", default="1,4")
    parser.add_argument("--requests", type=int, default=16)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    levels = [int(c) for c in args.concurrency.split(",")]
    if os.geteuid() != 0:
        sys.exit("run as root: the lab needs it")
    from sparkctl.lab.lab import Lab

    with tempfile.TemporaryDirectory(prefix="gateway-cost-") as directory:
        env = {**os.environ, **ENV, "XDG_STATE_HOME": str(Path(directory) / "state")}
        lab = Lab.up(Path(directory) / "lab", nodes=2, topology="pair")
        try:
            document = yaml.safe_load(lab.inventory_path.read_text())
            document["serve"] = {"preset": "qwen3-235b-eagle3", "fit_check": "warn"}
            path = Path(directory) / "serve.yaml"
            path.write_text(yaml.safe_dump(document, sort_keys=False))
            measure(lab, str(path), levels, args.requests, args.max_tokens, args.repeat, env)
        finally:
            lab.down()


if __name__ == "__main__":
    main()
