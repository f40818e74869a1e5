"""model.copy's streams against one rsync stream, on a lab pair: bytes/s and what each twin carried.

Run as root: `python benchmarks/copy_streams.py [--files 8] [--mib 256]`. A lab pair is brought up, bootstrapped
(the fabric, the keys and the ssh mesh model.copy uses), then, as the login user on the head, the same folder of
random files is sent to the peer five ways, the peer's copy removed before each:
1. one rsync stream over ssh on one twin, as every peer tool does (tar where an end has no rsync);
2. model.copy: rsync's daemon on the peer for the copy, STREAMS_PER_TWIN streams on every twin the two share;
3. rsync's daemon, one stream on one twin (what leaving ssh's cipher alone gives);
4. model.copy's streams on one twin only;
5. the same streams as tar over ssh on every twin (model.copy where an end has no rsync).
Each row shows the seconds, the MB/s, the ratio to the single stream, and the bytes each of the peer's twins
received. Both ends run on this machine's cores (ssh's cipher and rsync on each side): the lab shows what each
way costs in CPU and whether the streams spread over cores and twins, while a Spark's 20 cores and a CX-7 link set
the real ceiling. Results are
printed as a table, never asserted.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import tempfile
import time
from pathlib import Path

from sparkctl.inventory import load_inventory
from sparkctl.plan import plan_cluster
from sparkctl.plan.ssh import peer_routes
from sparkctl.tasks.model.streams import STREAMS_PER_TWIN, copy_script, share_out, streams_script

SRC = "/home/nvidia/copy-bench/src"
DEST = "/home/nvidia/copy-bench/dst"
LISTS = "/home/nvidia/copy-bench/lists"


def as_user(lab, node: str, script: str, timeout: float = 1800) -> subprocess.CompletedProcess:
    return lab.exec(node, ["runuser", "-u", "nvidia", "--", "bash", "-c", script], timeout=timeout)


def rx_bytes(lab, node: str, interfaces: list[str]) -> dict[str, int]:
    out = lab.exec(node, ["sh", "-c", " ".join(f"cat /sys/class/net/{i}/statistics/rx_bytes;" for i in interfaces)])
    return dict(zip(interfaces, (int(v) for v in out.stdout.split()), strict=True))


def run(lab, name: str, script: str, interfaces: list[str], size: int) -> tuple[str, float, dict[str, int]]:
    as_user(lab, "spark2", f"rm -rf {DEST}")
    before = rx_bytes(lab, "spark2", interfaces)
    started = time.monotonic()
    done = as_user(lab, "spark1", script)
    seconds = time.monotonic() - started
    if done.returncode != 0:
        raise SystemExit(f"{name}: exit {done.returncode}: {done.stdout[-500:]} {done.stderr[-500:]}")
    check = as_user(lab, "spark2", f"du -sb {DEST} | cut -f1").stdout.strip()
    if not check.isdigit() or int(check) < size:
        raise SystemExit(f"{name}: the peer holds {check} bytes, not {size}")
    after = rx_bytes(lab, "spark2", interfaces)
    via = next((v for mark, v in (("via rsync daemon", "rsyncd"), ("via rsync", "rsync")) if mark in done.stdout),
               "tar")
    return name.replace("{via}", via), seconds, {i: after[i] - before[i] for i in interfaces}


def measure(lab, inventory: str, files: int, mib: int) -> None:
    inv = load_inventory(inventory)
    plan = plan_cluster(inv)
    routes = peer_routes(inv, plan.fabric, "spark1", "spark2")
    interfaces = [i for i in plan.fabric.addresses["spark2"]]
    names = [f"f{i}" for i in range(files)]
    as_user(lab, "spark1", f"mkdir -p {SRC} {LISTS} && cd {SRC} && for f in {' '.join(names)}; do "
                           f"head -c {mib << 20} /dev/urandom > $f; done")
    size = files * (mib << 20)
    sizes = {name: mib << 20 for name in names}
    rows = []
    target, extra = routes[0]
    listing = "".join(n + "\\0" for n in names)
    rows.append(run(lab, "one {via} stream over ssh, one twin",
                    f"printf '{listing}' | ( {'; '.join(copy_script(SRC, DEST, target, extra).splitlines())} )",
                    interfaces, size))
    allow = [str(a.ip) for a in plan.fabric.addresses["spark1"].values()]
    for label, used, per_twin, daemon in (("model.copy, every twin", routes, STREAMS_PER_TWIN, True),
                                          ("rsync's daemon, one stream, one twin", routes[:1], 1, True),
                                          ("model.copy's streams, one twin", routes[:1], STREAMS_PER_TWIN, True),
                                          ("tar over ssh, every twin", routes, STREAMS_PER_TWIN, False)):
        streams = share_out(names, sizes, per_twin * len(used))
        lists = "; ".join(f"printf '{''.join(p + chr(92) + '0' for p in paths)}' > {LISTS}/list.{i}"
                          for i, paths in enumerate(streams))
        script = streams_script(SRC, DEST, used, streams, LISTS, allow=allow if daemon else None)
        rows.append(run(lab, f"{label} ({len(streams)} {{via}} streams)", f"{lists}\n{script}", interfaces, size))
    single = rows[0][1]
    print(f"{files} files x {mib} MiB = {size / 1e6:.0f} MB, head spark1 -> peer spark2; twins: "
          f"{', '.join(f'{i} {a}' for i, a in zip(interfaces, (r[0] for r in routes), strict=False))}")
    print(f"{'how':<58} {'s':>6} {'MB/s':>7} {'x one':>6}  " + "  ".join(f"{i + ' MB':>22}" for i in interfaces))
    for name, seconds, per_twin in rows:
        print(f"{name:<58} {seconds:>6.1f} {size / seconds / 1e6:>7.1f} {single / seconds:>6.2f}  "
              + "  ".join(f"{per_twin[i] / 1e6:>22.1f}" for i in interfaces))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=8)
    parser.add_argument("--mib", type=int, default=256)
    args = parser.parse_args()
    from sparkctl.lab.lab import Lab

    with tempfile.TemporaryDirectory(prefix="copy-streams-") as directory:
        lab = Lab.up(Path(directory) / "lab", nodes=2, topology="pair")
        try:
            done = subprocess.run(["sparkctl", "cluster", "bootstrap", str(lab.inventory_path), "--json"],
                                  capture_output=True, text=True, env=dict(os.environ), timeout=1800)
            if done.returncode != 0:
                raise SystemExit(f"bootstrap failed: {done.stdout[-2000:]}")
            measure(lab, str(lab.inventory_path), args.files, args.mib)
        finally:
            lab.down()


if __name__ == "__main__":
    main()
