"""What `sparkctl top` costs: the CPU it adds on each node and on the controller, per refresh interval, as a share
of one core.

Run as root: `python benchmarks/top.py [--intervals 2,1] [--refreshes 30] [--engine vllm|trtllm]`. A lab pair is
brought up serving (and torn down). For each interval, `sparkctl top --json` runs for --refreshes refreshes; between
its first and last line the CPU of each node's cgroup (its sshd and what top runs there: the shell, nvidia-smi, the
gateway's curl, docker every 15th refresh) is read, and the same window without top is read before it, as the
node's own baseline (systemd, the idle server) to subtract. The controller's figure is the sparkctl process's own
CPU over the same window (/proc/<pid>/stat). The lab's nodes share this machine: a node's figure is its cgroup's,
not the machine's. Printed, never asserted; the targets are listed under the table.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml
from scale import node_cpu_seconds  # benchmarks/scale.py, beside this script (run as `python benchmarks/top.py`)

PRESETS = {"vllm": "llama-3.3-70b-vllm", "trtllm": "qwen3-235b-eagle3"}
TOKEN = {"HF_TOKEN": "hf_BenchTopToken0a1b2c3d4e5f6a7b8c9d"}


def process_cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def measure(lab, inventory: str, env: dict[str, str], interval: float, refreshes: int) -> tuple[dict, float]:
    """(per node: top's CPU share of one core on it, baseline subtracted; the controller's share)."""
    window = interval * (refreshes - 1)
    before = node_cpu_seconds(lab)
    time.sleep(window)
    baseline = {n: (v - before[n]) / window for n, v in node_cpu_seconds(lab).items()}
    top = subprocess.Popen(["sparkctl", "top", inventory, "--json", "--interval", str(interval)], env=env,
                           stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        assert top.stdout is not None
        top.stdout.readline()  # the first refresh: connected, everything read once
        nodes0, own0, started = node_cpu_seconds(lab), process_cpu_seconds(top.pid), time.monotonic()
        for _ in range(refreshes - 1):
            top.stdout.readline()
        elapsed = time.monotonic() - started
        nodes1, own1 = node_cpu_seconds(lab), process_cpu_seconds(top.pid)
    finally:
        top.terminate()
        top.wait(timeout=30)
    shares = {n: 100 * ((nodes1[n] - nodes0[n]) / elapsed - baseline.get(n, 0.0)) for n in nodes1}
    return shares, 100 * (own1 - own0) / elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--intervals", default="2,1")
    parser.add_argument("--refreshes", type=int, default=30)
    parser.add_argument("--engine", choices=sorted(PRESETS), default="vllm")
    args = parser.parse_args()
    if os.geteuid() != 0:
        sys.exit("run as root: the lab needs it")
    from sparkctl.lab.lab import Lab

    with tempfile.TemporaryDirectory(prefix="top-cost-") as directory:
        env = {**os.environ, **TOKEN, "XDG_STATE_HOME": str(Path(directory) / "state")}
        lab = Lab.up(Path(directory) / "lab", nodes=2, topology="pair")
        try:
            document = yaml.safe_load(lab.inventory_path.read_text())
            document["serve"] = {"preset": PRESETS[args.engine], "fit_check": "warn"}
            if args.engine == "vllm":
                document.pop("container", None)  # the engine's default image, which the lab image is named
            path = Path(directory) / "serve.yaml"
            path.write_text(yaml.safe_dump(document, sort_keys=False))
            done = subprocess.run(["sparkctl", "cluster", "bootstrap", str(path)], env=env, capture_output=True,
                                  text=True)
            if done.returncode != 0:
                sys.exit(done.stdout[-2000:] + done.stderr[-2000:])
            rows = []
            for interval in (float(i) for i in args.intervals.split(",")):
                shares, controller = measure(lab, str(path), env, interval, args.refreshes)
                rows.append((interval, shares, controller))
        finally:
            lab.down()
    print(f"sparkctl top's cost, {args.engine} pair serving idle, {args.refreshes} refreshes per interval; "
          f"load {Path('/proc/loadavg').read_text().split()[0]}")
    print(f"{'interval s':>10}  {'node CPU % of one core (top only)':<36}  {'controller CPU % of one core':>28}")
    for interval, shares, controller in rows:
        nodes = ", ".join(f"{n} {v:.2f}" for n, v in sorted(shares.items()))
        print(f"{interval:>10g}  {nodes:<36}  {controller:>28.2f}")
    print("targets (issue #26, at the default 2 s): each node below 1 % of one core, the controller below 5 %")


if __name__ == "__main__":
    main()
