"""Time and peak memory to refuse each class of hostile inventory (the cases of tests/unit/test_hostile_inventories.py).

    python3 benchmarks/hostile_inputs.py

Also files just under the size cap (UNDER_THE_CAP). Prints one row per case: seconds for `load_inventory` to refuse
it, and the peak memory Python allocated doing so.
"""

from __future__ import annotations

import tempfile
import time
import tracemalloc
from pathlib import Path

from sparkctl.errors import InventoryError
from sparkctl.inventory import load_inventory
from tests.unit.test_hostile_inventories import CASES

HEAD = "user: nvidia\nnodes: [{name: a, host: h}]\n"
#: Files just under the 1 MiB cap: parsed in full before anything is refused (the worst the cap allows).
UNDER_THE_CAP = {
    "1 MiB of comments": HEAD + ("#" + "x" * 78 + "\n") * 13_000,
    "1 MiB of values": HEAD + "serve:\n  config:\n" + "".join(f"    k{i}: '{'v' * 180}'\n" for i in range(5000)),
    "4 900 unknown config keys, 0.9 MiB": HEAD + "serve:\n  config:\n" + "".join(f"    k{i}: '{'v' * 180}'\n"
                                                                          for i in range(4900)),
    "1 MiB scalar": HEAD + "serve: {config: {x: '" + "y" * 1_000_000 + "'}}\n",
    "49 000 values": HEAD + "serve:\n  config:\n    x: [" + ",".join(["1"] * 49_000) + "]\n",
}


def _load(path: Path) -> bool:
    try:
        load_inventory(path)
    except InventoryError:
        return True
    return False


def measure(path: Path) -> tuple[float, int, bool]:
    """(seconds without tracing, since tracemalloc slows the pure-Python parts severalfold; peak bytes traced;
    refused)."""
    started = time.perf_counter()
    refused = _load(path)
    seconds = time.perf_counter() - started
    tracemalloc.start()
    _load(path)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return seconds, peak, refused


def main() -> None:
    with tempfile.TemporaryDirectory(prefix="hostile-") as directory:
        rows = []
        for name, text in sorted(CASES.items()):
            path = Path(directory) / "inventory.yaml"
            path.write_text(text)
            rows.append((name, *measure(path)))
        for name, text in sorted(UNDER_THE_CAP.items()):
            path = Path(directory) / "inventory.yaml"
            path.write_text(text)
            rows.append((name, *measure(path)))
        big = Path(directory) / "big.yaml"
        big.write_text("# padding\n" * 5_000_000)
        rows.append(("50 MB file", *measure(big)))
    width = max(len(r[0]) for r in rows)
    print(f"{'case':<{width}}  {'seconds':>8}  {'peak MiB':>8}  refused")
    for name, seconds, peak, refused in rows:
        print(f"{name:<{width}}  {seconds:8.3f}  {peak / 2**20:8.1f}  {'yes' if refused else 'NO'}")


if __name__ == "__main__":
    main()
