"""One table: fresh and no-op `cluster bootstrap` and `doctor` on labs of 2, 4, 8 and 16 nodes (pair, ring, switch),
with the controller's peak memory and the machine's load at every measurement.

Run as root: `python benchmarks/scale.py [--shapes 2pair,4ring,4switch,8ring,8switch,16switch] [--repeat 3]
[--serve] [--verify-runs 5] [--drift]`. Every lab is brought up fresh (the lab image is built first if needed,
outside the timing) and torn down at the end. Each figure is the wall time of the real `sparkctl` command as a user
runs it (start-up with sparkctl's bytecode compiled as an install has it, connecting, every phase, the closing
line), median of --repeat runs for the no-op rerun and doctor; "mem MB" is the largest peak RSS of those sparkctl
processes, and on the 2- and 4-node rows each node's own share of a no-op (its CPU and the tasks started in it).
`--serve` adds a pair that also serves (the lab's TensorRT-LLM stand-in) to show the serve phases' share
of a no-op rerun. `--verify-runs N` then runs `cluster bootstrap --reprove` N times in a row on every lab (every
mesh pair and the MPI probe proven again, nothing taken from the record) and counts the clean ones: exit 0, nothing
changed, no warning from verify.fabric. `--drift` then seeds three drifts at once on every lab, with the mesh proofs
on record active (issue 27; on 16 nodes: node 9, 12 and 5; on fewer, the last, the second and the first node): an
emptied authorized_keys in one node's container, the cluster key of a peer taken out of another node's own
authorized_keys, and an sshd drop-in on a third that turns public-key login off for the fabric subnets; the next
bootstrap must repair the first two and report the third with its file and line. Each 2-node row also shows
sparkctl's start-up: `sparkctl --version`, importing what a bootstrap uses before it starts connecting and what it
imports while connecting, and opening the ssh connections to every node with the cluster lock (median of --repeat
runs each).

The lab runs every node on this one machine: the N x (N-1) ssh handshakes that prove the meshes all land on its
cores, so a 16-node figure here is an upper bound a real cluster (16 machines) does not see. Compare rows of the
same run, not runs on a busy machine: the `load` column is `uptime`'s 1-minute load before and after each figure.
Printed, never asserted (the issue's targets are listed under the table).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

DEFAULT_SHAPES = "2pair,4ring,4switch,8ring,8switch,16switch"
#: sparkctl's own entry point, the one installed beside this interpreter: a version manager's shim found first on
#: PATH (pyenv's is a bash script that forks about 40 processes) adds ~70 ms to every run that is not sparkctl's.
_BESIDE = Path(sys.executable).parent / "sparkctl"
SPARKCTL = str(_BESIDE) if _BESIDE.exists() else "sparkctl"


@dataclass
class Figure:
    seconds: list[float] = field(default_factory=list)
    peak_kb: int = 0
    busiest_node_cpu: list[float] = field(default_factory=list)  # per run: the most CPU one node's cgroup used
    controller_cpu: list[float] = field(default_factory=list)    # per run: the sparkctl process's own CPU
    #: per run: each node's CPU (its cgroup) and the tasks (processes and threads) started in it
    node_cpu: list[dict[str, float]] = field(default_factory=list)
    node_tasks: list[dict[str, int]] = field(default_factory=list)
    loads: list[float] = field(default_factory=list)
    exits: list[int] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def median(self) -> float:
        return statistics.median(self.seconds) if self.seconds else float("nan")

    def load_span(self) -> str:
        return f"{min(self.loads):.1f}-{max(self.loads):.1f}" if self.loads else "-"


def load1() -> float:
    return float(Path("/proc/loadavg").read_text().split()[0])


def node_cpu_seconds(lab) -> dict[str, float]:
    """CPU used so far by each node's cgroup (its systemd, sshd, networkd, its containers, what sparkctl runs there):
    cgroup v1's cpuacct.usage (ns) or v2's cpu.stat usage_usec, whichever the machine mounts."""
    from sparkctl.lab.node import CGROUP_ROOT

    used = {}
    for record in lab.state.nodes:
        for mount in lab.cgroup_mounts:
            base = CGROUP_ROOT / mount.mountpoint / lab.node_cgroup(record.name)
            with contextlib.suppress(OSError, ValueError, KeyError):  # a v2 mount without the cpu controller
                if (base / "cpuacct.usage").exists():
                    used[record.name] = int((base / "cpuacct.usage").read_text()) / 1e9
                    break
                if (base / "cpu.stat").exists():
                    stat = dict(line.split() for line in (base / "cpu.stat").read_text().splitlines())
                    used[record.name] = int(stat["usage_usec"]) / 1e6
                    break
    return used


def node_last_pids(lab) -> dict[str, int]:
    """The last PID each node's own PID namespace gave out (ns_last_pid, read from inside it): PIDs are given out in
    turn, so two reads a command apart tell how many tasks (processes and threads) it started on the node. The read
    itself is one task (its `cat`)."""
    last = {}
    for record in lab.state.nodes:
        read = lab.exec(record.name, "cat /proc/sys/kernel/ns_last_pid")
        with contextlib.suppress(ValueError):
            last[record.name] = int(read.stdout.strip())
    return last


def run(argv: list[str], figure: Figure, env: dict[str, str], lab=None) -> str:
    """Run one sparkctl command, adding its wall time, peak RSS and CPU (wait4's rusage of that child) and each
    node's CPU and tasks during it to figure."""
    figure.loads.append(load1())
    pids = node_last_pids(lab) if lab is not None else {}
    before = node_cpu_seconds(lab) if lab is not None else {}
    started = time.monotonic()
    with tempfile.TemporaryFile("w+") as errors:
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=errors, text=True, env=env)
        out = proc.stdout.read() if proc.stdout else ""
        _, status, usage = os.wait4(proc.pid, 0)
        errors.seek(0)
        stderr = errors.read()
    figure.seconds.append(time.monotonic() - started)
    figure.peak_kb = max(figure.peak_kb, usage.ru_maxrss)
    figure.controller_cpu.append(usage.ru_utime + usage.ru_stime)
    if lab is not None:
        after = node_cpu_seconds(lab)
        figure.node_cpu.append({n: after[n] - before.get(n, after[n]) for n in after})
        figure.busiest_node_cpu.append(max(figure.node_cpu[-1].values(), default=0.0))
        # the read after counts its own `cat`
        figure.node_tasks.append({n: last - pids[n] - 1 for n, last in node_last_pids(lab).items() if n in pids})
    figure.exits.append(os.waitstatus_to_exitcode(status))
    figure.loads.append(load1())
    if figure.exits[-1] != 0:
        last = stderr.strip().splitlines()[-1:] or [""]
        figure.notes.append(f"{' '.join(argv[1:3])} exit {figure.exits[-1]}: {why_failed(out)} {last[0][:200]}")
    return out


def json_lines(out: str) -> list[dict]:
    """The objects of a --json output, one per line (bootstrap's events, doctor's `finding` lines)."""
    lines = []
    for line in out.splitlines():
        with contextlib.suppress(ValueError):
            if line.startswith("{"):
                lines.append(json.loads(line))
    return lines


def error_findings(out: str) -> list[dict]:
    return [e for e in json_lines(out) if e.get("event") == "finding" and e.get("severity") == "error"]


def why_failed(out: str) -> str:
    """The failed tasks (task, node, message) of a --json run, or doctor's error findings with their evidence: a
    row that failed says why under the table instead of only counting."""
    said = [f"{e.get('task')} {e.get('node') or ''} {e.get('message') or ''}".strip() for e in json_lines(out)
            if e.get("status") in ("failed", "unreachable") or e.get("event") == "error"]
    said += [f"{f.get('node')} {f.get('id')}: {f.get('summary') or ''} ({f.get('evidence') or ''})"
             for f in error_findings(out)]
    return "; ".join(dict.fromkeys(s[:300] for s in said)) or "(no failed task or error finding in its output)"


def changed_count(out: str) -> int:
    return sum(1 for line in out.splitlines() if line.startswith("{") and json.loads(line).get("status") == "changed"
               and json.loads(line).get("event") == "task_result")


def clean_verify(out: str, exit_code: int) -> bool:
    """A --reprove run that passed: exit 0, nothing changed, verify.fabric ok and without a warning."""
    events = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    verify = [e for e in events if e.get("task") == "verify.fabric"]
    return (exit_code == 0 and changed_count(out) == 0
            and any(e.get("event") == "task_result" and e.get("status") == "ok" for e in verify)
            and not any(e.get("event") == "warning" for e in verify))


def doctor_errors(out: str) -> int:
    """Doctor's error findings; -1 when its output held no JSON line at all (it did not run)."""
    return len(error_findings(out)) if json_lines(out) else -1


#: what `cluster bootstrap` imports before it starts connecting, then what it imports while the nodes answer
_IMPORT = ("import time; t = time.perf_counter(); import sparkctl.cli.main, sparkctl.cli.cluster_cmd\n"
           "u = time.perf_counter(); import sparkctl.runs.bootstrap, sparkctl.cli.views\n"
           "print(u - t, time.perf_counter() - u)")
#: connecting to every node and taking the cluster lock, as `cluster bootstrap`'s Opening does (in a thread)
_CONNECT = ("import sys, time\nfrom sparkctl.inventory import load_inventory\n"
            "from sparkctl.runs.lock import Holder\nfrom sparkctl.runs.opening import Opening\n"
            "inv = load_inventory(sys.argv[1]); t = time.perf_counter()\n"
            "with Opening(inv, forks=32, become_password=None, holder=Holder.now('scale')) as o:\n"
            "    opened = o.hand_over()\nprint(time.perf_counter() - t)\nopened.lock.release()\n"
            "for c in opened.transports.values(): c.close()\n")


def startup(inventory: str, env: dict[str, str], repeat: int) -> dict[str, float]:
    """Median seconds of `sparkctl --version`, of importing what a bootstrap uses before it connects and while it
    connects, and of connecting to every node and taking the cluster lock."""
    def timed(argv: list[str]) -> float:
        started = time.monotonic()
        subprocess.run(argv, capture_output=True, env=env, check=True)
        return time.monotonic() - started

    def printed(argv: list[str]) -> float:
        return float(subprocess.run(argv, capture_output=True, text=True, env=env, check=True).stdout.strip())

    def printed_pair(argv: list[str]) -> tuple[float, float]:
        first, second = subprocess.run(argv, capture_output=True, text=True, env=env, check=True).stdout.split()
        return float(first), float(second)

    imports = [printed_pair([sys.executable, "-c", _IMPORT]) for _ in range(repeat)]
    return {"version": statistics.median(timed([SPARKCTL, "--version"]) for _ in range(repeat)),
            "import": statistics.median(before for before, _ in imports),
            "import_overlapped": statistics.median(during for _, during in imports),
            "connect": statistics.median(printed([sys.executable, "-c", _CONNECT, inventory]) for _ in range(repeat))}


DROPIN = "/etc/ssh/sshd_config.d/60-fabric-no-keys.conf"


def drift(lab, bootstrap: list[str], env: dict[str, str]) -> str:
    """Seed the three mesh drifts of issue 27 at once; what the next bootstraps did with them (one line)."""
    import yaml

    names = [n.name for n in lab.state.nodes]
    size = len(names)
    container_node, keys_node, sshd_node = ((names[8], names[11], names[4]) if size >= 12
                                            else (names[-1], names[1 % size], names[0]))
    inventory = yaml.safe_load(Path(lab.inventory_path).read_text())
    user, container = inventory["user"], inventory.get("container", {}).get("name", "trtllm-multinode")
    peer = next(n for n in names if n != keys_node)
    subnets = sorted({line.split()[0] for name in names for line in lab.exec(
        name, ["sh", "-c", "ip -4 -o route show proto kernel | grep -v enP7s7 | awk '{print $1}'"]).stdout.split()
        if line.startswith("192.168.")})
    keys = f"/home/{user}/.ssh/authorized_keys"
    seeded = [
        (container_node, f"docker exec {container} sh -c ': > /root/.ssh/authorized_keys'"),
        (keys_node, f"grep -v '@{peer}$' {keys} > {keys}.x; cat {keys}.x > {keys}; rm -f {keys}.x"),
        (sshd_node, f"printf 'Match Address {','.join(subnets)}\\n    PubkeyAuthentication no\\n' > {DROPIN} && "
                    "systemctl reload ssh"),
    ]
    for node, command in seeded:
        result = lab.exec(node, ["sh", "-c", command])
        if result.returncode != 0:
            return f"seeding on {node} failed: {result.stderr.strip()[:200]}"
    figure = Figure()
    events = json_lines(run(bootstrap, figure, env))
    repaired = sorted({(e["task"], e.get("node") or "") for e in events
                       if e.get("event") == "task_result" and e.get("status") == "changed"})
    refused = [d for e in events if e.get("task") == "ssh.verify" and e.get("status") == "failed"
               for d in e.get("details", []) if DROPIN in d]
    lab.exec(sshd_node, ["sh", "-c", f"rm -f {DROPIN} && systemctl reload ssh"])
    after = Figure()
    out = run(bootstrap, after, env)
    return (f"drift ({container_node}: container authorized_keys emptied; {keys_node}: {peer}'s key out of "
            f"authorized_keys; {sshd_node}: {DROPIN}): exit {figure.exits[-1]} in {figure.median:.1f} s, changed "
            f"{', '.join(t for t, _ in repaired) or 'nothing'}; reported: {refused[0] if refused else 'NOT REPORTED'}; "
            f"with the drop-in removed: exit {after.exits[-1]}, {changed_count(out)} changed")


def measure(shape: str, repeat: int, serve: bool = False, verify_runs: int = 0, seed_drift: bool = False) -> dict:
    from sparkctl.lab.inventory_writer import add_serve_section
    from sparkctl.lab.lab import Lab

    size = int(shape.rstrip("abcdefghijklmnopqrstuvwxyz"))
    topology = shape[len(str(size)):]
    with tempfile.TemporaryDirectory(prefix="bench-scale-") as directory:
        env = {**os.environ, "XDG_STATE_HOME": str(Path(directory) / "state"), "HF_TOKEN": "lab"}
        up = Figure()
        up.loads.append(load1())
        started = time.monotonic()
        lab = Lab.up(Path(directory) / "lab", nodes=size, topology=topology)
        up.seconds.append(time.monotonic() - started)
        try:
            if serve:
                add_serve_section(Path(lab.inventory_path), "qwen3-235b-eagle3")
            inventory = str(lab.inventory_path)
            bootstrap = [SPARKCTL, "cluster", "bootstrap", inventory, "--json"]
            fresh, noop, doctor = Figure(), Figure(), Figure()
            out = run(bootstrap, fresh, env)
            fresh.notes.append(f"{changed_count(out)} changed")
            noop_changed = 0
            for _ in range(repeat):
                noop_changed += changed_count(run(bootstrap, noop, env, lab))
            errors = [doctor_errors(run([SPARKCTL, "doctor", inventory, "--json"], doctor, env, lab))
                      for _ in range(repeat)]
            verify, clean = Figure(), 0
            for _ in range(verify_runs):
                out = run([*bootstrap, "--reprove"], verify, env)
                clean += clean_verify(out, verify.exits[-1])
            started_up = startup(inventory, env, repeat) if size == 2 else None
            drifted = drift(lab, bootstrap, env) if seed_drift else ""
        finally:
            lab.down()
    return {"shape": f"{size} {topology}{' +serve' if serve else ''}", "nodes": size, "topology": topology,
            "serve": serve, "up": up, "fresh": fresh, "noop": noop, "noop_changed": noop_changed,
            "doctor": doctor, "doctor_errors": max(errors),
            "verify": verify, "verify_clean": clean, "startup": started_up, "drift": drifted}


def print_table(rows: list[dict]) -> None:
    print(f"{'shape':<16} {'lab up s':>8} {'fresh s':>8} {'exit':>4} {'no-op s':>8} {'(min)':>6} {'chg':>3} "
          f"{'exit':>4} {'doctor s':>8} {'(min)':>6} {'errors':>6} {'mem MB':>6}  load during (1 min)")
    for r in rows:
        fresh, noop, doc = r["fresh"], r["noop"], r["doctor"]
        peak = max(fresh.peak_kb, noop.peak_kb, doc.peak_kb) / 1024
        loads = fresh.loads + noop.loads + doc.loads
        print(f"{r['shape']:<16} {r['up'].median:>8.1f} {fresh.median:>8.2f} {max(fresh.exits):>4} "
              f"{noop.median:>8.2f} {min(noop.seconds):>6.2f} {r['noop_changed']:>3} {max(noop.exits):>4} "
              f"{doc.median:>8.2f} {min(doc.seconds):>6.2f} {r['doctor_errors']:>6} {peak:>6.0f}  "
              f"{min(loads):.1f}-{max(loads):.1f}")
    for r in rows:
        for note in dict.fromkeys(n for f in (r["fresh"], r["noop"], r["doctor"], r["verify"]) for n in f.notes):
            print(f"  {r['shape']}: {note}")
        if r.get("startup"):
            up = r["startup"]
            print(f"  {r['shape']}: start-up, median s: sparkctl --version {up['version']:.2f}; importing what "
                  f"bootstrap uses {up['import']:.2f} before it connects, {up['import_overlapped']:.2f} while it "
                  f"connects to both nodes and takes the lock ({up['connect']:.2f})")
        if r.get("drift"):
            print(f"  {r['shape']}: {r['drift']}")
        if r["verify"].seconds:
            print(f"  {r['shape']}: cluster bootstrap --reprove {len(r['verify'].seconds)}x in a row: "
                  f"{r['verify_clean']} clean; median {r['verify'].median:.2f} s; exits {r['verify'].exits}; "
                  f"load {r['verify'].load_span()}")
    print("  CPU of a no-op rerun, median s: the controller's own / the busiest node's (its cgroup: sshd, the "
          "mesh tries it makes and answers, its container); on real Sparks each node has its own cores")
    for r in rows:
        noop, doc = r["noop"], r["doctor"]
        if noop.busiest_node_cpu:
            print(f"  {r['shape']}: no-op {statistics.median(noop.controller_cpu):.2f} / "
                  f"{statistics.median(noop.busiest_node_cpu):.2f}; doctor {statistics.median(doc.controller_cpu):.2f}"
                  f" / {statistics.median(doc.busiest_node_cpu):.2f}")
    print("  each node's share of a no-op rerun, median: CPU s and tasks started (processes and threads; the head "
          "first, it also runs the smoke test)")
    for r in rows:
        noop = r["noop"]
        if noop.node_cpu and r["nodes"] <= 4:
            shares = [f"{node} {statistics.median(run[node] for run in noop.node_cpu):.2f} s, "
                      f"{statistics.median(run[node] for run in noop.node_tasks):.0f} tasks"
                      for node in noop.node_cpu[0]
                      if all(node in run for run in noop.node_tasks) and all(node in run for run in noop.node_cpu)]
            print(f"  {r['shape']}: controller {statistics.median(noop.controller_cpu):.2f} s; " + "; ".join(shares))
    two = next((r for r in rows if r["nodes"] == 2 and not r["serve"]), None)
    two_serve = next((r for r in rows if r["nodes"] == 2 and r["serve"]), None)
    sixteen = next((r for r in rows if r["nodes"] == 16 and r["topology"] == "switch"), None)
    print("targets (issues 15, 27, 37): 2-node no-op <= 1.0 s; 16-node switch no-op <= 2x the 2-node one; the "
          "controller's CPU for doctor on 16 <= 2x on 2; 0 changed on a rerun; 0 doctor errors; memory < 150 MB; "
          "a serving pair's no-op: the worker <= 80 tasks and 0.35 s of CPU, the head <= 120 and 0.6 s")
    if two:
        print(f"  2-node no-op {two['noop'].median:.2f} s" + (f", with serve {two_serve['noop'].median:.2f} s"
                                                               if two_serve else ""))
    if two and sixteen:
        cpu = statistics.median(sixteen["doctor"].controller_cpu) / statistics.median(two["doctor"].controller_cpu)
        print(f"  16/2 no-op: {sixteen['noop'].median / two['noop'].median:.1f}x; "
              f"16/2 doctor: {sixteen['doctor'].median / two['doctor'].median:.1f}x; "
              f"16/2 doctor controller CPU: {cpu:.1f}x")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shapes", default=DEFAULT_SHAPES, help=f"default {DEFAULT_SHAPES}")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--serve", action="store_true", help="also a pair that serves")
    parser.add_argument("--verify-runs", type=int, default=0, help="--reprove runs in a row on every lab")
    parser.add_argument("--drift", action="store_true", help="seed the three mesh drifts on every lab (issue 27)")
    args = parser.parse_args()
    import compileall

    import sparkctl
    from sparkctl.lab.image import ensure_image

    ensure_image()
    # An installed sparkctl has its bytecode compiled (pip does it at install time); an editable checkout under
    # PYTHONDONTWRITEBYTECODE would compile every module on every run and time that instead.
    compileall.compile_dir(str(Path(sparkctl.__file__).parent), quiet=1)
    rows = []
    for shape in args.shapes.split(","):
        serves = (False, True) if args.serve and shape.strip().startswith("2") else (False,)
        for serve in serves:
            rows.append(measure(shape.strip(), args.repeat, serve=serve, verify_runs=args.verify_runs,
                                seed_drift=args.drift))
            print_table(rows[-1:])  # as it goes: a long run shows its rows early
    print()
    print_table(rows)


if __name__ == "__main__":
    main()
