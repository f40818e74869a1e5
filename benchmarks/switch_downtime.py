"""The downtime of a deployment switch on a lab pair: the last answer from the old world to the first from the new.

Run as root: `python benchmarks/switch_downtime.py [--every 0.2]`. A lab pair is brought up (and torn down) serving
the README's TensorRT-LLM preset on the lab image; a client on this machine sends a small chat completion through
the gateway every `--every` seconds while sparkctl
1. switches to another image that works (the lab's `next`: the same engine under another image ID),
2. goes back by hand (`sparkctl serve rollback`),
3. is moved to an image whose engine fails at load (the lab's `broken`), which bootstrap rolls back.
For each: the command's time, the downtime (the longest run of unanswered requests, from the last answer before it
to the first after it) and the requests that failed. The lab's engine is a stand-in that loads in a second: on
Sparks the load of the model adds to the downtime. Results are printed as a table, never asserted.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from sparkctl.inventory import load_inventory
from sparkctl.knowledge.serve_client import EndpointError, ServeClient, endpoint_url
from sparkctl.tasks.serve.api_key import api_key

ENV = {"HF_TOKEN": "hf_BenchFakeToken0123456789abcdef"}
SERVE = {"preset": "qwen3-235b-eagle3", "fit_check": "warn"}


@dataclass
class Poller:
    client: ServeClient
    every: float
    answers: list[tuple[float, bool]] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)

    def run(self) -> None:
        while not self.stop.is_set():
            at = time.monotonic()
            try:
                self.client.chat("ping", max_tokens=2)
                ok = True
            except EndpointError:
                ok = False
            self.answers.append((at, ok))
            self.stop.wait(max(0.0, self.every - (time.monotonic() - at)))

    def window(self, start: float, end: float) -> tuple[float, int]:
        """(longest downtime, failed requests) among the answers sent between start and end."""
        seen = [(t, ok) for t, ok in self.answers if start <= t <= end]
        failed = sum(1 for _, ok in seen if not ok)
        longest, last_ok, down = 0.0, None, False
        for t, ok in seen:
            if ok:
                if down and last_ok is not None:
                    longest = max(longest, t - last_ok)
                last_ok, down = t, False
            else:
                down = True
        return longest, failed


def sparkctl(*args: str) -> tuple[float, int]:
    started = time.monotonic()
    done = subprocess.run(["sparkctl", *args, "--json"], capture_output=True, env={**os.environ, **ENV},
                          timeout=1800)
    return time.monotonic() - started, done.returncode


def inventory(lab, directory: Path, name: str, image: str) -> str:
    document = yaml.safe_load(lab.inventory_path.read_text())
    document["serve"] = SERVE
    document.setdefault("container", {})["image"] = image
    path = directory / f"{name}.yaml"
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    return str(path)


def measure(lab, directory: Path, every: float) -> None:
    from sparkctl.lab.image import ensure_variant, image_ref

    base = inventory(lab, directory, "base", image_ref())
    good = inventory(lab, directory, "next", ensure_variant("next"))
    broken = inventory(lab, directory, "broken", ensure_variant("broken"))
    seconds, code = sparkctl("cluster", "bootstrap", base)
    print(f"bootstrap to a serving endpoint: {seconds:.1f}s (exit {code})")
    inv = load_inventory(base)
    client = ServeClient(endpoint_url(str(inv.head.host), inv.serve_spec().port), timeout=30, api_key=api_key(inv))
    poller = Poller(client, every)
    thread = threading.Thread(target=poller.run, daemon=True)
    thread.start()
    time.sleep(2 * every)
    rows = []
    for what, args in (("switch to a good image", ("cluster", "bootstrap", good)),
                       ("serve rollback (by hand)", ("serve", "rollback", good)),
                       ("image failing at load, rolled back", ("cluster", "bootstrap", broken))):
        start = time.monotonic()
        seconds, code = sparkctl(*args)
        time.sleep(2 * every)
        rows.append((what, seconds, code, *poller.window(start, time.monotonic())))
    poller.stop.set()
    thread.join()
    print(f"{'what':<36} {'run s':>7} {'exit':>5} {'downtime s':>11} {'failed reqs':>12}")
    for what, seconds, code, down, failed in rows:
        print(f"{what:<36} {seconds:>7.1f} {code:>5} {down:>11.1f} {failed:>12}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--every", type=float, default=0.2, help="seconds between two requests of the client")
    args = parser.parse_args()
    from sparkctl.lab.lab import Lab

    with tempfile.TemporaryDirectory(prefix="switch-downtime-") as directory:
        lab = Lab.up(Path(directory) / "lab", nodes=2, topology="pair")
        try:
            measure(lab, Path(directory), args.every)
        finally:
            lab.down()


if __name__ == "__main__":
    main()
