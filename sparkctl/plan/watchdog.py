"""PURE: the watchdog of a serving world (templates/serve-watchdog.py), started by the head's world.sh beside the
server: what it reads (the /metrics every reader shares, by the engine's names), where it sends its canary (the
engine's own port), and serve.watchdog's thresholds. docs/serving.md, "A wedged world".
"""

from __future__ import annotations

from dataclasses import dataclass

from sparkctl.inventory import Inventory
from sparkctl.plan.gateway import ENGINE_HOST
from sparkctl.plan.serve import figures_port
from sparkctl.shipped import shipped_text

SCRIPT_NAME = "serve-watchdog.py"
#: where the watchdog writes what it saw when the world is stuck (run/serve: unit.sh records it with the end)
EVIDENCE_NAME = "stuck.json"


def watchdog_script() -> str:
    return shipped_text(SCRIPT_NAME)


@dataclass(frozen=True)
class WatchdogRun:
    metrics: str          # the /metrics URL every reader shares, on the head's loopback
    running: str          # the engine's gauge of requests running
    tokens: str           # its counter of generated tokens
    engine: str           # the engine's own base URL (the canary's)
    model: str
    stall_s: int
    canary_s: int
    canary_deadline_s: int

    def args(self) -> list[str]:
        """The watchdog's arguments but --pid and --evidence (world.sh's)."""
        return ["--metrics", self.metrics, "--running", self.running, "--tokens", self.tokens,
                "--engine", self.engine, "--model", self.model, "--stall-s", str(self.stall_s),
                "--canary-s", str(self.canary_s), "--canary-deadline-s", str(self.canary_deadline_s)]


def watchdog_run(inventory: Inventory, host: str = ENGINE_HOST) -> WatchdogRun | None:
    """The watchdog on the world's head, which asks its server at `host` (world.engine_host), or None with
    serve.watchdog: off."""
    settings = inventory.serve.watchdog
    if settings == "off":
        return None
    spec, engine = inventory.serve_spec(), inventory.engine()
    return WatchdogRun(metrics=f"http://{host}:{figures_port(inventory)}/metrics",
                       running=engine.metrics.running, tokens=engine.metrics.generation_tokens,
                       engine=f"http://{host}:{spec.engine_port}",
                       model=spec.served_name, stall_s=settings.stall_s, canary_s=settings.canary_s,
                       canary_deadline_s=settings.canary_deadline_s)
