"""Helpers for the doctor lab tests: doctor and bootstrap in-process with their JSON, and seeding a container that
differs from the plan in one chosen way (its spec replayed with one change, everything else as sparkctl made it)."""

from __future__ import annotations

import json
import shlex
from collections.abc import Callable
from dataclasses import dataclass, field

from click.testing import CliRunner

from sparkctl.cli.main import cli
from sparkctl.inventory import load_inventory
from sparkctl.plan import plan_cluster
from sparkctl.plan.container import ContainerSpec
from sparkctl.runs.session import Session
from sparkctl.transport.base import q
from tests.lab.lab_kit import CONTAINER, changed  # noqa: F401 (the doctor modules' changed)
from tests.taskkit import doctor_report


def doctor(lab, *args: str, env: dict[str, str] | None = None, inventory: str | None = None) -> dict:
    result = CliRunner().invoke(cli, ["doctor", inventory or str(lab.inventory_path), "--json", *args], env=env,
                                catch_exceptions=False)
    report = doctor_report(result.stdout)
    assert result.exit_code == (0 if report["healthy"] else 1), result.output
    return report


def errors(report: dict) -> set[tuple[str, str]]:
    return {(f["id"], f["node"]) for f in report["findings"] if f["severity"] == "error"}


def problems(report: dict) -> set[tuple[str, str]]:
    """Errors and warnings (what --fix acts on), not notes."""
    return {(f["id"], f["node"]) for f in report["findings"] if f["severity"] in ("error", "warning")}


def bootstrap(lab, *args: str, env: dict[str, str] | None = None, inventory: str | None = None) -> tuple[int, list]:
    result = CliRunner().invoke(cli, ["cluster", "bootstrap", inventory or str(lab.inventory_path), "--json", *args],
                                env=env, catch_exceptions=False)
    events = [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]
    return result.exit_code, events


def failed(events: list[dict]) -> list[str]:
    return [f"{e['task']} {e.get('node')}: {e.get('message')}" for e in events
            if e["event"] == "task_result" and e["status"] == "failed"]


def planned_spec(lab, node: str, inventory: str | None = None) -> ContainerSpec:
    inv = load_inventory(inventory or lab.inventory_path)
    with Session(inv) as session:
        facts = session.gather()
    return plan_cluster(inv, facts).nodes[node].container


def replace_container(lab, node: str, change: Callable[[ContainerSpec], ContainerSpec],
                      inventory: str | None = None, serves: bool = True, container: str = CONTAINER) -> None:
    """Recreate the node's container from its planned spec with one change (as a hand-started or older container
    would be), keeping the hostfile sparkctl put in it so that only the change differs. `serves`: it comes up
    (its sshd listens); else it is only started."""
    spec = change(planned_spec(lab, node, inventory))
    hostfile = lab.exec(node, f"docker exec {container} cat /etc/openmpi-hostfile").stdout if serves else ""
    script = f"docker rm -f {container} >/dev/null && {shlex.join(spec.run_argv())} >/dev/null"
    if serves:
        script += (f" && printf %s {q(hostfile)} > /tmp/seeded-hostfile && "
                   f"docker cp /tmp/seeded-hostfile {container}:/etc/openmpi-hostfile && "
                   f"for i in $(seq 1 300); do ss -ltnH 'sport = :2233' | grep -q . && exit 0; sleep 0.2; done; exit 1")
    result = lab.exec(node, script)
    assert result.returncode == 0, result.stderr


@dataclass(frozen=True)
class Seed:
    name: str
    finding: str
    node: str
    #: a root shell line on the node, or a function of the lab
    inject: str | Callable
    #: (id, node) the fault also causes, reported as their own findings (e.g. a duplicate address on both owners)
    also: frozenset[tuple[str, str]] = field(default_factory=frozenset)

    def seed(self, lab) -> None:
        if callable(self.inject):
            self.inject(lab, self.node)
            return
        result = lab.exec(self.node, self.inject)
        assert result.returncode == 0, (self.name, result.stderr)
