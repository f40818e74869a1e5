"""Time and peak memory to refuse each class of hostile inventory (the cases of tests/unit/test_hostile_inventories.py).

    python3 benchmarks/hostile_inputs.py

Prints one row per case: seconds for `load_inventory` to refuse it, and the peak memory Python allocated doing so.
"""

from __future__ import annotations

import tempfile
import time
import tracemalloc
from pathlib import Path

from sparkctl.errors import InventoryError
from sparkctl.inventory import load_inventory
from tests.unit.test_hostile_inventories import CASES


def measure(path: Path) -> tuple[float, int, bool]:
    tracemalloc.start()
    started = time.perf_counter()
    try:
        load_inventory(path)
        refused = False
    except InventoryError:
        refused = True
    seconds = time.perf_counter() - started
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
        big = Path(directory) / "big.yaml"
        big.write_text("# padding\n" * 5_000_000)
        rows.append(("50 MB file", *measure(big)))
    width = max(len(r[0]) for r in rows)
    print(f"{'case':<{width}}  {'seconds':>8}  {'peak MiB':>8}  refused")
    for name, seconds, peak, refused in rows:
        print(f"{name:<{width}}  {seconds:8.3f}  {peak / 2**20:8.1f}  {'yes' if refused else 'NO'}")


if __name__ == "__main__":
    main()
