"""What a run's tasks load at their first use, loaded in the background from the run's start, while the controller
waits for the nodes (the cluster lock, then their facts): about 50 ms of every run's start taken off the way to its
first task, as the connections are opened while the rest of sparkctl loads (runs/opening.py).

Only modules that import nothing of sparkctl that is not loaded already: one never waits on a module another
thread is importing, so the two imports cannot wait on each other. Where the background import fails, the task's
own import fails again, and says why.
"""

from __future__ import annotations

import contextlib
import importlib
import threading

#: Jinja, with the shipped templates' environment (every task that renders a file), and the Prometheus client's
#: parser (the smoke test's /metrics readings)
LATER = ("sparkctl.plan.compiled_templates", "prometheus_client.parser")


def preload(modules: tuple[str, ...] = LATER) -> threading.Thread:
    thread = threading.Thread(target=_load, args=(modules,), name="sparkctl-preload", daemon=True)
    thread.start()
    return thread


def _load(modules: tuple[str, ...]) -> None:
    for name in modules:
        with contextlib.suppress(Exception):
            importlib.import_module(name)
